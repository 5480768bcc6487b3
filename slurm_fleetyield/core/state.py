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

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from slurm_fleetyield.core.lifecycle import Cause, LifecycleMemory, Stage
from slurm_fleetyield.core.model import FatalEvent, Tier, fast_init

STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)

Counters = tuple[float | None, ...]  # one value per channel of ``ControllerState.layout``; None: not exported


@fast_init
@dataclass(frozen=True, slots=True)
class NodeMemory:
    """Per-node memory: last decided tier and why, who drained it, and its fatal history."""

    tier: Tier
    since: float  # when it entered ``tier``
    reason: str
    drained_by_us: bool = False
    fatal_history: tuple[tuple[float, str], ...] = ()  # (time, GPU uuid or "" for node-wide), oldest first
    last_xid: int | None = None  # of the last quarantine
    last_gpu: int | None = None
    fy_features: tuple[str, ...] = ()  # last fy_ features decided on fresh data (kept while UNKNOWN)
    weight: int | None = None  # last weight decided on fresh data

    @property
    def fatal_times(self) -> tuple[float, ...]:
        return tuple(t for t, _ in self.fatal_history)


@fast_init
@dataclass(frozen=True, slots=True)
class GpuHistory:
    """Trend memory of one GPU. Values are reset-adjusted: a counter that went down (driver reload, agent
    restart) is treated as restarted from zero, so adjusted values never decrease and window growth is a
    plain subtraction."""

    last_time: float
    last_raw: Counters
    last_adj: Counters
    times: tuple[float, ...] = ()  # ring of stored points, oldest first, spaced >= history_resolution_s
    points: tuple[Counters, ...] = ()


@fast_init
@dataclass(frozen=True, slots=True)
class GpuTrack:
    """Compact trend memory of one GPU inside a ``NodeHistory`` (the node holds ``last_time`` and the ring of
    times): the stored points as run-length ``steps``, ``(time, point)`` wherever the stored point changed,
    the first one at or before the GPU's first ring time. A GPU whose counters did not move keeps the very
    same object from tick to tick (nothing to rebuild, nothing new for the garbage collector)."""

    last_raw: Counters
    last_adj: Counters
    steps: tuple[tuple[float, Counters], ...]

    def ring(self, node_times: tuple[float, ...]) -> tuple[float, ...]:
        """This GPU's ring of times: the node's, from the GPU's first stored point on."""
        first = self.steps[0][0]
        if first <= node_times[0]:
            return node_times
        return node_times[bisect_left(node_times, first) :]

    def points(self, times: tuple[float, ...]) -> tuple[Counters, ...]:
        steps = self.steps
        if len(steps) == 1:
            return (steps[0][1],) * len(times)
        out = []
        k, last = 0, len(steps) - 1
        for t in times:
            while k < last and steps[k + 1][0] <= t:
                k += 1
            out.append(steps[k][1])
        return tuple(out)

    def history(self, last_time: float, node_times: tuple[float, ...]) -> GpuHistory:
        times = self.ring(node_times)
        return GpuHistory(last_time, self.last_raw, self.last_adj, times, self.points(times))


class NodeHistory(Mapping[str, GpuHistory]):
    """The trend memory of one node's GPUs, as the sense stage keeps it: one ring of times for the node and a
    ``GpuTrack`` per GPU that follows it (a GPU that does not, e.g. one that appeared between two stored
    points, is kept as its own ``GpuHistory``). Reads as ``uuid -> GpuHistory`` like a plain mapping.

    ``quiet`` (not persisted, not compared): ``(readings, sensed)`` when every GPU of the last sample was
    quiet (no counter moved, nothing grew within the longest window, every track kept): a next sample
    carrying the very same readings tuple senses to the very same ``sensed`` GPUs and keeps every track, so
    the sense stage reuses them without looking at a GPU (the simulator reuses unchanged readings)."""

    __slots__ = ("gpus", "last_time", "quiet", "times")

    def __init__(
        self,
        last_time: float,
        times: tuple[float, ...],
        gpus: Mapping[str, GpuTrack | GpuHistory],
        quiet: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None,
    ) -> None:
        self.last_time = last_time
        self.times = times
        self.gpus = gpus
        self.quiet = quiet

    def __getitem__(self, uuid: str) -> GpuHistory:
        g = self.gpus[uuid]
        if isinstance(g, GpuTrack):
            return g.history(self.last_time, self.times)
        return g

    def __iter__(self) -> Iterator[str]:
        return iter(self.gpus)

    def __len__(self) -> int:
        return len(self.gpus)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self.gpus

    def __repr__(self) -> str:
        return f"NodeHistory({dict(self)!r})"

    @staticmethod
    def of(last_time: float, histories: Mapping[str, GpuHistory]) -> Mapping[str, GpuHistory]:
        """The compact form of per-GPU histories sampled at ``last_time`` (the plain mapping if none was)."""
        rings = [h.times for h in histories.values() if h.last_time == last_time and h.times]
        if not rings:
            return histories
        times = max(rings, key=len)
        n = len(times)
        gpus: dict[str, GpuTrack | GpuHistory] = {}
        for uuid, h in histories.items():
            m = len(h.times)
            if h.last_time == last_time and 0 < m <= n and times[n - m :] == h.times:
                steps: list[tuple[float, Counters]] = []
                for t, p in zip(h.times, h.points, strict=True):
                    if not steps or steps[-1][1] != p:
                        steps.append((t, p))
                gpus[uuid] = GpuTrack(h.last_raw, h.last_adj, tuple(steps))
            else:
                gpus[uuid] = h
        return NodeHistory(last_time, times, gpus)


