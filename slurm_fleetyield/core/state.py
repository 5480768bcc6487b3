"""What the controller remembers between ticks.

Input: the previous ``ControllerState`` (or ``ControllerState.empty()``). Output: the next one, built by the
stages and returned in ``TickResult.state``. The store persists it every tick via ``to_dict()`` (JSON-safe,
round-trip exact, versioned) and restores it with ``from_dict()``. Everything here is bounded: GPU history is
trimmed to the longest trend window, fatal history to ``fatal_history_days``, drain times to the rate window,
processed event ids to ``max_processed_event_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from slurm_fleetyield.core.model import Tier, fast_init

STATE_VERSION = 1

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
    last_sample_time: float | None = None
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


@dataclass(frozen=True, slots=True)
class ControllerState:
    nodes: Mapping[str, NodeMemory] = field(default_factory=dict)
    history: Mapping[str, Mapping[str, GpuHistory]] = field(default_factory=dict)  # node -> GPU uuid -> ...
    layout: tuple[str, ...] = ()  # channel names of every Counters tuple in ``history``
    drain_times: tuple[float, ...] = ()  # our recent drains, for the per-window rate cap
    processed_events: tuple[str, ...] = ()  # fatal event ids already acted on, oldest first (bounded)
    last_tick: float | None = None
    version: int = STATE_VERSION

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
            "nodes": {name: _memory_to_dict(m) for name, m in sorted(self.nodes.items())},
            "history": {
                node: {uuid: _history_to_dict(h) for uuid, h in sorted(gpus.items())}
                for node, gpus in sorted(self.history.items())
            },
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> ControllerState:
        version = data.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"controller state version {version!r} is not supported (expected {STATE_VERSION})"
            )
        return ControllerState(
            nodes={name: _memory_from_dict(m) for name, m in data.get("nodes", {}).items()},
            history={
                node: {uuid: _history_from_dict(h) for uuid, h in gpus.items()}
                for node, gpus in data.get("history", {}).items()
            },
            layout=tuple(data.get("layout", ())),
            drain_times=tuple(float(t) for t in data.get("drain_times", ())),
            processed_events=tuple(data.get("processed_events", ())),
            last_tick=data.get("last_tick"),
            version=version,
        )

    def __eq__(self, other: object) -> bool:  # mappings compare by content, whatever their concrete type
        if not isinstance(other, ControllerState):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


def _memory_to_dict(m: NodeMemory) -> dict[str, Any]:
    return {
        "tier": m.tier.value,
        "since": m.since,
        "reason": m.reason,
        "drained_by_us": m.drained_by_us,
        "fatal_history": [[t, u] for t, u in m.fatal_history],
        "last_sample_time": m.last_sample_time,
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
        last_sample_time=d.get("last_sample_time"),
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


EMPTY_MAPPING: Mapping[str, Any] = MappingProxyType({})
