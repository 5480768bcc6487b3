"""Small builders of observations for the decision-core tests: a fleet, its samples, faults, and a fake apply.

``Fleet`` holds a mutable picture of a cluster (Slurm nodes, per-GPU DCGM fields, XID totals, jobs) and
``observe(now)`` freezes it into ``Observations``; ``apply(plan)`` plays a plan back into the Slurm picture
the way the Slurm adapter would, so a test can tick, apply, tick again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from slurm_fleetyield.core.loop import TickResult, tick
from slurm_fleetyield.core.model import (
    FatalEvent,
    GpuReading,
    JobView,
    NodeSample,
    Observations,
    SlurmNode,
)
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import DrainNode, Plan, ResumeNode, UpdateNodes
from slurm_fleetyield.core.signals import (
    COUNTER_CHANNELS,
    GPU_TEMP,
    REMAP_FAILURE,
    REMAP_PENDING,
    SLOWDOWN_TEMP,
    THROTTLE_REASONS,
)
from slurm_fleetyield.core.state import ControllerState

H100 = "NVIDIA H100 80GB HBM3"
A100_PCIE = "NVIDIA A100 80GB PCIe"
L40S = "NVIDIA L40S"
ZERO_COUNTERS = {
    **dict.fromkeys(COUNTER_CHANNELS, 0.0),
    REMAP_FAILURE: 0.0,
    REMAP_PENDING: 0.0,
    THROTTLE_REASONS: 0.0,
}


@dataclass
class GpuSpec:
    index: int
    uuid: str
    model: str
    fields: dict[str, float] = field(default_factory=dict)
    xids: dict[int, float] = field(default_factory=dict)


@dataclass
class NodeSpec:
    name: str
    model: str = H100
    gpus: list[GpuSpec] = field(default_factory=list)
    slurm: SlurmNode | None = None
    sample_time: float | None = None  # None: follows the clock
    error: str | None = None
    sampled: bool = True
    expected_gpus: int | None = 8
    hidden_gpus: set[int] = field(default_factory=set)  # indices that vanished from the scrape


class Fleet:
    def __init__(
        self,
        n: int = 4,
        model: str = H100,
        gpus: int = 8,
        prefix: str = "gpu",
        gpu_type: str | None = None,
        admin_features: tuple[str, ...] = ("rack1", "ib"),
    ) -> None:
        self.nodes: dict[str, NodeSpec] = {}
        self.jobs: list[JobView] = []
        self.events: list[FatalEvent] = []
        self.slurm_ok = True
        for i in range(n):
            self.add(f"{prefix}{i:03d}", model, gpus, gpu_type, admin_features)

    def add(
        self,
        name: str,
        model: str = H100,
        gpus: int = 8,
        gpu_type: str | None = None,
        admin_features: tuple[str, ...] = ("rack1", "ib"),
    ) -> NodeSpec:
        specs = [
            GpuSpec(i, f"GPU-{name}-{i}", model, {GPU_TEMP: 55.0, SLOWDOWN_TEMP: 87.0, **ZERO_COUNTERS})
            for i in range(gpus)
        ]
        slurm = SlurmNode(name, frozenset({"IDLE"}), "", admin_features, admin_features, 1, gpu_type, gpus)
        spec = NodeSpec(name, model, specs, slurm, expected_gpus=gpus)
        self.nodes[name] = spec
        return spec

    # -- faults -----------------------------------------------------------------------------------------
    def set(self, node: str, gpu: int, field_name: str, value: float) -> None:
        self.nodes[node].gpus[gpu].fields[field_name] = value

    def bump(self, node: str, gpu: int, field_name: str, by: float) -> None:
        f = self.nodes[node].gpus[gpu].fields
        f[field_name] = f.get(field_name, 0.0) + by

    def xid(self, node: str, gpu: int, xid: int, by: float = 1.0) -> None:
        x = self.nodes[node].gpus[gpu].xids
        x[xid] = x.get(xid, 0.0) + by

    def push(
        self,
        node: str,
        xid: int | None,
        gpu: int | None,
        t: float,
        kind: str = "xid",
        eid: str | None = None,
        message: str = "",
    ) -> FatalEvent:
        ev = FatalEvent(
            eid or f"ev-{node}-{xid}-{gpu}-{t}",
            node,
            t,
            kind,
            gpu,
            None if gpu is None else f"GPU-{node}-{gpu}",
            xid,
            message,
        )
        self.events.append(ev)
        return ev

    def slurm_update(self, node: str, **changes: object) -> None:
        spec = self.nodes[node]
        assert spec.slurm is not None
        spec.slurm = replace(spec.slurm, **changes)  # type: ignore[arg-type]

    def drain_by_admin(self, node: str, reason: str = "bad fan, ticket 123") -> None:
        self.slurm_update(node, states=frozenset({"IDLE", "DRAIN"}), reason=reason)

    def run_job(
        self, job_id: int, nodes: tuple[str, ...], requeue: bool = True, state: str = "RUNNING"
    ) -> None:
        self.jobs.append(JobView(job_id, state, nodes, requeue))

    # -- observation and apply ----------------------------------------------------------------------------
    def observe(self, now: float) -> Observations:
        slurm = {n: s.slurm for n, s in self.nodes.items() if s.slurm is not None}
        samples = {}
        for n, s in self.nodes.items():
            if not s.sampled:
                continue
            t = now if s.sample_time is None else s.sample_time
            gpus = tuple(
                GpuReading(g.index, g.uuid, g.model, f"0000:{g.index:02x}:00.0", dict(g.fields), dict(g.xids))
                for g in s.gpus
                if g.index not in s.hidden_gpus
            )
            samples[n] = NodeSample(n, t, gpus, s.expected_gpus, s.error)
        return Observations(now, slurm, samples, tuple(self.events), tuple(self.jobs), self.slurm_ok)

    def apply(self, plan: Plan) -> None:
        for a in plan.actions:
            if isinstance(a, UpdateNodes):
                for n in a.nodes:
                    self.slurm_update(
                        n, available_features=a.features, active_features=a.features, weight=a.weight
                    )
            elif isinstance(a, DrainNode):
                s = self.nodes[a.node].slurm
                assert s is not None
                self.slurm_update(a.node, states=s.states | {"DRAIN"}, reason=a.reason)
            elif isinstance(a, ResumeNode):
                s = self.nodes[a.node].slurm
                assert s is not None
                self.slurm_update(a.node, states=s.states - {"DRAIN"}, reason="")


def mixed_fleet(h: int = 4, l: int = 1) -> Fleet:  # noqa: E741
    """``h`` H100 nodes h0.. (premium) and ``l`` L40S nodes l0.., 8 GPUs each, seed 0."""
    f = Fleet(0)
    for i in range(h):
        f.add(f"h{i}", H100)
    for i in range(l):
        f.add(f"l{i}", L40S)
    return f


# The rule before the stake rule (core/stake.py): class features by absolute risk tier, the premium reserve
# with its widening and reclaim. The tests of the mechanisms that serve it (premium widening, reclaim, gang
# widening, keep-open, the gate's proposals at red) run under it: they are options a site may turn on.
TIER_RULE: dict[str, dict[str, object]] = {
    "stake": {"enabled": False},
    "premium": {"reserve": True},
    "reclaim": {"enabled": True},
}
_Params = Params


def tier_params(**over: object) -> Params:
    """``Params(**over)`` under the tier rule (``TIER_RULE`` merged under ``over``'s sections)."""
    merged: dict[str, object] = {k: dict(v) for k, v in TIER_RULE.items()}
    for k, v in over.items():
        if hasattr(v, "model_dump"):
            v = v.model_dump(exclude_unset=True)
        base = merged.get(k)
        merged[k] = {**base, **v} if isinstance(base, dict) and isinstance(v, dict) else v
    return _Params(**merged)  # type: ignore[arg-type]


class Runner:
    """Ticks a fleet on a virtual clock, applying each plan (like the daemon with a perfect Slurm)."""

    def __init__(
        self,
        fleet: Fleet,
        params: Params | None = None,
        t0: float = 1_000_000.0,
        step: float = 30.0,
        apply: bool = True,
    ) -> None:
        self.fleet = fleet
        self.params = params or self.default_params()
        self.now = t0
        self.step = step
        self.state = ControllerState.empty()
        self.rng = random.Random(7)
        self.apply = apply
        self.last: TickResult | None = None

    default_params = staticmethod(_Params)  # tier_params in the tests of the tier rule's mechanisms

    def tick(self, advance: bool = True) -> TickResult:
        if advance and self.last is not None:
            self.now += self.step
        result = tick(self.state, self.fleet.observe(self.now), self.params, self.now, self.rng)
        self.state = result.state
        if self.apply:
            self.fleet.apply(result.plan)
        self.last = result
        return result

    def ticks(self, n: int) -> TickResult:
        r = self.tick()
        for _ in range(n - 1):
            r = self.tick()
        return r
