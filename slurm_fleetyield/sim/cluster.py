"""An in-memory Slurm: the simulator's implementation of ``SlurmPort`` plus the scheduling rules we steer.

Input: node specs (name, GPUs, model, admin features), plans from the controller (``apply``), jobs to place
(``schedule``). Output: Slurm's view for ``tick`` (``read_nodes``/``read_jobs``, frozen ``SlurmNode`` and
``JobView`` objects, rebuilt only for nodes that changed) and job placements.

Slurm behaviour modelled (what FleetYield steers):
- constraints filter nodes: a job's constraint is an AND of features; a node qualifies when it carries all;
- among qualifying nodes Slurm takes the LOWEST weight first, ties broken by node name;
- a gang (multi-node job) starts only when all its nodes are free at once (all-or-nothing);
- DRAIN and DOWN nodes get no new work; a drain lets running jobs finish unless the plan requeues them;
- FIFO by submit time with EASY backfill: the first blocked job gets a reservation at the earliest time
  enough qualifying nodes free up (running jobs' true end times are the walltime estimates: perfect
  estimates, a simplification), and later jobs may start now only if they end before that time or do not
  touch the reserved nodes. At most ``bf_max_job_test`` queued jobs are tested per pass (Slurm's
  ``bf_max_job_test``).
Cost (the scheduler runs up to once a simulated minute over a queue of thousands): a pass scans only the
nodes with free GPUs, from a rank-sorted list per constraint kept up to date as nodes fill and free up
(``open_candidates``); a job whose shape (constraint, GPUs per node, nodes)
is no easier than one that already failed for lack of capacity in this pass fails without a scan (capacity
only shrinks within a pass); the EASY reservation is computed only when a later job could use a node it
might reserve, from per-node ready times cached until a job starts, ends or moves its end on that node; the
candidate lists per constraint are kept sorted incrementally instead of rebuilt on every feature change.
The result is the same as the plain scan (``tests/sim/test_cluster.py`` compares them on random queues).
QOS preemption (``preempt_for``, Slurm's preempt/qos with PreemptMode=REQUEUE): a job of another QOS that
cannot start may requeue running jobs of the preemptible QOS (``fy_preemptible``) on nodes matching its
constraint; without jobs of that QOS nothing changes.
Simplified: one partition, no priorities/fair share, GPUs are the only resource (CPUs and memory
are never the constraint), a drained node's running jobs finish normally, job requeue keeps the original
submit time as priority.
Submission: a job whose constraint no node carries (in any state) is refused, as sbatch refuses it
(``accepts``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_fleetyield.core.model import CanaryResult, JobView, SlurmNode, WorkloadClass
from slurm_fleetyield.core.plan import (
    CancelCanaries,
    DrainNode,
    Plan,
    RequeueJobs,
    ResumeNode,
    SignalJobs,
    SubmitCanary,
    UpdateNodes,
)
from slurm_fleetyield.ports import ActionResult, ApplyReport
from slurm_fleetyield.sim.fast import fast_new

# the views built per node or job change (sim/fast.py), and each class by its name (no enum call)
_new_node_view: Callable[..., SlurmNode] = fast_new(SlurmNode)
new_job_view: Callable[..., JobView] = fast_new(JobView)
WORKLOAD_CLASS: dict[str, WorkloadClass] = {c.value: c for c in WorkloadClass}


@dataclass(slots=True)
class SimNode:
    name: str
    gpus: int
    gpu_type: str
    admin_features: tuple[str, ...]
    features: tuple[str, ...]
    weight: int = 1
    free: int = 0
    drain: bool = False
    down: bool = False
    reason: str = ""
    rank: int = 0  # Slurm's order, (weight, name), as one int: weight * len(nodes) + the name's sorted index
    feature_set: frozenset[str] = frozenset()


@dataclass(slots=True)
class Placed:
    """A running job: which nodes, how many GPUs on each, when it ends."""

    job_id: int
    nodes: tuple[str, ...]
    gpus_per_node: int
    end: float
    workload: str
    requeue: bool = True
    qos: str = ""  # Slurm's QOS: the preemptible one's jobs may be evicted (``preempt_for``)


class SimSlurm:
    """Implements ``SlurmPort``; ``on_requeue(job_id)``: called for each job a drain or reclaim requeues."""

    def __init__(
        self,
        nodes: Iterable[tuple[str, int, str, tuple[str, ...]]],
        on_requeue: Callable[[int], None] | None = None,
        bf_max_job_test: int = 100,
    ) -> None:
        self.nodes: dict[str, SimNode] = {}
        specs = list(nodes)
        # (weight, name) packed into one int (same order, cheaper to compare in bisect and heaps)
        self._name_index = {name: i for i, name in enumerate(sorted(spec[0] for spec in specs))}
        self._span = len(specs)
        for name, gpus, gpu_type, admin in specs:
            n = SimNode(name, gpus, gpu_type, admin, admin, 1, gpus)
            n.rank, n.feature_set = self._rank_of(1, name), frozenset(admin)
            self.nodes[name] = n
        self.running: dict[int, Placed] = {}
        self.on_node: dict[str, set[int]] = {n: set() for n in self.nodes}
        self.on_requeue = on_requeue
        self.on_signal: Callable[[int, str], None] | None = None  # scancel --signal: the job's handler
        self.bf_max_job_test = bf_max_job_test
        self._views: dict[str, SlurmNode] = {}
        self._dirty: set[str] = set(self.nodes)
        self._accepts: dict[frozenset[str], bool] = {}  # constraint -> accepted at submission (accepts)
        self._cand: dict[frozenset[str], list[SimNode]] = {}  # usable nodes per constraint, by rank
        self._cand_rank: dict[frozenset[str], list[int]] = {}  # their ranks (bisect)
        # usable nodes with free GPUs per constraint, by rank, and their ranks: the same upkeep as _cand
        self._ocand: dict[frozenset[str], list[SimNode]] = {}
        self._ocand_rank: dict[frozenset[str], list[int]] = {}
        # node -> [(earliest time >= g GPUs are free (-inf: now), rank, name)] (_ready_keys)
        self._ready: dict[str, list[tuple[float, int, str]]] = {}
        self._job_views: dict[int, JobView] = {}  # running job -> its squeue view
        self._started: list[int] = []  # started since the last read_jobs (views still to build)
        self._running_views: tuple[JobView, ...] | None = None  # None: a job started or ended since
        self.calls = 0
        self.out = 0  # nodes drained or down (no new work)
        self.canaries: dict[str, tuple[str, int]] = {}  # node -> (token, count) of the submitted round
        self._canary_job = 900_000_000
        self.pending: Callable[[], Sequence[JobView]] | None = None  # the queue, as squeue shows it

    # ---- SlurmPort -------------------------------------------------------------------------------------

    def read_nodes(self) -> Mapping[str, SlurmNode]:
        for name in self._dirty:
            n = self.nodes[name]
            if n.free == n.gpus:
                base = "IDLE"
            elif n.free == 0:
                base = "ALLOCATED"
            else:
                base = "MIXED"
            states = {base}
            if n.drain:
                states.add("DRAIN")
            if n.down:
                states = {"DOWN"} | ({"DRAIN"} if n.drain else set())
            self._views[name] = _new_node_view(
                name, frozenset(states), n.reason, n.features, n.features, n.weight, n.gpu_type, n.gpus
            )
        self._dirty.clear()
        return self._views

    def read_jobs(self) -> Sequence[JobView]:
        """Running jobs (``gpus``: the whole job's, as ``squeue --json`` reports), then the pending ones."""
        running = self._running_views
        if running is None:
            views = self._job_views
            for jid in self._started:
                p = self.running.get(jid)
                if p is not None and jid not in views:
                    views[jid] = new_job_view(
                        jid,
                        "RUNNING",
                        p.nodes,
                        p.requeue,
                        WORKLOAD_CLASS[p.workload],
                        p.gpus_per_node * len(p.nodes),
                        (),
                        p.qos,
                    )
            self._started.clear()
            running = self._running_views = tuple([views[j] for j in sorted(self.running)])
        return running + tuple(self.pending()) if self.pending is not None else running

    def apply(self, plan: Plan) -> ApplyReport:
        results = []
        for a in plan.actions:
            if isinstance(a, UpdateNodes):
                for name in a.nodes:
                    self.set_features(name, a.features, a.weight)
                results.append(ActionResult(a, True, ("scontrol", "update", f"NodeName={','.join(a.nodes)}")))
            elif isinstance(a, DrainNode):
                self.set_drain(a.node, a.reason)
                self._requeue(a.requeue_jobs)
                results.append(
                    ActionResult(a, True, ("scontrol", "update", f"NodeName={a.node}", "State=DRAIN"))
                )
            elif isinstance(a, RequeueJobs):
                self._requeue(a.jobs)
                results.append(ActionResult(a, True, ("scontrol", "requeue", ",".join(map(str, a.jobs)))))
            elif isinstance(a, SignalJobs):
                for jid in a.jobs:
                    if jid in self.running and self.on_signal is not None:
                        self.on_signal(jid, a.signal)
                results.append(ActionResult(a, True, ("scancel", f"--signal={a.signal}", *map(str, a.jobs))))
            elif isinstance(a, ResumeNode):
                self.resume(a.node)
                results.append(
                    ActionResult(a, True, ("scontrol", "update", f"NodeName={a.node}", "State=RESUME"))
                )
            elif isinstance(a, SubmitCanary):
                self.canaries[a.node] = (a.token, a.count)
                results.append(ActionResult(a, True, ("sbatch", f"--job-name={a.job_name}")))
            elif isinstance(a, CancelCanaries):
                self.canaries.pop(a.node, None)
                results.append(ActionResult(a, True, ("scancel", f"--name={a.job_name}")))
            # reboots, GPU resets, power cycles: the simulated node keeps its drain and comes back at once
        self.calls += len(results)
        return ApplyReport(tuple(results), len(results))

    def _requeue(self, jobs: Iterable[int]) -> None:
        """``scontrol requeue``: the listed jobs still running go back to the queue (``on_requeue``)."""
        for jid in jobs:
            if jid in self.running and self.on_requeue is not None:
                self.on_requeue(jid)

    def canary_results(self) -> tuple[CanaryResult, ...]:
        """Canary rounds on resumed, responding nodes complete (the simulated check passes: a GPU the fault
        model still hides keeps the node from being resumed in the first place)."""
        out = []
        for node, (token, count) in sorted(self.canaries.items()):
            n = self.nodes[node]
            if n.drain or n.down:
                continue
            for _ in range(count):
                self._canary_job += 1
                out.append(CanaryResult(node, self._canary_job, token, "COMPLETED", 0))
            del self.canaries[node]
        return tuple(out)

    # ---- node state ------------------------------------------------------------------------------------

    def accepts(self, constraint: frozenset[str]) -> bool:
        """Would Slurm accept a job with this AND constraint at submission? Only when some node of the
        partition carries every feature, whatever its state (a drained node counts: the job pends with
        ReqNodeNotAvail); otherwise sbatch fails ("Invalid feature specification" / "Requested node
        configuration is not available"). Cached until a node's features change."""
        if not constraint:
            return True
        hit = self._accepts.get(constraint)
        if hit is None:
            hit = self._accepts[constraint] = any(constraint <= n.feature_set for n in self.nodes.values())
        return hit

    def set_features(self, name: str, features: tuple[str, ...], weight: int) -> None:
        n = self.nodes[name]
        if n.features != features or n.weight != weight:
            if n.features != features:
                self._accepts.clear()
            self._leave(n)
            n.features, n.weight = features, weight
            n.feature_set, n.rank = frozenset(features), self._rank_of(weight, name)
            self._dirty.add(name)
            self._enter(n)

    def _rank_of(self, weight: int, name: str) -> int:
        """``(weight, name)``'s place in Slurm's order (lowest weight first, then name) as one int."""
        return weight * self._span + self._name_index[name]

    def set_drain(self, name: str, reason: str) -> None:
        n = self.nodes[name]
        if not n.drain or n.reason != reason:
            self.out += not (n.drain or n.down)
            self._leave(n)
            n.drain, n.reason = True, reason
            self._dirty.add(name)

    def resume(self, name: str) -> None:
        n = self.nodes[name]
        if n.drain:
            n.drain, n.reason = False, ""
            self.out -= not n.down
            self._dirty.add(name)
            self._enter(n)

    def set_down(self, name: str, down: bool) -> None:
        n = self.nodes[name]
        if n.down != down:
            if not n.drain:
                self.out += 1 if down else -1
            self._leave(n)
            n.down = down
            self._dirty.add(name)
            self._enter(n)

    def _leave(self, n: SimNode) -> None:
        """Take ``n`` out of the cached candidate lists (before its rank, features or usability change)."""
        self._ready.pop(n.name, None)  # its ready keys carry its rank
        _drop(self._cand, self._cand_rank, n)
        _drop(self._ocand, self._ocand_rank, n)

    def _enter(self, n: SimNode) -> None:
        """Put ``n`` into the cached candidate lists it qualifies for (after a change)."""
        if n.drain or n.down:
            return
        _put(self._cand, self._cand_rank, n)
        if n.free > 0:
            _put(self._ocand, self._ocand_rank, n)

    def usable(self, name: str) -> bool:
        n = self.nodes[name]
        return not (n.drain or n.down)

    # ---- jobs ------------------------------------------------------------------------------------------

    def start(
        self,
        job_id: int,
        nodes: tuple[str, ...],
        gpus_per_node: int,
        end: float,
        workload: str,
        requeue: bool = True,
        qos: str = "",
    ) -> None:
        """``requeue``: Slurm's Requeue flag (``--no-requeue`` jobs keep running on a drained node); ``qos``:
        the job's QOS."""
        for name in nodes:
            n = self.nodes[name]
            n.free -= gpus_per_node
            assert n.free >= 0, (name, n.free)
            if not n.free:
                _drop(self._ocand, self._ocand_rank, n)
            self.on_node[name].add(job_id)
            self._dirty.add(name)
            self._ready.pop(name, None)
        self.running[job_id] = Placed(job_id, nodes, gpus_per_node, end, workload, requeue, qos)
        self._started.append(job_id)
        self._running_views = None

    def finish(self, job_id: int) -> Placed:
        p = self.running.pop(job_id)
        self._job_views.pop(job_id, None)
        self._running_views = None
        for name in p.nodes:
            n = self.nodes[name]
            was = n.free
            n.free += p.gpus_per_node
            if not was and n.free and not (n.drain or n.down):
                _put(self._ocand, self._ocand_rank, n)
            self.on_node[name].discard(job_id)
            self._dirty.add(name)
            self._ready.pop(name, None)
        return p

    def extend(self, job_id: int, seconds: float) -> Placed:
        """A running job now ends ``seconds`` later (redone work after a quiet corruption)."""
        p = self.running[job_id]
        p.end += seconds
        for name in p.nodes:
            self._ready.pop(name, None)
        return p

    def jobs_on(self, name: str) -> tuple[int, ...]:
        return tuple(sorted(self.on_node[name]))

    # ---- scheduling ------------------------------------------------------------------------------------

    def candidates(self, constraint: frozenset[str]) -> list[SimNode]:
        """Nodes carrying every feature of ``constraint`` and not drained/down, by (weight, name)."""
        c = self._cand.get(constraint)
        if c is None:
            c = sorted(
                (
                    n
                    for n in self.nodes.values()
                    if constraint <= n.feature_set and not n.drain and not n.down
                ),
                key=_rank,
            )
            self._cand[constraint] = c
            self._cand_rank[constraint] = [n.rank for n in c]
        return c

    def open_candidates(self, constraint: frozenset[str]) -> list[SimNode]:
        """``candidates`` with at least one free GPU, in the same order."""
        c = self._ocand.get(constraint)
        if c is None:
            c = self._ocand[constraint] = [n for n in self.candidates(constraint) if n.free > 0]
            self._ocand_rank[constraint] = [n.rank for n in c]
        return c

    def schedule(
        self, now: float, queue: Sequence[tuple[int, frozenset[str], int, int, float]]
    ) -> list[tuple[int, tuple[str, ...]]]:
        """One scheduling pass over ``queue`` (job_id, constraint, nodes, gpus_per_node, remaining seconds),
        already in priority order. Returns the placements (the caller calls ``start``)."""
        placed: list[tuple[int, tuple[str, ...]]] = []
        blocked = False  # a job could not start: its reservation holds for the rest of the pass
        pending: tuple[list[SimNode], int, int, dict[str, int]] | None = None  # reservation, not yet computed
        shadow = float("inf")
        reserved: frozenset[str] = frozenset()
        tested = 0
        taken: dict[str, int] = {}  # GPUs given out in this pass (start() is called by the caller later)
        failed: dict[frozenset[str], list[tuple[int, int]]] = {}  # (gpn, nodes) short of capacity
        for job_id, constraint, nn, gpn, remaining in queue:
            if tested >= self.bf_max_job_test:
                break
            tested += 1
            worse = failed.get(constraint)
            if worse is not None and any(gpn >= g and nn >= k for g, k in worse):
                continue  # no easier than a job that found too few nodes: capacity only shrank since
            # a node without free GPUs cannot take a job that needs GPUs: scan only the open ones
            cand = self.open_candidates(constraint) if gpn > 0 else self.candidates(constraint)
            pick: list[str] = []
            skipped = False
            late = now + remaining
            for n in cand:
                if n.free - taken.get(n.name, 0) >= gpn:
                    if blocked:
                        if pending is not None:
                            shadow, reserved = self._reservation(*pending, now)
                            pending = None
                        if n.name in reserved and late > shadow:
                            skipped = True
                            continue
                    pick.append(n.name)
                    if len(pick) == nn:
                        break
            if len(pick) == nn:
                for name in pick:
                    taken[name] = taken.get(name, 0) + gpn
                placed.append((job_id, tuple(pick)))
                continue
            if not skipped:
                failed.setdefault(constraint, []).append((gpn, nn))
            if not blocked:  # the first blocked job: reserve the earliest nodes for it (EASY backfill)
                blocked = True
                pending = (self.candidates(constraint), nn, gpn, dict(taken))
        return placed

    def preempt_for(
        self, constraint: frozenset[str], nn: int, gpn: int, preemptible: str
    ) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
        """Slurm's QOS preemption (PreemptType=preempt/qos, PreemptMode=REQUEUE) for a pending job of another
        QOS that could not start: GPUs held by running jobs of the ``preemptible`` QOS on nodes matching its
        constraint count as free. Returns (the ``nn`` nodes, the jobs to requeue first) or None (it does not
        fit even so). Nodes free enough without preemption first, then those needing the fewest victim GPUs
        (each by Slurm's order); on a node the largest victims go first, until the job's GPUs are free."""
        if not preemptible or gpn <= 0:
            return None
        free_now: list[SimNode] = []
        evict: list[tuple[int, int, str, tuple[int, ...]]] = []  # (victim GPUs, rank, name, victims)
        for n in self.candidates(constraint):
            if n.free >= gpn:
                free_now.append(n)
                if len(free_now) == nn:
                    return tuple(x.name for x in free_now), ()
                continue
            victims = sorted(
                (j for j in self.on_node[n.name] if self.running[j].qos == preemptible),
                key=lambda j: (-self.running[j].gpus_per_node, j),
            )
            got, free, chosen = 0, n.free, []
            for j in victims:
                if free >= gpn:
                    break
                g = self.running[j].gpus_per_node
                free += g
                got += g
                chosen.append(j)
            if free >= gpn:
                evict.append((got, n.rank, n.name, tuple(chosen)))
        if len(free_now) + len(evict) < nn:
            return None
        evict.sort()
        use = evict[: nn - len(free_now)]
        nodes = [x.name for x in free_now] + [name for _, _, name, _ in use]
        victims = sorted({j for *_, vs in use for j in vs})
        return tuple(sorted(nodes, key=lambda name: self.nodes[name].rank)), tuple(victims)

    def _ready_keys(self, n: SimNode) -> list[tuple[float, int, str]]:
        """``[g]``: ``(t, rank, name)``, ``t`` the earliest time node ``n`` has ``g`` GPUs free (-inf: now),
        from its jobs' end times; shorter than ``g + 1`` when it never will. Cached until a job starts or
        ends on the node or its rank changes."""
        r = self._ready.get(n.name)
        if r is None:
            free = n.free
            times = [-math.inf] * (free + 1)
            running = self.running
            for end, g in sorted((running[j].end, running[j].gpus_per_node) for j in self.on_node[n.name]):
                free += g
                while len(times) <= free:
                    times.append(end)
            rank, name = n.rank, n.name
            r = self._ready[name] = [(t, rank, name) for t in times]
        return r

    def _reservation(
        self, cand: list[SimNode], nn: int, gpn: int, taken: Mapping[str, int], now: float
    ) -> tuple[float, frozenset[str]]:
        """EASY backfill's reservation for a blocked job of ``nn`` nodes x ``gpn`` GPUs: (the shadow time,
        when the ``nn`` earliest candidates are ready, and those nodes), ``taken``: GPUs given out earlier in
        this pass. The earliest by (ready time, rank), a node free now being ready at ``now``.

        Built from the cached ready keys, where a node free now has ready time -inf: the same choice
        whenever the last chosen node is ready after ``now`` (every node ready before it is chosen in
        either order, and at its time both order by rank); else the keys are read again with -inf as
        ``now``."""
        avail: list[tuple[float, int, str]] = []
        keys, known = self._ready_keys, self._ready.get  # the cache, read inline (every node)
        add = avail.append
        ninf = -math.inf
        for n in cand:
            name = n.name
            if name not in taken:
                r = known(name)
                if r is None:
                    r = keys(n)
                if gpn < len(r):
                    add(r[gpn])
                continue
            # a node given GPUs earlier in this pass: its ready times less those GPUs
            free = n.free - taken[name]
            if free >= gpn:
                add((ninf, n.rank, name))
                continue
            ends = sorted((self.running[j].end, self.running[j].gpus_per_node) for j in self.on_node[name])
            for end, g in ends:
                free += g
                if free >= gpn:
                    add((end, n.rank, name))
                    break
        if len(avail) < nn:
            return float("inf"), frozenset()
        chosen = heapq.nsmallest(nn, avail)
        shadow = chosen[-1][0]
        if shadow <= now:  # the last chosen is ready by now: order with "free now" read as ready at ``now``
            chosen = heapq.nsmallest(nn, [(now if t == ninf else t, r, name) for t, r, name in avail])
            shadow = chosen[-1][0]
        return shadow, frozenset(name for _, _, name in chosen)


def _rank(n: SimNode) -> int:
    return n.rank


def _drop(
    lists: dict[frozenset[str], list[SimNode]], ranks: dict[frozenset[str], list[int]], n: SimNode
) -> None:
    """Remove ``n`` from every rank-sorted list of ``lists`` that holds it (only a list whose constraint its
    features meet can: callers drop a node before its features change)."""
    fs = n.feature_set
    for c, lst in lists.items():
        if not c <= fs:
            continue
        r = ranks[c]
        i = bisect.bisect_left(r, n.rank)
        if i < len(lst) and lst[i] is n:
            del lst[i], r[i]


def _put(
    lists: dict[frozenset[str], list[SimNode]], ranks: dict[frozenset[str], list[int]], n: SimNode
) -> None:
    """Insert ``n`` into every rank-sorted list of ``lists`` whose constraint it meets (once)."""
    fs = n.feature_set
    for c, lst in lists.items():
        if c <= fs:
            r = ranks[c]
            i = bisect.bisect_left(r, n.rank)
            if i < len(lst) and lst[i] is n:
                continue
            lst.insert(i, n)
            r.insert(i, n.rank)
