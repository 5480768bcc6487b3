"""Sense: turn one tick's raw samples into fresh-or-UNKNOWN nodes with per-GPU counter trends.

Input: ``Observations`` (Slurm view, node samples), the previous ``ControllerState`` (GPU history), ``now``.
Output: ``Sensed``: one ``SensedNode`` per node known to Slurm or sampled, and the updated, bounded history.

A node is UNKNOWN when it has no sample, its scrape failed, or its newest sample is older than
``stale_after_s``: no data is not evidence, so UNKNOWN never reads as healthy or as bad. Only a fresh,
successful sample can reveal a missing GPU (fewer GPUs than the agent's ``expected_gpus`` or Slurm's Gres
count).

Trends: counters are reset-adjusted (a decrease is a restart from zero, never a negative rate) and stored as
a ring of points at least ``history_resolution_s`` apart, trimmed to the longest window. A window's per-hour
rate is growth since the oldest point inside the window divided by the window length (never by a shorter
span), so a short history under-estimates a rate instead of inflating one event into a burst.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_fleetyield.core.model import GpuReading, Health, LogEvent, NodeSample, Observations
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.signals import COUNTER_CHANNELS
from slurm_fleetyield.core.state import Counters, GpuHistory


@dataclass(frozen=True, slots=True)
class SensedGpu:
    reading: GpuReading
    raw: Counters  # current value per channel (None: not exported)
    rates: tuple[float, ...] | None  # per-hour rate per channel, largest over the windows; None: no growth
    growth: tuple[float, ...] | None  # growth per channel over the longest window; None: no growth at all
    new_xids: tuple[tuple[int, float], ...] = ()  # (xid, count) grown since the previous sample
    baseline: bool = False  # first sample of this GPU: no trend yet, counts seen are not "new"


@dataclass(frozen=True, slots=True)
class SensedNode:
    node: str
    health: Health  # OK: fresh usable data (not a verdict on the GPUs); UNKNOWN: no usable data
    reason: str
    sample_time: float | None
    stale_s: float | None  # age of the newest sample, None: never sampled
    gpus: tuple[SensedGpu, ...] = ()
    expected_gpus: int | None = None

    @property
    def fresh(self) -> bool:
        return self.health is not Health.UNKNOWN

    @property
    def missing_gpus(self) -> int:
        if not self.fresh or self.expected_gpus is None:
            return 0
        return max(0, self.expected_gpus - len(self.gpus))


@dataclass(frozen=True, slots=True)
class Sensed:
    nodes: Mapping[str, SensedNode]
    history: Mapping[str, Mapping[str, GpuHistory]]
    layout: tuple[str, ...]
    events: tuple[LogEvent, ...] = ()


def sense(
    obs: Observations,
    history: Mapping[str, Mapping[str, GpuHistory]],
    old_layout: tuple[str, ...],
    layout: tuple[str, ...],
    params: SenseParams,
    now: float,
) -> Sensed:
    events: list[LogEvent] = []
    if old_layout and old_layout != layout:
        # The tracked XIDs changed (config edit): old points do not line up with the new channels.
        events.append(LogEvent(now, "", "history_reset", "tracked channels changed; GPU history restarted"))
        history = {}
    tracker = _Tracker(layout, params, now)
    nodes: dict[str, SensedNode] = {}
    new_history: dict[str, Mapping[str, GpuHistory]] = {}
    for name in sorted(set(obs.slurm) | set(obs.samples)):
        sample = obs.samples.get(name)
        old = history.get(name, {})
        unknown = _unknown_reason(sample, params.stale_after_s, now)
        if unknown is not None:
            age = None if sample is None else now - sample.time
            nodes[name] = SensedNode(
                name, Health.UNKNOWN, unknown, None if sample is None else sample.time, age
            )
            if old:
                new_history[name] = old  # keep the trend; the node may come back
            continue
        assert sample is not None
        slurm = obs.slurm.get(name)
        expected = max(sample.expected_gpus or 0, slurm.gpu_count if slurm else 0) or None
        gpus, node_hist = tracker.node(sample, old)
        new_history[name] = node_hist
        nodes[name] = SensedNode(
            name, Health.OK, "fresh sample", sample.time, now - sample.time, gpus, expected
        )
    return Sensed(nodes, new_history, layout, tuple(events))


def _unknown_reason(sample: NodeSample | None, stale_after_s: float, now: float) -> str | None:
    if sample is None:
        return "no sample"
    if sample.error:
        return f"scrape failed: {sample.error}"
    age = now - sample.time
    if age > stale_after_s:
        return f"sample is {age:.0f}s old (stale after {stale_after_s:.0f}s)"
    return None


class _Tracker:
    """Per-tick constants of the trend computation, so the per-GPU loop does no lookups it can hoist."""

    def __init__(self, layout: tuple[str, ...], params: SenseParams, now: float) -> None:
        self.now = now
        self.n_counters = len(COUNTER_CHANNELS)
        self.counter_names = layout[: self.n_counters]
        self.xids = tuple(int(c.split(":", 1)[1]) for c in layout[self.n_counters :])
        self.xid_slots = tuple(range(self.n_counters, len(layout)))
        self.windows = params.trend_windows_s
        self.longest = params.longest_window_s
        self.resolution = params.history_resolution_s

    def node(
        self, sample: NodeSample, old: Mapping[str, GpuHistory]
    ) -> tuple[tuple[SensedGpu, ...], Mapping[str, GpuHistory]]:
        t = sample.time
        out: list[SensedGpu] = []
        hist: dict[str, GpuHistory] = {}
        names = self.counter_names
        xids = self.xids
        for reading in sample.gpus:
            get = reading.fields.get
            xget = reading.xid_totals.get
            # An XID never seen has total 0 (agents export the ones they saw), so its first occurrence counts.
            raw = (*[get(n) for n in names], *[xget(x, 0.0) for x in xids])
            prev = old.get(reading.uuid)
            if prev is None:
                h = GpuHistory(t, raw, raw, (t,), (raw,))
                out.append(SensedGpu(reading, raw, None, None, (), True))
                hist[reading.uuid] = h
                continue
            if t <= prev.last_time:  # the same sample again: nothing new, trends as last computed
                adj, h, new_xids = prev.last_adj, prev, ()
            else:
                adj = prev.last_adj if raw == prev.last_raw else _adjust(raw, prev.last_raw, prev.last_adj)
                new_xids = self._grown_xids(adj, prev.last_adj) if adj is not prev.last_adj else ()
                h = self._append(prev, t, raw, adj)
            rates, growth = self._trend(adj, t, prev)
            out.append(SensedGpu(reading, raw, rates, growth, new_xids, False))
            hist[reading.uuid] = h
        return tuple(out), hist

    def _grown_xids(self, adj: Counters, last: Counters) -> tuple[tuple[int, float], ...]:
        grown = []
        for slot, xid in zip(self.xid_slots, self.xids, strict=True):
            a, b = adj[slot], last[slot]
            if a is not None and b is not None and a > b:
                grown.append((xid, a - b))
        return tuple(grown)

    def _append(self, prev: GpuHistory, t: float, raw: Counters, adj: Counters) -> GpuHistory:
        times, points = prev.times, prev.points
        if not times or t - times[-1] >= self.resolution:
            times, points = (*times, t), (*points, adj)
            cut = bisect_left(times, t - self.longest)
            if cut:
                times, points = times[cut:], points[cut:]
        return GpuHistory(t, raw, adj, times, points)

    def _trend(
        self, adj: Counters, t: float, prev: GpuHistory
    ) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
        times, points = prev.times, prev.points
        if not times:
            return None, None
        # Fast path: nothing grew since the oldest point of the longest window (the common, healthy case).
        i_long = bisect_left(times, t - self.longest)
        base_long = points[min(i_long, len(points) - 1)]
        if adj == base_long:
            return None, None
        # Only channels that moved within the longest window can have a non-zero rate in any shorter one.
        moved = [
            c
            for c, (a, b) in enumerate(zip(adj, base_long, strict=True))
            if a != b and a is not None and b is not None
        ]
        zeros = [0.0] * len(adj)
        rates = zeros[:]
        growth = zeros
        for c in moved:
            growth[c] = adj[c] - base_long[c]  # type: ignore[operator]
        for w in self.windows:
            i = bisect_left(times, t - w)
            if i >= len(times):
                i = len(times) - 1
            base_t = times[i]
            if base_t >= t:
                continue
            per_hour = 3600.0 / max(w, t - base_t)
            base = points[i]
            for c in moved:
                b = base[c]
                if b is None:
                    continue
                r = (adj[c] - b) * per_hour  # type: ignore[operator]
                if r > rates[c]:
                    rates[c] = r
        return tuple(rates), tuple(growth)


def _adjust(raw: Counters, last_raw: Counters, last_adj: Counters) -> Counters:
    """Reset-adjusted cumulative values: a counter that went down restarted from zero (driver reload)."""
    out: list[float | None] = []
    for r, lr, la in zip(raw, last_raw, last_adj, strict=True):
        if r is None:
            out.append(la)  # not exported this time: keep the last known adjusted value
        elif la is None or lr is None:
            out.append(r)  # first time this channel appears: it becomes its own baseline
        elif r >= lr:
            out.append(la + (r - lr))
        else:
            out.append(la + r)
    return tuple(out)
