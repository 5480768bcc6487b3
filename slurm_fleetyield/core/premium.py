"""Premium widening: the premium reservation as a shadow price, not a wall.

Input: the Slurm view (nodes and jobs: ``JobView`` state, nodes, workload, gpus), priced nodes, envelopes,
the previous ``PremiumMemory``, ``PremiumParams``, the premium-needing classes (``SettleParams``) and ``now``.
Output: ``Widening``: the premium nodes that carry ``fy_ok_decode`` this tick (``lent``), the next memory,
the demand/supply figures that justified it, and log events when the lent set changes.

Why: by default ``fy_ok_decode`` sits on healthy non-premium nodes only (core/route.py). On a decode-heavy
fleet that wall makes decode queue while premium GPUs idle (simulated on the openb workload: -13% net
goodput against unmodified Slurm, docs/results.md). Weights already express the preference (premium nodes
+1000: Slurm fills every non-premium node first), so the feature only needs to open when decode is stuck.
An earlier rule lent nothing while *any* premium-needing job was pending; in a busy fleet one almost always
is (a gang waiting for eight whole nodes with three idle, a finetune deep in the queue), so it almost never
lent and the idle premium GPUs stayed idle. Premium work now claims what it can use *now*; the reserve
protects what it will need later.

Rule, per tick:
1. eligible premium nodes: green, full HBM, not a lemon, not drained/down; their idle GPUs are the supply;
2. premium right of way: the PENDING jobs of a premium-needing class (pretrain, finetune by default), by job
   id (submission order, Slurm's default age priority), are placed all-or-nothing on the idle GPUs of the
   eligible premium nodes (best fit per node; a gang as whole nodes; nodes not lent before nodes lent, then
   by name). A job that fits *claims* those nodes: a claimed node is not lent this tick (a loan on it is
   withdrawn at once, no hysteresis). A job that does not fit (a gang waiting for more nodes than are idle)
   claims nothing: it cannot start on these GPUs now, whoever uses them; what it needs later is the
   reserve's job (4). A claim lasts ``claim_grace_s`` from the first tick the job fitted (remembered while
   it stays pending): a job that fitted idle GPUs for that long and was not started is held back by
   something else -- higher-priority jobs ahead of it in a deep queue (Slurm tests only the first
   ``default_queue_depth``/``bf_max_job_test`` jobs), a limit or constraint this rule does not see -- so
   keeping GPUs idle for it helps nobody; it claims nothing any more;
3. decode is *waiting* when PENDING decode jobs do not fit (best fit, per node) into the idle GPUs of the
   nodes that carry ``fy_ok_decode`` without a loan (healthy non-premium ones); a decode job that fits is
   merely waiting for the next scheduling pass, and never causes lending;
4. once decode has been waiting for ``lend_after_s``, unclaimed eligible premium nodes are lent until the
   waiting decode jobs fit: nodes already lent first (sticky), then the node with the most idle GPUs, ties
   by name (deterministic); never more than ``eligible - reserve`` premium nodes lent *or still running
   decode* (a node returned while its decode service runs on still holds it), reserve = the largest of
   ``reserve_nodes``, ceil(``reserve_fraction`` x eligible premium nodes) and the node count of the largest
   premium-needing job seen (running or pending) within ``gang_memory_s`` -- a lent decode service is not
   preempted, so without that term one long decode job could hold back the next gang for its whole life
   (the simulator showed an 8-node gang starting 20 h late behind lent decode) -- the gang term capped at
   floor(``gang_reserve_max_fraction`` x eligible): a gang as large as the premium fleet would otherwise
   reserve all of it, which is the wall again;
5. a lent node is returned ``hysteresis_s`` after decode last waited (features do not flap with a queue
   that drains and refills between ticks), or at once when it stops being eligible or is claimed (2);
6. decode kept open (``keep_decode_open``): when no in-service non-premium node is decode-eligible (none
   exists, or all are yellow, red or drained), one unclaimed premium node within the cap is lent even with
   no decode waiting (the one lent already, else the most idle): Slurm rejects at submission a job whose
   constraint no node carries, so decode would be refused outright and could never wait and be lent to.

Withdrawing ``fy_ok_decode`` changes only where Slurm places *new* jobs: decode services already running on
a premium node are not preempted (Slurm preemption is out of scope) and finish naturally. A premium job that
arrives meanwhile may wait for them; that is what the reserve is for, and why lending needs decode to have
waited first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from slurm_fleetyield.core.capacity import (
    best_fit,
    best_fit_hist,
    idle_gpus,
    node_pieces,
    out_of_service,
    place,
)
from slurm_fleetyield.core.model import (
    RUNNING_STATES,
    Envelope,
    JobView,
    LogEvent,
    Observations,
    WorkloadClass,
)
from slurm_fleetyield.core.params import Params, PremiumParams
from slurm_fleetyield.core.premium_supply import (
    Supply,
    _home,
    _premium,
    batch_home,
    decode_eligible,
    decode_home,
    supply,
)
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.state import PremiumMemory

__all__ = [
    "Widening",
    "best_fit",
    "decode_eligible",
    "idle_gpus",
    "node_pieces",
    "out_of_service",
    "place",
    "widen",
]


@dataclass(frozen=True, slots=True)
class Widening:
    lent: frozenset[str] = frozenset()
    memory: PremiumMemory = field(default_factory=PremiumMemory)
    events: tuple[LogEvent, ...] = ()
    premium_demand_gpus: int = 0  # GPUs of pending premium-needing jobs
    premium_pending_jobs: int = 0
    premium_startable_jobs: int = 0  # of those, the ones that fit the idle eligible premium GPUs now
    claimed: frozenset[str] = frozenset()  # premium nodes those jobs would start on: not lendable
    premium_supply_gpus: int = 0  # idle GPUs on eligible premium nodes
    decode_pending_gpus: int = 0
    decode_waiting_gpus: int = 0  # pending decode GPUs that fit nowhere fy_ok_decode already is
    batch_pending_gpus: int = 0  # premium.batch only
    batch_waiting_gpus: int = 0  # pending batch GPUs that fit nowhere fy_ok_batch already is
    reserve_nodes: int = 0
    reason: str = ""
    kept_open: bool = False  # rule 6: one node lent only so that decode stays submittable

    @property
    def loan(self) -> tuple[frozenset[str], str]:
        """(lent nodes, why): route's arguments."""
        return self.lent, self.reason


