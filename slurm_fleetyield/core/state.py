"""What the controller remembers between ticks.

Input: the previous ``ControllerState`` (or ``ControllerState.empty()``). Output: the next one, built by the
stages and returned in ``TickResult.state``. The store persists it every tick via ``to_dict()`` (JSON-safe,
round-trip exact, versioned) and restores it with ``from_dict()``. Everything here is bounded: GPU history is
trimmed to the longest trend window, fatal history to ``fatal_history_days``, drain times to the rate window,
processed event ids to ``max_processed_event_ids``; lifecycle memories, open proposals, denials and open
predictions are at most one per node; settled job ids and pending intervals have their own bounds.

Version 2 added ``lifecycle``, ``lifecycle_drained``, ``proposals``, ``denials``, ``settle`` and ``learn``;
``premium`` (premium widening, core/premium.py), ``kept_open`` (core/keep_open.py) and ``reclaim``
(core/reclaim.py) are optional within version 2: a state without them lends nothing, keeps nothing open and
walls nothing.
A version-1 state still loads: a node it remembers as quarantined by us (drained by us, tier quarantined)
becomes a QUARANTINED lifecycle memory whose cause is its last fatal XID, so it enters remediation instead of
staying drained forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from slurm_fleetyield.core.history import (
    Clock,
    Counters,
    FleetHistory,
    GpuHistory,
    GpuTrack,
    NodeHistory,
    NodeTracks,
)
from slurm_fleetyield.core.lifecycle import Cause, LifecycleMemory, Stage
from slurm_fleetyield.core.memories import (
    Denial,
    LearnMemory,
    NodeMemory,
    OpenProposal,
    Prediction,
    PremiumMemory,
    ReclaimMemory,
    SettleMemory,
)
from slurm_fleetyield.core.model import FatalEvent, Tier
from slurm_fleetyield.core.reuse import changed_keys, note_changes, slurm_view, sorted_names

__all__ = [
    "Clock",
    "ControllerState",
    "Counters",
    "Denial",
    "FleetHistory",
    "GpuHistory",
    "GpuTrack",
    "LearnMemory",
    "NodeHistory",
    "NodeMemory",
    "NodeTracks",
    "OpenProposal",
    "Prediction",
    "PremiumMemory",
    "ReclaimMemory",
    "SettleMemory",
    "changed_keys",
    "note_changes",
    "slurm_view",
    "sorted_names",
]

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True)
class ControllerState:
    nodes: Mapping[str, NodeMemory] = field(default_factory=dict)
    history: Mapping[str, Mapping[str, GpuHistory]] = field(default_factory=dict)  # node -> GPU uuid -> ...
    layout: tuple[str, ...] = ()  # channel names of every Counters tuple in ``history``
    drain_times: tuple[float, ...] = ()  # our recent drains, for the per-window rate cap
    processed_events: tuple[str, ...] = ()  # fatal event ids already acted on, oldest first (bounded)
    # Fatal evidence whose drain a safety rule (cap, rate, unknown Slurm state) held: the shell hands a pushed
    # event in once and a scrape shows an XID growing in one tick only, so the core keeps it and reconsiders
    # it every tick until the drain happens, the node becomes moot, or the evidence is too old.
    held_fatal: tuple[FatalEvent, ...] = ()
    last_tick: float | None = None
    version: int = STATE_VERSION
    lifecycle: Mapping[str, LifecycleMemory] = field(default_factory=dict)  # only non-forgettable memories
    lifecycle_drained: frozenset[str] = frozenset()  # lifecycle nodes Slurm showed drained by us last tick
    proposals: Mapping[str, OpenProposal] = field(default_factory=dict)  # node -> its open proposal
    denials: Mapping[str, Denial] = field(default_factory=dict)  # node -> last denial (within cooldown)
    settle: SettleMemory = field(default_factory=SettleMemory)
    learn: LearnMemory = field(default_factory=LearnMemory)
    premium: PremiumMemory = field(default_factory=PremiumMemory)
    # (class feature, node) kept open by core/keep_open.py, node "" where none qualified; sorted.
    kept_open: tuple[tuple[str, str], ...] = ()
    reclaim: ReclaimMemory = field(default_factory=ReclaimMemory)
    # Not persisted, not compared: each carry's last inputs and answer (core/carry.py, carry_place.py,
    # carry_sense.py), keyed by the very input objects, so a stage is run again only for the nodes whose
    # inputs changed. Carried from tick to tick by ``core.loop``; an empty memo (a restored state) only costs
    # time. Entries are pure functions of their keys, so sharing it between states is harmless.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def empty() -> ControllerState:
        return ControllerState()

    # ---- persistence -------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (only str keys, lists, numbers, None). ``from_dict(to_dict())`` equals ``self``."""
        return {
            "version": self.version,
            "last_tick": self.last_tick,
            "layout": list(self.layout),
            "drain_times": list(self.drain_times),
            "processed_events": list(self.processed_events),
            "held_fatal": [asdict(e) for e in self.held_fatal],  # as the store's inbox keeps events
            "nodes": {name: _memory_to_dict(m) for name, m in sorted(self.nodes.items())},
            "history": {
                node: {uuid: _history_to_dict(h) for uuid, h in sorted(gpus.items())}
                for node, gpus in sorted(self.history.items())
            },
            "lifecycle": {n: m.to_dict() for n, m in sorted(self.lifecycle.items())},
            "lifecycle_drained": sorted(self.lifecycle_drained),
            "proposals": {n: _proposal_to_dict(p) for n, p in sorted(self.proposals.items())},
            "denials": {n: [d.proposal_id, d.time, d.risk] for n, d in sorted(self.denials.items())},
            "settle": {
                "settled": list(self.settle.settled),
                "pending": [[a, b] for a, b in self.settle.pending],
            },
            "learn": _learn_to_dict(self.learn),
            "premium": {
                "lent": list(self.premium.lent),
                "waiting_since": self.premium.waiting_since,
                "last_waiting": self.premium.last_waiting,
                "gang_nodes": self.premium.gang_nodes,
                "gang_seen": self.premium.gang_seen,
                "claims": [[j, t] for j, t in self.premium.claims],
            },
            "kept_open": [[f, n] for f, n in self.kept_open],
            "reclaim": {
                "blocked": [[j, t] for j, t in self.reclaim.blocked],
                "walls": [[n, j, t] for n, j, t in self.reclaim.walls],
                "requeued": [[j, t] for j, t in self.reclaim.requeued],
                "served": [[j, t] for j, t in self.reclaim.served],
            },
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> ControllerState:
        version = data.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(
                f"controller state version {version!r} is not supported (expected one of {READABLE_VERSIONS})"
            )
        nodes = {name: _memory_from_dict(m) for name, m in data.get("nodes", {}).items()}
        if version == 1:
            lifecycle = _adopt_v1(nodes)
            drained = frozenset(lifecycle)
        else:
            lifecycle = {n: LifecycleMemory.from_dict(m) for n, m in data.get("lifecycle", {}).items()}
            drained = frozenset(data.get("lifecycle_drained", ()))
        st = data.get("settle") or {}
        return ControllerState(
            nodes=nodes,
            history={
                node: {uuid: _history_from_dict(h) for uuid, h in gpus.items()}
                for node, gpus in data.get("history", {}).items()
            },
            layout=tuple(data.get("layout", ())),
            drain_times=tuple(float(t) for t in data.get("drain_times", ())),
            processed_events=tuple(data.get("processed_events", ())),
            held_fatal=tuple(FatalEvent(**d) for d in data.get("held_fatal", ())),
            last_tick=data.get("last_tick"),
            version=STATE_VERSION,
            lifecycle=lifecycle,
            lifecycle_drained=drained,
            proposals={n: _proposal_from_dict(p) for n, p in data.get("proposals", {}).items()},
            denials={n: Denial(i, float(t), float(r)) for n, (i, t, r) in data.get("denials", {}).items()},
            settle=SettleMemory(
                tuple(int(j) for j in st.get("settled", ())),
                tuple((float(a), None if b is None else float(b)) for a, b in st.get("pending", ())),
            ),
            learn=_learn_from_dict(data.get("learn") or {}),
            premium=_premium_from_dict(data.get("premium") or {}),
            kept_open=tuple((str(f), str(n)) for f, n in data.get("kept_open", ())),
            reclaim=_reclaim_from_dict(data.get("reclaim") or {}),
        )

    def __eq__(self, other: object) -> bool:  # mappings compare by content, whatever their concrete type
        if not isinstance(other, ControllerState):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def _premium_from_dict(d: Mapping[str, Any]) -> PremiumMemory:
    """Absent in states written before premium widening: nothing lent."""
    since, last = d.get("waiting_since"), d.get("last_waiting")
    return PremiumMemory(
        tuple(str(n) for n in d.get("lent", ())),
        None if since is None else float(since),
        None if last is None else float(last),
        int(d.get("gang_nodes", 0)),
        None if d.get("gang_seen") is None else float(d["gang_seen"]),
        tuple((int(j), float(t)) for j, t in d.get("claims", ())),
    )


def _memory_to_dict(m: NodeMemory) -> dict[str, Any]:
    return {
        "tier": m.tier.value,
        "since": m.since,
        "reason": m.reason,
        "drained_by_us": m.drained_by_us,
        "fatal_history": [[t, u] for t, u in m.fatal_history],
        "last_xid": m.last_xid,
        "last_gpu": m.last_gpu,
        "fy_features": list(m.fy_features),
        "weight": m.weight,
    }


def _memory_from_dict(d: Mapping[str, Any]) -> NodeMemory:
    return NodeMemory(
        tier=Tier(d["tier"]),
        since=d["since"],
        reason=d["reason"],
        drained_by_us=bool(d.get("drained_by_us", False)),
        fatal_history=tuple((t, u) for t, u in d.get("fatal_history", ())),
        last_xid=d.get("last_xid"),
        last_gpu=d.get("last_gpu"),
        fy_features=tuple(d.get("fy_features", ())),
        weight=d.get("weight"),
    )


def _history_to_dict(h: GpuHistory) -> dict[str, Any]:
    return {
        "last_time": h.last_time,
        "last_raw": list(h.last_raw),
        "last_adj": list(h.last_adj),
        "times": list(h.times),
        "points": [list(p) for p in h.points],
    }


def _history_from_dict(d: Mapping[str, Any]) -> GpuHistory:
    return GpuHistory(
        last_time=d["last_time"],
        last_raw=tuple(d["last_raw"]),
        last_adj=tuple(d["last_adj"]),
        times=tuple(d["times"]),
        points=tuple(tuple(p) for p in d["points"]),
    )


def _adopt_v1(nodes: Mapping[str, NodeMemory]) -> dict[str, LifecycleMemory]:
    """Version 1 had no lifecycle: a node it quarantined waits in QUARANTINED for remediation."""
    out = {}
    for name, m in nodes.items():
        if m.drained_by_us and m.tier is Tier.QUARANTINED:
            kind = "xid" if m.last_xid is not None else "default"
            cause = Cause(kind, m.last_xid, m.last_gpu, "adopted from state v1")
            out[name] = LifecycleMemory(name, Stage.QUARANTINED, m.since, cause, reason=m.reason)
    return out


def _proposal_to_dict(p: OpenProposal) -> dict[str, Any]:
    return {
        "id": p.proposal_id,
        "node": p.node,
        "risk": p.risk,
        "created_at": p.created_at,
        "expires_at": p.expires_at,
        "gpus": list(p.gpus),
        "below_since": p.below_since,
        "approved_by": p.approved_by,
        "approved_at": p.approved_at,
    }


def _proposal_from_dict(d: Mapping[str, Any]) -> OpenProposal:
    return OpenProposal(
        d["id"],
        d["node"],
        float(d["risk"]),
        float(d["created_at"]),
        float(d["expires_at"]),
        tuple(int(g) for g in d.get("gpus", ())),
        d.get("below_since"),
        d.get("approved_by", ""),
        d.get("approved_at"),
    )


def _learn_to_dict(m: LearnMemory) -> dict[str, Any]:
    return {
        "predictions": {
            n: [p.made_at, p.horizon_s, p.p, [list(x) for x in p.parts], [list(x) for x in p.gpu_buckets]]
            for n, p in sorted(m.predictions.items())
        },
        "next_due": m.next_due,
        "bin_count": list(m.bin_count),
        "bin_p": list(m.bin_p),
        "bin_y": list(m.bin_y),
        "brier_sum": m.brier_sum,
        "resolved": m.resolved,
        "observed": dict(sorted(m.observed.items())),
        "expected": dict(sorted(m.expected.items())),
        "multipliers": dict(sorted(m.multipliers.items())),
    }


def _learn_from_dict(d: Mapping[str, Any]) -> LearnMemory:
    preds = {
        n: Prediction(
            n,
            float(t),
            float(h),
            float(p),
            tuple((b, float(e)) for b, e in parts),
            tuple((int(i), b) for i, b in gb),
        )
        for n, (t, h, p, parts, gb) in d.get("predictions", {}).items()
    }
    return LearnMemory(
        preds,
        d.get("next_due"),
        tuple(int(c) for c in d.get("bin_count", ())),
        tuple(float(x) for x in d.get("bin_p", ())),
        tuple(float(x) for x in d.get("bin_y", ())),
        float(d.get("brier_sum", 0.0)),
        int(d.get("resolved", 0)),
        {k: float(v) for k, v in d.get("observed", {}).items()},
        {k: float(v) for k, v in d.get("expected", {}).items()},
        {k: float(v) for k, v in d.get("multipliers", {}).items()},
    )


EMPTY_MAPPING: Mapping[str, Any] = MappingProxyType({})


def _reclaim_from_dict(d: Mapping[str, Any]) -> ReclaimMemory:
    return ReclaimMemory(
        tuple((int(j), float(t)) for j, t in d.get("blocked", ())),
        tuple((str(n), int(j), float(t)) for n, j, t in d.get("walls", ())),
        tuple((int(j), float(t)) for j, t in d.get("requeued", ())),
        tuple((int(j), float(t)) for j, t in d.get("served", ())),
    )
