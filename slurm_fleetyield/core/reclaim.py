"""Premium reclaim: requeue checkpointable batch off the premium GPUs a pending premium job needs.

Input: the Slurm view (nodes, jobs: ``JobView`` state, nodes, workload, gpus, Requeue flag), priced nodes,
envelopes, the previous ``ReclaimMemory``, ``ReclaimParams``, the premium-needing classes (``SettleParams``)
and ``now``. Output: ``Reclaim``: the ``RequeueJobs`` actions, the walled nodes (no fy_ok_batch, no decode
loan) with why, the next memory and log events.

Why: green premium nodes carry fy_ok_batch (checkpointable work may use idle H100s; a wall costs goodput,
docs/results.md "premium.batch"), and Slurm's node weights only order *new* placements. Batch that starts on
an idle H100 before premium work arrives then holds it for its whole run: 80% of FleetYield's premium misuse
in the live A/B at 7519a79 (docs/results.md). Slurm's own answer is preemption (``PreemptType`` with
``PreemptMode=REQUEUE``), which needs QOS or partition priorities the site may not have; this stage is that
preemption for one narrow case, decided from what FleetYield already knows (health, envelope, premium).

Rule, per tick:
1. pending premium-needing jobs, by job id (submission order: Slurm's default age priority), each placed
   all-or-nothing as per-node pieces (a gang as whole nodes; premium.node_pieces); a job that fits idle GPUs
   of the eligible premium nodes (green, full HBM, not a lemon, in service: premium.decode_eligible; best
   fit, premium.place) is merely waiting for Slurm's next pass: it takes those GPUs and reclaims nothing.
   Idle non-premium GPUs are not counted: the job's constraints (not in the Slurm view) may rule them out,
   and a job that could use them is started there by Slurm (premium weights sort last) within ``after_s``;
2. the first job that does not fit holds the line: in Slurm's priority order it is the one whose start
   freed GPUs would serve (backfill protects its reservation), so reclaim acts for it or for nobody this
   tick. Nobody, when it is deeper in the queue than ``queue_depth`` pending jobs (Slurm tests only the head
   of its queue per pass: GPUs freed for a job further back go to someone else), when reclaim acted for it
   already within ``job_cooldown_s`` (it was not started on what was freed: something else holds it back,
   and more requeues for it would be waste), or when no requeue lets it start;
3. requeueable jobs: RUNNING on one eligible premium node, a class of ``reclaim.classes``, Slurm's Requeue
   flag set, not requeued by reclaim within ``job_cooldown_s``. Each piece goes to the node that needs the
   fewest GPUs requeued (then the fewest jobs, the youngest jobs, the node name); on a node, the smallest
   set of jobs that frees enough (fewest GPUs, then fewest jobs, then the youngest: least progress since
   submission);
4. it acts only once it has been blocked so for ``after_s`` (memory, kept while it stays first in line and
   blocked): a queue that resolves itself costs nothing; and only if that takes at most
   ``max_jobs_per_tick`` requeues (the storm cap);
5. acting: one ``RequeueJobs`` per node (plan order puts it after the feature updates), and the node is
   *walled*: fy_ok_batch and any decode loan are withheld while the premium job is pending, and after it
   started, while other premium-needing work pends and a batch job reclaim requeued is pending again; for
   ``wall_s`` at most. The requeued job restarts from its last checkpoint elsewhere; it cannot come back onto
   the walled node, where Slurm's age priority would let the older batch job take the GPUs before the
   premium job (the live A/B at c5a5cd1 lost 466 of its 1,348 GPU-s of misuse to requeued batch retaking an
   H100 the moment the premium job on it ended, while the next premium job pended).

Measured (SIMULATED, docs/results.md "Premium reclaim"): without rule 2's line, reclaim requeued ~830 batch
jobs per 30-day openb run for finetune jobs deep in a long queue that the freed GPUs never reached: 4x the
wasted GPU-hours for 4% less misuse.

Limits: the Slurm view has no job constraints, partitions or pending reasons, so a premium job held back by
something else (a dependency, a limit, an admin feature only one H100 has) can cost one reclaim (then
rule 2's once-per-job keeps it at one, and the wall lifts after ``wall_s``); a yellow H100 lent to the job
by gang widening (core/gangs.py) is not counted as a place it fits, but an idle lent node takes the job
within a scheduling pass, well inside ``after_s``.

Decode services (not requeueable) and premium work are never requeued; a multi-node batch job is left alone
(requeueing it would free GPUs on nodes the premium job does not need). Only Slurm executes the requeue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations

from slurm_fleetyield.core.model import Envelope, JobView, LogEvent, Observations, WorkloadClass
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import RequeueJobs
from slurm_fleetyield.core.premium import (
    decode_eligible,
    idle_gpus,
    node_pieces,
    out_of_service,
    pending_premium_jobs,
    place,
)
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.state import ReclaimMemory


@dataclass(frozen=True, slots=True)
class Reclaim:
    actions: tuple[RequeueJobs, ...] = ()
    walled: Mapping[str, str] = field(default_factory=dict)  # node -> why fy_ok_batch is withheld
    memory: ReclaimMemory = field(default_factory=ReclaimMemory)
    events: tuple[LogEvent, ...] = ()


def reclaim(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    mem: ReclaimMemory,
    params: Params,
    now: float,
) -> Reclaim:
    rp = params.reclaim
    if not rp.enabled:
        return Reclaim(events=_lifted(mem.walls, (), now, "premium reclaim off"))
    requeued = tuple((j, t) for j, t in mem.requeued if now - t < rp.job_cooldown_s)
    served = tuple((j, t) for j, t in mem.served if now - t < rp.job_cooldown_s)
    pnodes = priced.nodes

    def eligible(name: str) -> bool:
        env, pn, s = envelopes.get(name), pnodes.get(name), obs.slurm.get(name)
        return (
            env is not None
            and env.premium
            and pn is not None
            and s is not None
            and decode_eligible(pn, env)
            and not out_of_service(s)
        )

    cooling = {j for j, _ in requeued}
    classes = {w for w in WorkloadClass if w.value in rp.classes}
    movable: dict[str, list[JobView]] = {}
    for j in obs.job_index.holding:
        if (
            j.workload in classes
            and j.state == "RUNNING"
            and len(j.nodes) == 1
            and j.requeue
            and j.gpus > 0
            and j.job_id not in cooling
        ):
            movable.setdefault(j.nodes[0], []).append(j)
    movable = {n: js for n, js in movable.items() if eligible(n)}
    if not movable and not mem.walls:  # the common case: nothing requeueable on a premium node, no wall
        return Reclaim(memory=ReclaimMemory((), (), requeued, served))
    pending = pending_premium_jobs(obs, frozenset(params.settle.premium_needing_classes))
    pending_ids = {j.job_id for j in pending}
    # A wall stays while its premium job pends; and, once that job has started, while other premium work
    # pends and batch that reclaim requeued is still pending: it would take the node back the moment it
    # frees (Slurm's age priority puts the older batch job first; live A/B seed 5: 412 GPU-s of misuse)
    displaced = bool(pending) and _displaced_pending(obs, {j for j, _ in requeued})
    walls = [(n, j, t) for n, j, t in mem.walls if (j in pending_ids or displaced) and now - t < rp.wall_s]
    if not pending:
        memory = ReclaimMemory((), (), requeued, served)
        return Reclaim(memory=memory, events=_lifted(mem.walls, (), now, ""))
    done_for = {j for j, _ in served}
    blocked: tuple[tuple[int, float], ...] = ()
    actions: list[RequeueJobs] = []
    events: list[LogEvent] = []
    free: dict[str, int] = {}  # idle GPUs of the eligible premium nodes
    max_node = 0
    if movable:  # else nothing requeueable on a premium node: nothing to decide
        idle = idle_gpus(obs)
        free = {n: idle.get(n, 0) for n in sorted(obs.slurm) if eligible(n)}
        max_node = max((s.gpu_count for s in obs.slurm.values()), default=0)
    for p in pending if movable else ():
        pieces = node_pieces(p, max_node)
        pick = place(pieces, {n: g for n, g in free.items() if g > 0}, frozenset())
        if pick is not None:  # fits idle premium GPUs: Slurm starts it at its next pass
            for n, g in pick.items():
                free[n] -= g
            continue
        # the first job that does not fit holds the line: reclaim acts for it or for nobody this tick
        if p.job_id in done_for or _deep(obs, p.job_id, rp.queue_depth):
            break
        plan = _plan(pieces, free, movable)
        if plan is None:
            break
        since = dict(mem.blocked).get(p.job_id, now)
        blocked = ((p.job_id, since),)
        n_jobs = sum(len(jobs) for jobs, _ in plan.values())
        if now - since < rp.after_s or n_jobs > rp.max_jobs_per_tick:
            break
        served += ((p.job_id, now),)
        walled_now = {n for n, _, _ in walls}
        for n, (jobs, _piece) in sorted(plan.items()):
            if not jobs:
                continue
            ids = tuple(sorted(j.job_id for j in jobs))
            why = (
                f"pending {p.workload and p.workload.value} job {p.job_id} ({p.gpus} GPUs) has "
                f"fitted no idle premium GPUs for {now - since:.0f} s and fits premium node {n} once batch "
                f"job(s) {', '.join(map(str, ids))} ({sum(j.gpus for j in jobs)} GPUs, requeueable) leave it"
            )
            actions.append(RequeueJobs(n, ids, p.job_id, f"premium reclaim: {why}"))
            data = {"jobs": list(ids), "for_job": p.job_id}
            events.append(LogEvent(now, n, "reclaim", f"requeued: {why}", data))
            requeued += tuple((i, now) for i in ids)
            if n not in walled_now:
                walls.append((n, p.job_id, now))
        break
    walls.sort()
    walled = {
        n: f"fy_ok_batch withheld: reclaimed for pending premium job {j}"
        if j in pending_ids
        else f"fy_ok_batch withheld: reclaimed for premium job {j}; batch it requeued still pends while "
        "premium work waits"
        for n, j, _ in walls
    }
    events.extend(_lifted(mem.walls, tuple(walls), now, ""))
    memory = ReclaimMemory(
        tuple(sorted(blocked)), tuple(walls), tuple(sorted(requeued)), tuple(sorted(served))
    )
    return Reclaim(tuple(actions), walled, memory, tuple(events))


def _displaced_pending(obs: Observations, requeued: set[int]) -> bool:
    """Is a batch job that reclaim requeued (within the cooldown) pending again?"""
    return bool(requeued) and any(j.job_id in requeued for j in obs.job_index.pending)


def _deep(obs: Observations, job_id: int, depth: int) -> bool:
    """Are ``depth`` or more GPU jobs pending ahead of ``job_id`` (lower ids)? Slurm tests only the head of
    its queue per pass (default_queue_depth, bf_max_job_test): GPUs freed for a job further back go to
    someone else."""
    ahead = 0
    for j in obs.job_index.pending:
        if j.gpus > 0 and j.job_id < job_id:
            ahead += 1
            if ahead >= depth:
                return True
    return False


def _plan(
    pieces: list[int], free: Mapping[str, int], movable: Mapping[str, list[JobView]]
) -> dict[str, tuple[tuple[JobView, ...], int]] | None:
    """All-or-nothing placement of a job's ``pieces`` (largest first) on the eligible premium nodes, each
    piece on the node that needs the fewest GPUs requeued (then fewest jobs, youngest jobs, name); node ->
    (jobs to requeue, GPUs the piece takes). None: some piece fits nowhere even with every movable job gone.
    A piece takes its node's freed and idle GPUs, so a gang's whole-node pieces land on distinct nodes."""
    left = dict(free)
    avail = {n: list(js) for n, js in movable.items()}
    out: dict[str, tuple[tuple[JobView, ...], int]] = {}
    for c in sorted(pieces, reverse=True):
        best: tuple[tuple[int, int, tuple[int, ...], str], tuple[JobView, ...]] | None = None
        for n, f in left.items():
            jobs = _fewest(c - f, avail.get(n, []))
            if jobs is None:
                continue
            key = (sum(j.gpus for j in jobs), len(jobs), tuple(-j.job_id for j in jobs), n)
            if best is None or key < best[0]:
                best = (key, jobs)
        if best is None:
            return None
        n, jobs = best[0][3], best[1]
        left[n] += sum(j.gpus for j in jobs) - c
        avail[n] = [j for j in avail.get(n, []) if j not in jobs]
        prev_jobs, prev_piece = out.get(n, ((), 0))
        out[n] = ((*prev_jobs, *jobs), prev_piece + c)
    return out


def _fewest(need: int, jobs: list[JobView]) -> tuple[JobView, ...] | None:
    """The set of ``jobs`` with at least ``need`` GPUs that has the fewest GPUs, then the fewest jobs, then
    the youngest (highest ids); () when nothing is needed, None when all of them are not enough. A node holds
    at most a handful of jobs (one per GPU at most): the subsets are enumerated."""
    if need <= 0:
        return ()
    if sum(j.gpus for j in jobs) < need:
        return None
    ordered = sorted(jobs, key=lambda j: -j.job_id)
    best: tuple[tuple[int, int, tuple[int, ...]], tuple[JobView, ...]] | None = None
    for k in range(1, len(ordered) + 1):
        for combo in combinations(ordered, k):
            g = sum(j.gpus for j in combo)
            if g < need:
                continue
            key = (g, k, tuple(-j.job_id for j in combo))
            if best is None or key < best[0]:
                best = (key, combo)
        if best is not None and best[0][0] == need:
            break  # no larger set frees fewer GPUs
    return best[1] if best is not None else None


Wall = tuple[str, int, float]  # (node, premium job id, since)


def _lifted(before: tuple[Wall, ...], after: tuple[Wall, ...], now: float, why: str) -> tuple[LogEvent, ...]:
    kept = {n for n, _, _ in after}
    return tuple(
        LogEvent(now, n, "reclaim_wall_lifted", why or f"premium job {j} no longer pending, or wall expired")
        for n, j, _ in before
        if n not in kept
    )