def pending_premium_jobs(obs: Observations, classes: frozenset[str]) -> list[JobView]:
    """PENDING jobs of a premium-needing class (``settle.premium_needing_classes``) asking for GPUs, by job
    id (submission order: Slurm's default age priority; a job id is unique in a queue)."""
    return sorted(
        (j for w, js in obs.job_index.pending_by.items() if w and w in classes for j in js if j.gpus > 0),
        key=lambda j: j.job_id,
    )


def widen(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    mem: PremiumMemory,
    params: Params,
    now: float,
    walled: frozenset[str] = frozenset(),
    supply: Supply = supply,
) -> Widening:
    """``params.premium`` drives the rule; ``params.settle.premium_needing_classes`` names premium work;
    ``walled``: premium nodes premium reclaim (core/reclaim.py) keeps for a premium job: never lent to
    waiting decode, and the keep-open loan (rule 6) only when no other node can take it; ``supply``:
    ``premium_supply.supply`` or a function with its answer (core/carry_place.py ``premium_supply``)."""
    pp = params.premium
    if not (pp.enabled and pp.reserve):  # no reservation: nothing to lend (route puts decode on every node)
        return Widening(memory=PremiumMemory(), events=_changed(mem.lent, (), now, "premium widening off"))
    classes = frozenset(params.settle.premium_needing_classes)
    pending_premium = pending_premium_jobs(obs, classes)
    jobs = obs.job_index
    DECODE, BATCH = WorkloadClass.DECODE, WorkloadClass.BATCH
    pending_decode = [j for j in jobs.pending_by.get(DECODE, ()) if j.workload is DECODE and j.gpus > 0]
    batch = jobs.pending_by.get(BATCH, ()) if pp.batch else ()
    pending_batch = [j for j in batch if j.workload is BATCH and j.gpus > 0]
    homeless = pp.keep_decode_open and (
        not decode_home(obs, priced, envelopes)
        or (pp.batch and not _home(obs, priced, envelopes, batch_home))
    )
    if not (
        pending_decode or pending_batch or pending_premium or mem.lent or mem.waiting_since is not None
        or homeless
    ):  # fmt: skip
        if mem.claims:
            mem = replace(mem, claims=())
        if any(j.workload and j.workload in classes and len(j.nodes) > 1 for j in jobs.placed):
            gang, seen = _largest_gang(obs, classes, 0, mem, pp, now)
            return Widening(memory=replace(mem, gang_nodes=gang, gang_seen=seen))
        return Widening(memory=mem)  # the common case: nothing pending, nothing lent
    idle = idle_gpus(obs)
    base, batch_base, eligible = supply(idle, envelopes, priced.nodes)
    max_node = max((s.gpu_count for s in obs.slurm.values()), default=0)
    gang, gang_seen = _largest_gang(obs, classes, max_node, mem, pp, now)
    gang_cap = math.floor(pp.gang_reserve_max_fraction * len(eligible) + 1e-9)
    reserve = (
        max(pp.reserve_nodes, math.ceil(pp.reserve_fraction * len(eligible)), min(gang, gang_cap))
        if eligible
        else 0
    )
    cap = max(0, len(eligible) - reserve)
    chunks = sorted((c for j in pending_decode for c in node_pieces(j, max_node)), reverse=True)
    unfit = best_fit_hist(chunks, dict(base))
    decode_unfit = sum(unfit)
    if pending_batch:
        batch_chunks = sorted((c for j in pending_batch for c in node_pieces(j, max_node)), reverse=True)
        unfit = sorted(unfit + best_fit_hist(batch_chunks, dict(batch_base)), reverse=True)
    waiting = bool(unfit)
    since = (mem.waiting_since if mem.waiting_since is not None else now) if waiting else None
    last = now if waiting else mem.last_waiting
    claimed, startable, claims = _claims(
        pending_premium, eligible, idle, frozenset(mem.lent), max_node, dict(mem.claims), pp.claim_grace_s,
        now,
    )  # fmt: skip
    fig = Widening(
        premium_demand_gpus=sum(j.gpus for j in pending_premium),
        premium_pending_jobs=len(pending_premium),
        premium_startable_jobs=startable,
        claimed=claimed,
        premium_supply_gpus=sum(idle.get(n, 0) for n in eligible),
        decode_pending_gpus=sum(j.gpus for j in pending_decode),
        decode_waiting_gpus=decode_unfit,
        batch_pending_gpus=sum(j.gpus for j in pending_batch),
        batch_waiting_gpus=sum(unfit) - decode_unfit,
        reserve_nodes=reserve,
    )
    unclaimed = [n for n in eligible if n not in claimed]
    lendable = [n for n in unclaimed if n not in walled]
    eligible_set = frozenset(lendable)
    # premium nodes still running decode (lent earlier, returned since): they count against the cap, or
    # a node returned while its decode service runs on would let the next loan eat into the reserve
    # (premium.batch: batch on an eligible, i.e. green, premium node too; a yellow one takes batch unlent)
    eligible_now = frozenset(eligible)
    held = {
        n for j in jobs.holding_by.get(DECODE, ()) if j.workload is DECODE and j.state in RUNNING_STATES
        for n in j.nodes if n in obs.slurm and _premium(envelopes.get(n))
    }  # fmt: skip
    if pp.batch:
        held.update(
            n for j in jobs.holding_by.get(BATCH, ()) if j.workload is BATCH and j.state in RUNNING_STATES
            for n in j.nodes if n in eligible_now
        )  # fmt: skip
    keep = [n for n in mem.lent if n in eligible_set]
    if not waiting and (last is None or now - last >= pp.hysteresis_s):
        keep = []
    # keep earlier loans (those still running decode first) only while loans + holders fit under the cap
    lent: list[str] = []
    for n in sorted(keep, key=lambda n: (n not in held, n)):
        if len(held.union(lent, (n,))) <= cap:
            lent.append(n)
    keep = list(lent)
    if waiting and since is not None and now - since >= pp.lend_after_s:
        unfit = best_fit(unfit, [idle.get(n, 0) for n in keep])
        for n in sorted((n for n in lendable if n not in keep), key=lambda n: (-idle.get(n, 0), n)):
            if not unfit or len(set(lent) | held) >= cap:
                break
            if idle.get(n, 0) < unfit[-1]:  # unfit is largest first and the nodes most idle first: none fits
                break
            left = best_fit(unfit, [idle.get(n, 0)])
            if len(left) < len(unfit):
                lent.append(n)
                unfit = left
    open_loan = False
    if homeless and not lent:  # rule 6: keep decode submittable (a walled node only as the last resort)
        for n in sorted(unclaimed, key=lambda n: (n in walled, n not in mem.lent, -idle.get(n, 0), n)):
            if len(held | {n}) <= cap:
                lent.append(n)
                open_loan = True
                break
    premium = (
        f"{startable} of {len(pending_premium)} pending premium-needing job(s) can start on idle premium "
        f"GPUs now ({len(claimed)} node(s) claimed)"
    )
    work = "decode/batch" if pp.batch else "decode"
    if open_loan:
        why = (
            f"no in-service node can carry the {work} feature without a loan: one premium node lent so "
            f"that {work} jobs are accepted (Slurm rejects a constraint no node has); {premium}; {reserve} "
            "premium node(s) kept in reserve"
        )
    elif waiting:
        batch_note = (
            f", {fig.batch_waiting_gpus} of {fig.batch_pending_gpus} pending batch GPUs no fy_ok_batch node"
            if pp.batch
            else ""
        )
        why = (
            f"{work} waiting: {fig.decode_waiting_gpus} of {fig.decode_pending_gpus} pending decode GPUs fit "
            f"no fy_ok_decode node{batch_note}; {premium}; {reserve} premium node(s) kept in reserve"
        )
    else:
        why = f"{work} not waiting (hysteresis {pp.hysteresis_s:g} s)"
    out = tuple(sorted(lent))
    what = "fy_ok_decode and fy_ok_batch" if pp.batch else "fy_ok_decode"
    events = _changed(mem.lent, out, now, why, claimed, premium, what)
    nxt = PremiumMemory(out, since, last, gang, gang_seen, claims)
    return replace(fig, lent=frozenset(out), memory=nxt, events=events, reason=why, kept_open=open_loan)


