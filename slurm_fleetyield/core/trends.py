"""Counter trends of one GPU: reset adjustment, the ring of points, per-window rates.

Input: a fresh ``NodeSample`` and the node's previous trend memory (``NodeTracks`` and its ``Clock``, or a
plain mapping of ``GpuHistory``). Output: one ``SensedGpu`` per GPU and the node's new trend memory.

Counters are reset-adjusted (a decrease is a restart from zero, never a negative rate) and stored as a ring of
points at least ``history_resolution_s`` apart, trimmed to the longest window. The ring keeps the layout's
trended channels only (``signals.trended``): a quarantine XID's total is compared with the last sample's and
nothing more, since no rule reads its window growth. A window's per-hour rate is
growth since the oldest point inside the window divided by the window length (never by a shorter span), so a
short history under-estimates a rate instead of inflating one event into a burst.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter, ne

from slurm_fleetyield.core.model import GpuReading, NodeSample
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.signals import COUNTER_CHANNELS, trended
from slurm_fleetyield.core.state import Clock, Counters, GpuHistory, GpuTrack, NodeHistory, NodeTracks


@dataclass(slots=True)
class SensedGpu:
    """One GPU as sensed this tick. A value, never changed once built; not frozen only for speed
    (tests/core/test_values_stay_unassigned.py)."""

    reading: GpuReading
    raw: Counters  # current value per channel of the layout (None: not exported)
    # per trended channel (the layout's leading ones, ``signals.trended``); None: nothing grew at all
    rates: tuple[float, ...] | None  # per-hour rate, the largest over the windows
    growth: tuple[float, ...] | None  # growth over the longest window
    new_xids: tuple[tuple[int, float], ...] = ()  # (xid, count) grown since the previous sample
    baseline: bool = False  # first sample of this GPU: no trend yet, counts seen are not "new"


def compact(
    h: Mapping[str, GpuHistory],
) -> tuple[NodeTracks | Mapping[str, GpuHistory], Clock | None]:
    """A node's history as tracks and clock (a ``NodeHistory``), or as itself with no clock (plain)."""
    if type(h) is NodeHistory:
        return NodeTracks(h.gpus, h.quiet), (h.last_time, h.times)
    return h, None


