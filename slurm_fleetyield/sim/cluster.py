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
Simplified: one partition, no priorities/fair share/preemption, GPUs are the only resource (CPUs and memory
are never the constraint), a drained node's running jobs finish normally, job requeue keeps the original
submit time as priority.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_fleetyield.core.model import CanaryResult, JobView, SlurmNode, WorkloadClass
from slurm_fleetyield.core.plan import CancelCanaries, DrainNode, Plan, ResumeNode, SubmitCanary, UpdateNodes
from slurm_fleetyield.ports import ActionResult, ApplyReport


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
    rank: tuple[int, str] = (1, "")
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


class SimSlurm:
    """Implements ``SlurmPort``. ``on_requeue(job_id, now)`` is called for every job a drain requeues."""

    def __init__(
        self,
        nodes: Iterable[tuple[str, int, str, tuple[str, ...]]],
        on_requeue: Callable[[int], None] | None = None,
        bf_max_job_test: int = 100,
    ) -> None:
        self.nodes: dict[str, SimNode] = {}
        for name, gpus, gpu_type, admin in nodes:
            n = SimNode(name, gpus, gpu_type, admin, admin, 1, gpus)
            n.rank, n.feature_set = (1, name), frozenset(admin)
            self.nodes[name] = n
        self.running: dict[int, Placed] = {}
        self.on_node: dict[str, set[int]] = {n: set() for n in self.nodes}
        self.on_requeue = on_requeue
        self.bf_max_job_test = bf_max_job_test
        self._views: dict[str, SlurmNode] = {}
        self._dirty: set[str] = set(self.nodes)
        self._cand: dict[frozenset[str], list[SimNode]] = {}
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
            self._views[name] = SlurmNode(
                name, frozenset(states), n.reason, n.features, n.features, n.weight, n.gpu_type, n.gpus
            )
        self._dirty.clear()
        return self._views

    def read_jobs(self) -> Sequence[JobView]:
        """Running jobs (``gpus``: the whole job's, as ``squeue --json`` reports), then the pending ones."""
        running = tuple(
            JobView(
                p.job_id,
                "RUNNING",
                p.nodes,
                p.requeue,
                WorkloadClass(p.workload),
                p.gpus_per_node * len(p.nodes),
            )
            for p in sorted(self.running.values(), key=lambda p: p.job_id)
        )
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
                for jid in a.requeue_jobs:
                    if jid in self.running and self.on_requeue is not None:
                        self.on_requeue(jid)
                results.append(
                    ActionResult(a, True, ("scontrol", "update", f"NodeName={a.node}", "State=DRAIN"))
                )
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

    def set_features(self, name: str, features: tuple[str, ...], weight: int) -> None:
        n = self.nodes[name]
        if n.features != features or n.weight != weight:
            n.features, n.weight = features, weight
            n.feature_set, n.rank = frozenset(features), (weight, name)
            self._dirty.add(name)
            self._cand.clear()

    def set_drain(self, name: str, reason: str) -> None:
        n = self.nodes[name]
        if not n.drain or n.reason != reason:
            self.out += not (n.drain or n.down)
            n.drain, n.reason = True, reason
            self._dirty.add(name)
            self._cand.clear()

    def resume(self, name: str) -> None:
        n = self.nodes[name]
        if n.drain:
            n.drain, n.reason = False, ""
            self.out -= not n.down
            self._dirty.add(name)
            self._cand.clear()

    def set_down(self, name: str, down: bool) -> None:
        n = self.nodes[name]
        if n.down != down:
            if not n.drain:
                self.out += 1 if down else -1
            n.down = down
            self._dirty.add(name)
            self._cand.clear()

    def usable(self, name: str) -> bool:
        n = self.nodes[name]
        return not (n.drain or n.down)

    # ---- jobs ------------------------------------------------------------------------------------------

    def start(
        self, job_id: int, nodes: tuple[str, ...], gpus_per_node: int, end: float, workload: str
    ) -> None:
        for name in nodes:
            n = self.nodes[name]
            n.free -= gpus_per_node
            assert n.free >= 0, (name, n.free)
            self.on_node[name].add(job_id)
            self._dirty.add(name)
        self.running[job_id] = Placed(job_id, nodes, gpus_per_node, end, workload)

    def finish(self, job_id: int) -> Placed:
        p = self.running.pop(job_id)
        for name in p.nodes:
            self.nodes[name].free += p.gpus_per_node
            self.on_node[name].discard(job_id)
            self._dirty.add(name)
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
                key=lambda n: n.rank,
            )
            self._cand[constraint] = c
        return c

    def schedule(
        self, now: float, queue: Sequence[tuple[int, frozenset[str], int, int, float]]
    ) -> list[tuple[int, tuple[str, ...]]]:
        """One scheduling pass over ``queue`` (job_id, constraint, nodes, gpus_per_node, remaining seconds),
        already in priority order. Returns the placements (the caller calls ``start``)."""
        placed: list[tuple[int, tuple[str, ...]]] = []
        shadow: float | None = None
        reserved: frozenset[str] = frozenset()
        tested = 0
        taken: dict[str, int] = {}  # GPUs given out in this pass (start() is called by the caller later)
        for job_id, constraint, nn, gpn, remaining in queue:
            if tested >= self.bf_max_job_test:
                break
            tested += 1
            cand = self.candidates(constraint)
            pick: list[str] = []
            for n in cand:
                if n.free - taken.get(n.name, 0) >= gpn:
                    if shadow is not None and n.name in reserved and now + remaining > shadow:
                        continue
                    pick.append(n.name)
                    if len(pick) == nn:
                        break
            if len(pick) == nn:
                for name in pick:
                    taken[name] = taken.get(name, 0) + gpn
                placed.append((job_id, tuple(pick)))
                continue
            if shadow is None:  # the first blocked job: reserve the earliest nodes for it (EASY backfill)
                shadow, reserved = self._reservation(cand, nn, gpn, now, taken)
        return placed

    def _reservation(
        self, cand: list[SimNode], nn: int, gpn: int, now: float, taken: Mapping[str, int]
    ) -> tuple[float, frozenset[str]]:
        avail: list[tuple[float, tuple[int, str], str]] = []
        for n in cand:
            free = n.free - taken.get(n.name, 0)
            if free >= gpn:
                avail.append((now, n.rank, n.name))
                continue
            ends = sorted((self.running[j].end, self.running[j].gpus_per_node) for j in self.on_node[n.name])
            t = None
            for end, g in ends:
                free += g
                if free >= gpn:
                    t = end
                    break
            if t is not None:
                avail.append((t, n.rank, n.name))
        if len(avail) < nn:
            return float("inf"), frozenset()
        avail.sort()
        chosen = avail[:nn]
        return chosen[-1][0], frozenset(name for _, _, name in chosen)