def _largest_gang(
    obs: Observations,
    classes: frozenset[str],
    max_node: int,
    mem: PremiumMemory,
    pp: PremiumParams,
    now: float,
) -> tuple[int, float | None]:
    """Nodes of the largest premium-needing job seen within ``gang_memory_s`` (pending: GPUs / node size)."""
    size = 0
    for w, js in obs.job_index.by.items():
        if not (w and w in classes):
            continue
        for j in js:
            n = len(j.nodes) if j.nodes else (math.ceil(j.gpus / max_node) if max_node > 0 else 1)
            size = max(size, n)
    if mem.gang_seen is not None and now - mem.gang_seen < pp.gang_memory_s and mem.gang_nodes >= size:
        return mem.gang_nodes, mem.gang_seen if mem.gang_nodes > size else now
    return (size, now) if size else (0, None)


def _claims(
    jobs: list[JobView],
    eligible: list[str],
    idle: Mapping[str, int],
    lent: frozenset[str],
    max_node: int,
    before: Mapping[int, float],
    grace_s: float,
    now: float,
) -> tuple[frozenset[str], int, tuple[tuple[int, float], ...]]:
    """Premium right of way (rule 2): the eligible premium nodes that pending premium-needing ``jobs`` (in
    priority order) would start on now, all-or-nothing per job; how many of the jobs could start; and the
    claim memory (job id -> since when it first could, kept while it stays pending). A claim older than
    ``grace_s`` claims nothing."""
    free = {n: idle[n] for n in eligible if idle.get(n, 0) > 0}
    total = sum(free.values())  # kept equal to sum(free.values()) as GPUs are claimed
    claimed: set[str] = set()
    startable = 0
    memory: list[tuple[int, float]] = []
    for j in jobs:
        since = before.get(j.job_id)
        if since is not None and now - since >= grace_s:
            memory.append((j.job_id, since))  # lapsed: Slurm is not starting it here, whoever waits
            continue
        if j.gpus > total:
            continue  # cannot start on these GPUs now, whoever uses them
        pick = place(node_pieces(j, max_node), free, lent)
        if pick is None:
            continue
        startable += 1
        memory.append((j.job_id, now if since is None else since))
        for n, g in pick.items():
            free[n] -= g
            total -= g
            claimed.add(n)
    return frozenset(claimed), startable, tuple(memory)


def _changed(
    before: tuple[str, ...],
    after: tuple[str, ...],
    now: float,
    why: str,
    claimed: frozenset[str] = frozenset(),
    claim_why: str = "",
    what: str = "fy_ok_decode",
) -> tuple[LogEvent, ...]:
    events = []
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    for n in new:
        events.append(LogEvent(now, n, "premium_lend", f"{what} lent to premium node: {why}"))
    for n in gone:
        reason = f"withdrawn, premium work can start here: {claim_why}" if n in claimed else why
        events.append(LogEvent(now, n, "premium_return", f"{what} returned: {reason}"))
    return tuple(events)