class Tracker:
    """Per-tick constants of the trend computation, so the per-GPU loop does no lookups it can hoist.

    GPUs sampled together share their timeline, so everything that depends only on a history's ``times`` (the
    appended and trimmed ring, the window base indices and per-hour divisors) is computed once per distinct
    timeline and reused (``timeline``); equal rings are then shared between GPUs (structure sharing, no
    mutation). The per-GPU work is a tuple build, one comparison with the last raw values and, for a quiet
    GPU, one comparison with the oldest point of the longest window.
    """

    def __init__(self, layout: tuple[str, ...], params: SenseParams, now: float) -> None:
        self.params = params
        self.now = now
        self.n_counters = len(COUNTER_CHANNELS)
        self.n_trended = trended(layout)  # the ring keeps these leading channels; the rest are fatal XIDs
        self.counter_names = layout[: self.n_counters]
        self.xids = tuple(int(c.split(":", 1)[1]) for c in layout[self.n_counters :])
        n_windowed = self.n_trended - self.n_counters
        self.windowed_xids = tuple(
            zip(range(self.n_counters, self.n_trended), self.xids[:n_windowed], strict=True)
        )
        self.fatal_xids = tuple(zip(range(self.n_trended, len(layout)), self.xids[n_windowed:], strict=True))
        self.zero_xids = (0.0,) * len(self.xids)
        self.pick = itemgetter(*self.counter_names)
        self.windows = params.trend_windows_s
        self.longest = params.longest_window_s
        self.resolution = params.history_resolution_s
        # Memo of the last timeline seen: (t, old times) -> (new times, cut, appended, trend plan).
        self._memo_t: float | None = None
        self._memo_src: tuple[float, ...] | None = None
        self._memo: tuple[tuple[float, ...], int, bool, _TrendPlan | None] = ((), 0, False, None)

    def timeline(
        self, t: float, times: tuple[float, ...]
    ) -> tuple[tuple[float, ...], int, bool, _TrendPlan | None]:
        """(times after appending ``t`` and trimming, the cut applied, whether ``t`` was appended, and the
        trend plan over the old ``times``): the same for every GPU whose ring has these times."""
        src = self._memo_src
        if t == self._memo_t and src is not None and (times is src or times == src):
            return self._memo
        appended = not times or t - times[-1] >= self.resolution
        cut = 0
        new_times = times
        if appended:
            new_times = (*times, t)
            cut = bisect_left(new_times, t - self.longest)
            if cut:
                new_times = new_times[cut:]
        plan: _TrendPlan | None = None
        if times:
            n = len(times)
            i_long = bisect_left(times, t - self.longest)
            steps = []
            for w in self.windows:
                i = bisect_left(times, t - w)
                if i >= n:
                    i = n - 1
                base_t = times[i]
                if base_t >= t:
                    continue
                steps.append((i, 3600.0 / max(w, t - base_t)))
            plan = (min(i_long, n - 1), tuple(steps))
        memo = (new_times, cut, appended, plan)
        self._memo_t, self._memo_src, self._memo = t, times, memo
        return memo

    def node(
        self,
        sample: NodeSample,
        old: NodeTracks | Mapping[str, GpuHistory] | None,
        clock: Clock | None,
    ) -> tuple[tuple[SensedGpu, ...], NodeTracks | Mapping[str, GpuHistory], Clock | None]:
        """The sensed GPUs of a fresh sample, and the node's new trend memory: tracks and their clock (None:
        a plain mapping, no clock)."""
        if type(old) is NodeTracks:
            assert clock is not None
            if sample.time > clock[0] and clock[1]:
                return self._node_tracks(sample, old, clock)
            old = NodeHistory(clock[0], clock[1], old.gpus, old.quiet)
        gpus, hist = self._node_plain(sample, old or {})  # type: ignore[arg-type]
        return (gpus, *compact(NodeHistory.of(sample.time, hist)))

    def _raw(self, reading: GpuReading) -> Counters:
        fields = reading.fields
        xt = reading.xid_totals
        try:  # every counter exported (the common case): one C-level lookup
            counters = self.pick(fields)
        except (KeyError, TypeError):
            get = fields.get
            counters = tuple(map(get, self.counter_names))
        if xt:  # an XID never seen has total 0 (agents export the ones they saw): its first occurrence counts
            xget = xt.get
            return (*counters, *[xget(x, 0.0) for x in self.xids])
        return counters + self.zero_xids

    def _node_tracks(
        self, sample: NodeSample, old: NodeTracks, clock: Clock
    ) -> tuple[tuple[SensedGpu, ...], NodeTracks | Mapping[str, GpuHistory], Clock]:
        """``_node_plain`` over the compact node history (same values): a GPU whose counters did not move
        keeps its ``GpuTrack`` object, and a node whose GPUs all did keeps its track mapping."""
        t = sample.time
        node_times = clock[1]
        new_times, _cut, appended, _plan = self.timeline(t, node_times)
        quiet = old.quiet
        if quiet is not None and quiet[0] is sample.gpus:  # same readings, all quiet: same result
            return quiet[1], old, (t, new_times)
        first_time = new_times[0]
        n_new = len(new_times)
        tracks = old.gpus
        tget = tracks.get
        out: list[SensedGpu] = []
        hist: dict[str, GpuTrack | GpuHistory] = {}
        kept = 0
        raw_of = self._raw
        for reading in sample.gpus:
            raw = raw_of(reading)
            uuid = reading.uuid
            prev = tget(uuid)
            if not isinstance(prev, GpuTrack):  # new GPU, or one kept as its own history: the plain path
                g, h = self._gpu_plain(reading, raw, prev, t)
                out.append(g)
                m = len(h.times)
                if h.last_time == t and 0 < m <= n_new and new_times[n_new - m :] == h.times:
                    hist[uuid] = NodeHistory.of(t, {uuid: h}).gpus[uuid]  # type: ignore[attr-defined]
                else:
                    hist[uuid] = h
                continue
            last_raw = prev.last_raw
            starts, points = prev.step_times, prev.step_points
            if raw == last_raw:
                raw = last_raw
                adj = prev.last_adj
                new_xids: tuple[tuple[int, float], ...] = ()
                moved = False
            else:
                adj = _adjust(raw, last_raw, prev.last_adj)
                new_xids = self._grown_xids(raw, last_raw, adj, prev.last_adj)
                moved = True
            if len(points) == 1 and adj == points[0]:
                # nothing grew within the longest window (the common, healthy case)
                out.append(SensedGpu(reading, raw, None, None, new_xids, False))
            else:
                ring = prev.ring(node_times)
                plan = self.timeline(t, ring)[3]
                assert plan is not None
                at = prev.point_at
                base_long = at(ring[plan[0]])
                if adj == base_long:
                    out.append(SensedGpu(reading, raw, None, None, new_xids, False))
                else:
                    bases = [(at(ring[i]), per_hour) for i, per_hour in plan[1]]
                    rates, growth = self._trend(adj, base_long, bases)
                    out.append(SensedGpu(reading, raw, rates, growth, new_xids, False))
            if appended:
                if points[-1] is not adj:
                    starts, points = (*starts, t), (*points, adj)
                if len(starts) > 1 and starts[1] <= first_time:  # keep the last step at or before it
                    k = bisect_right(starts, first_time) - 1
                    starts, points = starts[k:], points[k:]
            if moved or points is not prev.step_points:
                prev = GpuTrack(raw, adj, starts, points)
            else:
                kept += 1
            hist[uuid] = prev
        sensed = tuple(out)
        if kept == len(hist) == len(tracks):
            return sensed, NodeTracks(tracks, _quiet(sample.gpus, sensed, tracks)), (t, new_times)
        return sensed, NodeTracks(hist), (t, new_times)

    def _gpu_plain(
        self, reading: GpuReading, raw: Counters, prev: GpuHistory | None, t: float
    ) -> tuple[SensedGpu, GpuHistory]:
        """One GPU of ``_node_plain``."""
        if prev is None:
            adj = raw[: self.n_trended]
            return SensedGpu(reading, raw, None, None, (), True), GpuHistory(t, raw, adj, (t,), (adj,))
        last_adj = prev.last_adj
        times, cut, appended, plan = self.timeline(t, prev.times)
        new_xids: tuple[tuple[int, float], ...]
        if t <= prev.last_time:
            adj, h, new_xids = last_adj, prev, ()
        else:
            if raw == prev.last_raw:
                adj, new_xids = last_adj, ()
            else:
                adj = _adjust(raw, prev.last_raw, last_adj)
                new_xids = self._grown_xids(raw, prev.last_raw, adj, last_adj)
            if appended:
                points = prev.points
                points = (*points[cut:], adj) if cut else (*points, adj)
            else:
                times, points = prev.times, prev.points
            h = GpuHistory(t, raw, adj, times, points)
        if plan is None:
            return SensedGpu(reading, raw, None, None, new_xids, False), h
        base_long = prev.points[plan[0]]
        if adj == base_long:
            return SensedGpu(reading, raw, None, None, new_xids, False), h
        points = prev.points
        rates, growth = self._trend(adj, base_long, [(points[i], per_hour) for i, per_hour in plan[1]])
        return SensedGpu(reading, raw, rates, growth, new_xids, False), h

    def _node_plain(
        self, sample: NodeSample, old: Mapping[str, GpuHistory]
    ) -> tuple[tuple[SensedGpu, ...], dict[str, GpuHistory]]:
        t = sample.time
        out: list[SensedGpu] = []
        hist: dict[str, GpuHistory] = {}
        oget = old.get
        for reading in sample.gpus:
            g, h = self._gpu_plain(reading, self._raw(reading), oget(reading.uuid), t)
            out.append(g)
            hist[reading.uuid] = h
        return tuple(out), hist

    def _grown_xids(
        self, raw: Counters, last_raw: Counters, adj: Counters, last_adj: Counters
    ) -> tuple[tuple[int, float], ...]:
        """(xid, count) per XID whose total grew since the last sample, by XID: a risk-only XID by its
        adjusted value, a quarantine XID by its raw total (a decrease restarted from zero, so what the
        total shows is new; a total that was not exported last time is its own baseline)."""
        n, k = self.n_counters, self.n_trended
        grown = []
        if adj[n:] != last_adj[n:]:  # no risk-only XID moved (the common case): none of them grew
            for slot, xid in self.windowed_xids:
                a, b = adj[slot], last_adj[slot]
                if a is not None and b is not None and a > b:
                    grown.append((xid, a - b))
        if raw[k:] != last_raw[k:]:  # no quarantine XID's total moved (the common case)
            for slot, xid in self.fatal_xids:
                r, lr = raw[slot], last_raw[slot]
                if r is None or lr is None or r == lr:
                    continue
                count = r - lr if r > lr else r  # a decrease restarted from zero: all of it is new
                if count > 0:
                    grown.append((xid, count))
        grown.sort()
        return tuple(grown)

    @staticmethod
    def _trend(
        adj: Counters, base_long: Counters, bases: list[tuple[Counters, float]]
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per channel: the highest per-hour rate over the windows (``bases``: each window's base point and
        per-hour divisor) and the growth within the longest window (since ``base_long``)."""
        # Only channels that moved within the longest window can have a non-zero rate in any shorter one.
        # A window's per-hour rate: growth since its base point / max(window, time since that point).
        moved = [
            c
            for c in compress(range(len(adj)), map(ne, adj, base_long))
            if adj[c] is not None and base_long[c] is not None
        ]
        zeros = [0.0] * len(adj)
        rates = zeros[:]
        growth = zeros
        for c in moved:
            growth[c] = adj[c] - base_long[c]  # type: ignore[operator]
        for base, per_hour in bases:
            for c in moved:
                b = base[c]
                if b is None:
                    continue
                r = (adj[c] - b) * per_hour  # type: ignore[operator]
                if r > rates[c]:
                    rates[c] = r
        return tuple(rates), tuple(growth)


_TrendPlan = tuple[int, tuple[tuple[int, float], ...]]
"""(index of the longest window's base point, ((base index, per-hour divisor) per usable window))."""


def _quiet(
    readings: tuple[GpuReading, ...],
    sensed: tuple[SensedGpu, ...],
    tracks: Mapping[str, GpuHistory | GpuTrack],
) -> tuple[tuple[GpuReading, ...], tuple[SensedGpu, ...]] | None:
    """``NodeHistory.quiet`` for a node whose tracks were all kept: set only when, fed the same readings
    again, ``_node_tracks`` would take the quiet branch for every GPU and keep every track (one stored point,
    identical to the last adjusted value, so appending a time adds no step), i.e. return ``sensed`` again."""
    for g in sensed:
        if g.rates is not None or g.growth is not None or g.new_xids or g.baseline:
            return None
    for tr in tracks.values():
        if type(tr) is not GpuTrack or len(tr.step_points) != 1 or tr.step_points[0] is not tr.last_adj:
            return None
    return readings, sensed


def _adjust(raw: Counters, last_raw: Counters, last_adj: Counters) -> Counters:
    """Reset-adjusted cumulative values of the trended channels (``last_adj``'s, the leading channels of
    ``raw``): a counter that went down restarted from zero (driver reload).

    Per channel: not exported now (None) keeps the last adjusted value; appearing for the first time makes the
    value its own baseline; unchanged keeps the last adjusted value (the very object, so the points of a
    ring share every channel that did not move); growth adds to the adjusted value; a decrease restarts from
    zero."""
    adj = list(last_adj)
    for c in compress(range(len(adj)), map(ne, raw, last_raw)):  # the channels whose raw value changed
        r, lr, la = raw[c], last_raw[c], adj[c]
        adj[c] = la if r is None else r if la is None or lr is None else la + (r - lr) if r > lr else la + r
    return tuple(adj)