Clock = tuple[float, tuple[float, ...]]
"""A compact node history's time: (``last_time``, ring of times). Nodes sampled together share one."""


class NodeTracks:
    """``NodeHistory`` without its time (``gpus`` and ``quiet``, the same meaning): what of a node's trend
    memory a quiet sample leaves as it was, so the sense stage keeps the very object (its time is kept
    apart, in ``FleetHistory.clocks``)."""

    __slots__ = ("gpus", "quiet")

    def __init__(
        self,
        gpus: Mapping[str, GpuTrack | GpuHistory],
        quiet: tuple[tuple[Any, ...], tuple[Any, ...]] | None = None,
    ) -> None:
        self.gpus = gpus
        self.quiet = quiet


class FleetHistory(Mapping[str, Mapping[str, GpuHistory]]):
    """``ControllerState.history`` as the sense stage builds it: per node, either ``NodeTracks`` with its
    ``Clock`` in ``clocks`` (read back as the ``NodeHistory`` they make together, built on demand) or a plain
    ``uuid -> GpuHistory`` mapping. A quiet node's tracks are the same object from tick to tick; only its
    clock moves, and the clock object is shared by every node sampled at the same times."""

    __slots__ = ("clocks", "tracks")

    def __init__(
        self,
        tracks: Mapping[str, NodeTracks | Mapping[str, GpuHistory]],
        clocks: Mapping[str, Clock],
    ) -> None:
        self.tracks = tracks
        self.clocks = clocks

    def __getitem__(self, node: str) -> Mapping[str, GpuHistory]:
        h = self.tracks[node]
        if type(h) is NodeTracks:
            last, times = self.clocks[node]
            return NodeHistory(last, times, h.gpus, h.quiet)
        return h  # type: ignore[return-value]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tracks)

    def __len__(self) -> int:
        return len(self.tracks)

    def __contains__(self, node: object) -> bool:
        return node in self.tracks

    def __repr__(self) -> str:
        return f"FleetHistory({dict(self)!r})"


@dataclass(frozen=True, slots=True)
class OpenProposal:
    """A drain proposal the gate made and no one has decided yet (one per node at most)."""

    proposal_id: str
    node: str
    risk: float  # at proposal time
    created_at: float
    expires_at: float
    gpus: tuple[int, ...] = ()
    below_since: float | None = None  # risk under min_risk_to_keep_open since (withdrawal hysteresis)
    approved_by: str = ""  # approved, drain not yet executed (held by a cap): retried every tick
    approved_at: float | None = None


@dataclass(frozen=True, slots=True)
class Denial:
    """An admin said no: not proposed again before ``time + cooldown`` unless risk > ``risk + margin``."""

    proposal_id: str
    time: float
    risk: float


@dataclass(frozen=True, slots=True)
class SettleMemory:
    """What settle needs across ticks: job ids already settled (oldest first, bounded) and the intervals
    during which premium-needing work was pending (``(start, end)``; the last one is open when ``end`` is
    None)."""

    settled: tuple[int, ...] = ()
    pending: tuple[tuple[float, float | None], ...] = ()


@dataclass(frozen=True, slots=True)
class PremiumMemory:
    """Premium widening (core/premium.py): premium nodes lent fy_ok_decode (sorted), since when decode has
    been waiting without a break (None: not waiting), and when it last waited (the return hysteresis)."""

    lent: tuple[str, ...] = ()
    waiting_since: float | None = None
    last_waiting: float | None = None
    gang_nodes: int = 0  # nodes of the largest premium-needing job seen lately (sizes the reserve)
    gang_seen: float | None = None  # when a job of that size was last seen
    claims: tuple[tuple[int, float], ...] = ()  # (pending premium job id, since when it claims), by id


@dataclass(frozen=True, slots=True)
class ReclaimMemory:
    """Premium reclaim (core/reclaim.py): pending premium jobs blocked only by batch on premium GPUs (job id,
    since when), walled nodes (node, premium job id it was reclaimed for, since when) and batch jobs requeued
    (job id, when; for the cooldown). Each sorted."""

    blocked: tuple[tuple[int, float], ...] = ()
    walls: tuple[tuple[str, int, float], ...] = ()
    requeued: tuple[tuple[int, float], ...] = ()
    served: tuple[tuple[int, float], ...] = ()  # premium jobs reclaim acted for (id, when), for the cooldown


@dataclass(frozen=True, slots=True)
class Prediction:
    """One open prediction: P(fatal within ``horizon_s``) = ``p`` made at ``made_at`` for ``node``.

    ``parts`` splits the UN-adjusted (raw model) expected events by signal bucket (``base`` or the dominant
    signal of a GPU); ``gpu_buckets`` names the bucket of each GPU that had signals (others: ``base``), so an
    event on a known GPU is attributed to its bucket."""

    node: str
    made_at: float
    horizon_s: float
    p: float
    parts: tuple[tuple[str, float], ...] = ()
    gpu_buckets: tuple[tuple[int, str], ...] = ()

    @property
    def due(self) -> float:
        return self.made_at + self.horizon_s


@dataclass(frozen=True, slots=True)
class LearnMemory:
    """Open predictions (one per node), the reliability table's sums and the Poisson-Gamma evidence."""

    predictions: Mapping[str, Prediction] = field(default_factory=dict)
    next_due: float | None = None  # earliest due of the open predictions (skip the scan before it)
    bin_count: tuple[int, ...] = ()
    bin_p: tuple[float, ...] = ()  # sum of predicted p per bin
    bin_y: tuple[float, ...] = ()  # number of events per bin
    brier_sum: float = 0.0
    resolved: int = 0
    observed: Mapping[str, float] = field(default_factory=dict)  # bucket -> events (fractional if shared)
    expected: Mapping[str, float] = field(default_factory=dict)  # bucket -> raw expected events
    multipliers: Mapping[str, float] = field(default_factory=dict)  # bucket -> learned hazard multiplier


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
    # Not persisted, not compared: per-node results of the last tick keyed by the very input objects they
    # were computed from (stage -> node -> entry), so a stage can hand back an unchanged node's result
    # instead of recomputing it. Carried from tick to tick by ``core.loop``; an empty memo (a restored state)
    # only costs time. Entries are pure functions of their keys, so sharing it between states is harmless.
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


def sorted_names(memo: dict[str, Any] | None, *maps: Mapping[str, object]) -> list[str]:
    """Every key of ``maps``, sorted: a stage's node order. ``memo`` (an entry of ``ControllerState.memo``)
    keeps the answer while every map has the same keys in the same order, the common case from tick to tick;
    the list handed back is shared: read it, never change it."""
    if memo is None:
        return sorted(set().union(*maps))
    key = tuple(tuple(m) for m in maps)
    if memo.get("keys") != key:
        memo["keys"], memo["names"] = key, sorted(set().union(*maps))
    names: list[str] = memo["names"]
    return names


_ABSENT = object()


def changed_keys(
    new: Mapping[str, object], old: Mapping[str, object], memo: dict[str, Any] | None = None
) -> set[str]:
    """The keys whose value in ``new`` is not the very object it is in ``old``, and the keys only one of them
    has: what a stage that starts from its last answer must look at again (the values are frozen, so the
    same object is the same value). One C-level pass over ``new``; ``old`` is read again only when it has a
    key ``new`` lacks. ``memo`` (``ControllerState.memo``): where a stage that built ``new`` from ``old``
    noted the answer (``note_changes``), it is handed back without a pass."""
    if new is old:
        return set()
    if memo is not None:
        for n, o, keys in memo.get("changes", {}).values():
            if n is new and o is old:
                return set(keys)
    get = old.get
    out = {k for k, v in new.items() if get(k, _ABSENT) is not v}
    if len(old) != len(new) - sum(1 for k in out if k not in old):  # old has keys new lacks
        out.update(k for k in old if k not in new)
    return out


def note_changes(
    memo: dict[str, Any],
    stage: str,
    new: Mapping[str, object],
    old: Mapping[str, object] | None,
    todo: Iterable[str] = (),
) -> None:
    """Note, for ``changed_keys``, the keys in which ``stage``'s answer ``new`` differs from ``old``, when
    ``new`` was built as a copy of ``old`` with only the keys ``todo`` set again (the same keys: the stage
    carried its last answer); ``old`` None: the stage did not carry (its note is dropped). Only
    ``todo`` is compared, so a consumer's diff of the two costs the stage's work, not the fleet's. The note
    holds both mappings, so an identity match can never be a recycled ``id``."""
    notes = memo.setdefault("changes", {})
    if old is None or len(new) != len(old):
        notes.pop(stage, None)
        return
    get = old.get
    notes[stage] = (new, old, frozenset(k for k in todo if new.get(k, _ABSENT) is not get(k, _ABSENT)))


def slurm_view(memo: dict[str, Any] | None, obs: Any) -> dict[str, Any]:
    """This tick's copy of Slurm's node view (the shell's mapping may be updated in place from tick to tick:
    the simulator's is), made once per ``Observations`` and shared by the stages that carry their last
    answer (profile, price, route); its changes against last tick's copy are noted once (``note_changes``).
    ``memo`` None: a fresh copy."""
    if memo is None:
        return dict(obs.slurm)
    hit = memo.get("slurm_view")
    if hit is not None and hit[0] is obs:
        snapshot: dict[str, Any] = hit[1]
        return snapshot
    snapshot = dict(obs.slurm)
    if hit is not None:
        last = hit[1]
        memo.setdefault("changes", {})["slurm"] = (snapshot, last, frozenset(changed_keys(snapshot, last)))
    memo["slurm_view"] = (obs, snapshot)
    return snapshot
