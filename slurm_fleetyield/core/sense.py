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

Time is kept apart from what a sample brings: ``Sensed.times`` holds each node's sample time, and the
history (``FleetHistory``) each compact node's clock. A quiet node (no counter moved, nothing grew within
the longest window) sampled again with the very same readings keeps its very ``SensedNode`` and tracks;
only its clock moves. When every node is sampled at one time (the simulator), ``_quick`` senses only the
nodes whose readings or GPU counts changed, or that were not quiet, with C-level passes over the rest
(tests/core/test_sense_quick.py checks it against a full pass).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from operator import add, attrgetter, ge, is_not, itemgetter, ne, sub
from typing import Any

from slurm_fleetyield.core.model import (
    FleetScrape,
    GpuReading,
    Health,
    LogEvent,
    NodeSample,
    Observations,
    SlurmNode,
    fast_init,
    fast_new,
)
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.signals import COUNTER_CHANNELS
from slurm_fleetyield.core.state import (
    Clock,
    Counters,
    FleetHistory,
    GpuHistory,
    GpuTrack,
    NodeHistory,
    NodeTracks,
    changed_keys,
    slurm_view,
    sorted_names,
)


@fast_init
@dataclass(frozen=True, slots=True)
class SensedGpu:
    reading: GpuReading
    raw: Counters  # current value per channel (None: not exported)
    rates: tuple[float, ...] | None  # per-hour rate per channel, largest over the windows; None: no growth
    growth: tuple[float, ...] | None  # growth per channel over the longest window; None: no growth at all
    new_xids: tuple[tuple[int, float], ...] = ()  # (xid, count) grown since the previous sample
    baseline: bool = False  # first sample of this GPU: no trend yet, counts seen are not "new"


@fast_init
@dataclass(frozen=True, slots=True)
class SensedNode:
    node: str
    health: Health  # OK: fresh usable data (not a verdict on the GPUs); UNKNOWN: no usable data
    reason: str
    gpus: tuple[SensedGpu, ...] = ()
    expected_gpus: int | None = None

    @property
    def fresh(self) -> bool:
        return self.health is not Health.UNKNOWN

    @property
    def missing_gpus(self) -> int:
        if self.health is Health.UNKNOWN:  # not fresh: no evidence of a missing GPU
            return 0
        return missing(self.expected_gpus, len(self.gpus))


# the constructors of the two types sense builds once per node / GPU per tick (model.fast_new)
_new_node: Callable[..., SensedNode] = fast_new(SensedNode)
_new_gpu: Callable[..., SensedGpu] = fast_new(SensedGpu)


_NO_NODES: Mapping[str, SensedNode] = {}


def missing(expected: int | None, visible: int) -> int:
    """GPUs missing from a fresh sample: how many fewer are visible than expected (none when nothing is)."""
    return 0 if expected is None or visible >= expected else expected - visible


@dataclass(frozen=True, slots=True)
class Sensed:
    nodes: Mapping[str, SensedNode]
    history: Mapping[str, Mapping[str, GpuHistory]]
    layout: tuple[str, ...]
    events: tuple[LogEvent, ...] = ()
    # The fresh nodes with a GPU whose XID counts grew or with fewer GPUs than expected, by name: the only
    # ones where quarantine.find_fatal can find scrape evidence. None: not indexed (look at every node).
    flagged: tuple[str, ...] | None = None
    # Against ``since`` (an earlier tick's ``nodes``, with the same names in the same order): the nodes whose
    # SensedNode is another object or whose sample age moved. Every other node is fresh in both, the very
    # same SensedNode (same GPU objects) and as old, so a stage that read only those from it may hand back
    # its answer for ``since`` (core/risk.py). None: not known.
    changed: tuple[str, ...] | None = None
    since: Mapping[str, SensedNode] | None = None
    # The time of every node's newest sample (fresh or not; none: never sampled), and the tick's time. The
    # time lives here, not in ``SensedNode``, so a node whose sample brought nothing new keeps its very
    # SensedNode from tick to tick.
    times: Mapping[str, float] = field(default_factory=dict)
    now: float = 0.0

    def sample_time(self, node: str) -> float | None:
        """When ``node``'s newest sample was taken; None: it never was."""
        return self.times.get(node)

    def stale_s(self, node: str) -> float | None:
        """Age of ``node``'s newest sample; None: never sampled."""
        t = self.times.get(node)
        return None if t is None else self.now - t


def sense(
    obs: Observations,
    history: Mapping[str, Mapping[str, GpuHistory]],
    old_layout: tuple[str, ...],
    layout: tuple[str, ...],
    params: SenseParams,
    now: float,
    memo: dict[str, Any] | None = None,
) -> Sensed:
    """``memo``: ``ControllerState.memo`` (kept from tick to tick), where the sorted node names are kept
    while Slurm's and the samples' node names stay the same, in the same order, and the last sensed nodes,
    against which ``Sensed.changed`` is found, and what ``_quick`` needs to sense only the nodes that may
    have changed."""
    events: list[LogEvent] = []
    if old_layout and old_layout != layout:
        # The tracked XIDs changed (config edit): old points do not line up with the new channels.
        events.append(LogEvent(now, "", "history_reset", "tracked channels changed; GPU history restarted"))
        history = {}
    sm = None if memo is None else memo.setdefault("sense", {})
    names = sorted_names(sm, obs.slurm, obs.samples)
    last: _Last | None = sm.get("last") if sm is not None else None
    since = last.nodes if last is not None and last.names is names else None
    run = _Pass(obs, history, params, _Tracker(layout, params, now), now, since, last)
    quick = None
    if since is not None and last is not None and memo is not None:
        quick = _quick(run, names, last, history, layout, memo)
    changed: list[str] | tuple[str, ...]
    if quick is None:
        for name in names:
            run.node(name)
        changed, flagged = run.changed, run.flagged
        keep = _keep(run, names, memo)
    else:
        changed, flagged, keep = quick
    if sm is not None:
        sm["last"] = _Last(names, run.nodes, run.times, now, run.history, params, layout, *keep)
    return Sensed(
        run.nodes,
        run.history,
        layout,
        tuple(events),
        tuple(flagged),
        tuple(changed) if since is not None else None,
        since,
        run.times,
        now,
    )


@dataclass(frozen=True, slots=True)
class _Last:
    """What one ``sense`` call leaves in the memo for the next. When every node was sampled at one time
    (``t``; the simulator's case), also the fast-path index ``_quick`` reads: per node in ``names`` order,
    the readings tuple sensed, and the agents' expected GPU counts (one for all when the samples were a
    ``FleetScrape``); ``slurm``: the Slurm view read (``state.slurm_view``); ``clock``: the clock every
    node outside ``slow`` has; ``slow``: the nodes that must be sensed again even when none of those
    change; ``missing``: the others that are flagged (fewer GPUs than expected). ``t`` None: no index."""

    names: list[str]
    nodes: Mapping[str, SensedNode]
    times: Mapping[str, float]
    now: float
    history: FleetHistory
    params: SenseParams
    layout: tuple[str, ...]
    t: float | None = None
    clock: Clock | None = None
    gpus: list[Any] | None = None
    expected: list[int | None] | int | None = None
    slurm: Mapping[str, SlurmNode] | None = None
    slow: frozenset[str] = frozenset()
    missing: frozenset[str] = frozenset()


_GPUS, _TIME, _ERROR = attrgetter("gpus"), attrgetter("time"), attrgetter("error")
_EXPECTED = attrgetter("expected_gpus")
_NO_INDEX: tuple[Any, ...] = ()


class _Pass:
    """One ``sense`` call's outputs and per-tick constants; ``node(name)`` senses one node into them."""

    __slots__ = (
        "changed",
        "clock_memo",
        "clocks",
        "flagged",
        "history",
        "last_now",
        "last_times",
        "nodes",
        "now",
        "obs",
        "old_clocks",
        "old_tracks",
        "pget",
        "samples",
        "slurms",
        "stale_after_s",
        "times",
        "tracker",
        "tracks",
    )

    def __init__(
        self,
        obs: Observations,
        history: Mapping[str, Mapping[str, GpuHistory]],
        params: SenseParams,
        tracker: _Tracker,
        now: float,
        since: Mapping[str, SensedNode] | None,
        last: _Last | None,
    ) -> None:
        self.obs = obs
        self.old_tracks, self.old_clocks = _split(history)
        self.nodes: dict[str, SensedNode] = {}
        self.tracks: dict[str, NodeTracks | Mapping[str, GpuHistory]] = {}
        self.clocks: dict[str, Clock] = {}
        self.times: dict[str, float] = {}
        self.history = FleetHistory(self.tracks, self.clocks)
        self.changed: list[str] = []
        self.flagged: list[str] = []
        self.samples, self.slurms = obs.samples, obs.slurm
        self.stale_after_s = params.stale_after_s
        self.tracker = tracker
        self.now = now
        self.pget = (since if since is not None else _NO_NODES).get
        self.last_times: Mapping[str, float] = last.times if since is not None and last is not None else {}
        self.last_now = last.now if since is not None and last is not None else now
        # the last clock moved by a quiet node and its successor (nodes sampled together share both)
        self.clock_memo: tuple[Clock | None, float | None, Clock | None] = (None, None, None)

    def set_outputs(
        self,
        nodes: dict[str, SensedNode],
        tracks: dict[str, NodeTracks | Mapping[str, GpuHistory]],
        clocks: dict[str, Clock],
        times: dict[str, float],
    ) -> None:
        self.nodes, self.tracks, self.clocks, self.times = nodes, tracks, clocks, times
        self.history = FleetHistory(tracks, clocks)

    def node(self, name: str) -> None:
        now = self.now
        sample = self.samples.get(name)
        tr = self.old_tracks.get(name)
        if sample is None or sample.error or now - sample.time > self.stale_after_s:
            if sample is not None:
                self.times[name] = sample.time
            self.nodes[name] = _new_node(
                name, Health.UNKNOWN, _unknown_reason(sample, self.stale_after_s, now)
            )
            if tr is not None and (tr.gpus if type(tr) is NodeTracks else tr):
                self.tracks[name] = tr  # keep the trend; the node may come back
                if type(tr) is NodeTracks:
                    self.clocks[name] = self.old_clocks[name]
            self.changed.append(name)
            return
        t = self.times[name] = sample.time
        slurm = self.slurms.get(name)
        count = sample.expected_gpus or 0  # the larger of the agent's and Slurm's count, None for 0
        if slurm is not None and slurm.gpu_count > count:
            count = slurm.gpu_count
        expected = count or None
        clock = self.old_clocks.get(name)
        if (
            type(tr) is NodeTracks
            and (quiet := tr.quiet) is not None
            and quiet[0] is sample.gpus
            and clock is not None
            and t >= clock[0]
        ):
            # _node_tracks' reuse of a quiet node, inlined: the same tracks, the clock moved on; a quiet
            # node's GPUs moved no counter, so none has new XIDs. The very readings again at the time they
            # were sensed (a second tick at the same time) sense to the same quiet GPUs: _gpu_plain's
            # same-time path would give them again, by value, and rebuild the same tracks.
            gpus = quiet[1]
            c_in, c_t, c_out = self.clock_memo
            if clock is not c_in or t != c_t:
                c_out = (t, self.tracker.timeline(t, clock[1])[0])
                self.clock_memo = (clock, t, c_out)
            self.clocks[name] = c_out  # type: ignore[assignment]
            self.tracks[name] = tr
            new_xids = False
        else:
            gpus, self.tracks[name], new_clock = self.tracker.node(sample, tr, clock)
            if new_clock is not None:
                self.clocks[name] = new_clock
            else:
                self.clocks.pop(name, None)
            new_xids = any(g.new_xids for g in gpus)
        p = self.pget(name)
        if p is not None and p.gpus is gpus and p.health is Health.OK and p.expected_gpus == expected:
            self.nodes[name] = p  # the same node: only its sample's time moved
            if now - t != self.last_now - self.last_times[name]:
                self.changed.append(name)
        else:
            self.nodes[name] = _new_node(name, Health.OK, "fresh sample", gpus, expected)
            self.changed.append(name)
        if new_xids or missing(expected, len(gpus)):  # sn.missing_gpus (fresh), without the property
            self.flagged.append(name)


def _uniform(run: _Pass, names: list[str]) -> tuple[float, list[Any], list[int | None] | int | None] | None:
    """(the one sample time, the readings tuples in ``names`` order, the agents' expected GPU counts: in
    ``names`` order, or one for all from a ``FleetScrape``) when every node has a fresh, successful sample
    taken at the same time and a Slurm view; else None."""
    samples, n = run.samples, len(names)
    if len(samples) != n or len(run.slurms) != n or not n:
        return None  # names is the union of both key sets: equal sizes mean both hold every name
    if type(samples) is FleetScrape:
        if run.now - samples.time > run.stale_after_s:
            return None
        return samples.time, list(map(samples.readings.__getitem__, names)), samples.expected_gpus
    svals = list(map(samples.__getitem__, names))
    times = list(map(_TIME, svals))
    t = times[0]
    if times.count(t) != n or any(map(_ERROR, svals)) or run.now - t > run.stale_after_s:
        return None
    return t, list(map(_GPUS, svals)), list(map(_EXPECTED, svals))


def _fast(run: _Pass, name: str, gpus: Any, clock: Clock) -> bool:
    """Whether ``name``, just sensed, is in ``_Last``'s fast class: quiet tracks whose readings are these,
    fresh with the quiet GPUs, and on ``clock`` (by value; the node then shares the object)."""
    tr = run.tracks.get(name)
    if type(tr) is not NodeTracks or tr.quiet is None or tr.quiet[0] is not gpus:
        return False
    sn = run.nodes[name]
    c = run.clocks.get(name)
    if sn.health is not Health.OK or sn.gpus is not tr.quiet[1] or c is None or c != clock:
        return False
    run.clocks[name] = clock
    return True


def _keep(run: _Pass, names: list[str], memo: dict[str, Any] | None) -> tuple[Any, ...]:
    """``_Last``'s fast-path index after sensing every node (empty when the samples are not uniform)."""
    u = _uniform(run, names) if memo is not None else None
    if u is None:
        return _NO_INDEX
    t, gpus, expected = u
    clock = run.clock_memo[2]
    if clock is None:  # no node took the inline quiet path: any fast-class node's clock will do
        tracks = run.tracks
        for name in names:
            tr = tracks.get(name)
            if type(tr) is NodeTracks and tr.quiet is not None and name in run.clocks:
                clock = run.clocks[name]
                break
        else:
            return _NO_INDEX
    slow, miss = _classify(run, zip(names, gpus, strict=True), clock)
    return t, clock, gpus, expected, slurm_view(memo, run.obs), slow, miss


def _classify(
    run: _Pass, sensed: Iterable[tuple[str, Any]], clock: Clock
) -> tuple[frozenset[str], frozenset[str]]:
    """Of the nodes just sensed ((name, its readings tuple)): those outside the fast class (``_fast``), and
    those in it that are flagged (fewer GPUs than expected): ``_Last.slow`` and ``_Last.missing``."""
    slow, miss = set(), set()
    flagged = set(run.flagged)
    for name, gpus in sensed:
        if not _fast(run, name, gpus, clock):
            slow.add(name)
        elif name in flagged:
            miss.add(name)
    return frozenset(slow), frozenset(miss)


def _quick(
    run: _Pass,
    names: list[str],
    last: _Last,
    history: Mapping[str, Mapping[str, GpuHistory]],
    layout: tuple[str, ...],
    memo: dict[str, Any],
) -> tuple[list[str] | tuple[str, ...], list[str], tuple[Any, ...]] | None:
    """Sense only the nodes that may have changed, when every node is sampled at one time again, after a
    tick that was, over the very history it left and the same params and layout: (changed, flagged, the
    next fast-path index); None: sense every node.

    A node of the last tick's fast class (quiet tracks, fresh, on the common clock) whose readings tuple is
    the very object it was, with the same expected count and a Slurm view that is the very object it was
    or has the same GPU count, is sensed to the very SensedNode, tracks and (moved) common clock as by
    ``_Pass.node``'s quiet path, and flagged as it was (missing GPUs only: a quiet GPU has no new XIDs);
    every other node goes through ``_Pass.node``."""
    if (
        last.t is None
        or last.clock is None
        or last.gpus is None
        or last.slurm is None
        or history is not last.history
        or run.tracker.params is not last.params
        or layout != last.layout
    ):
        return None
    u = _uniform(run, names)
    if u is None:
        return None
    t, gpus, expected = u
    if t < last.t:
        return None
    slow = set(last.slow)
    slow.update(compress(names, map(is_not, gpus, last.gpus)))
    if expected != last.expected:
        if type(expected) is not list or type(last.expected) is not list:
            return None
        slow.update(compress(names, map(ne, expected, last.expected)))
    view = slurm_view(memo, run.obs)
    old_view = last.slurm
    for name in changed_keys(view, old_view, memo):
        a, b = view.get(name), old_view.get(name)
        if a is None or b is None or a.gpu_count != b.gpu_count:
            slow.add(name)
    clock = (t, run.tracker.timeline(t, last.clock[1])[0])
    run.clock_memo = (last.clock, t, clock)
    run.set_outputs(
        dict(last.nodes),
        dict(run.old_tracks),  # type: ignore[arg-type]
        dict.fromkeys(names, clock),
        dict.fromkeys(names, t),
    )
    todo = sorted(slow)  # names order
    for name in todo:
        run.node(name)
    if len(run.tracks) != len(run.old_tracks):  # a node gained a history: keep the names order
        tracks = run.tracks
        run.set_outputs(run.nodes, {n: tracks[n] for n in names if n in tracks}, run.clocks, run.times)
    moved = run.now - t != last.now - last.t  # every node's sample age moved: all changed
    changed: list[str] | tuple[str, ...] = tuple(names) if moved else run.changed
    new_slow, miss = _classify(run, ((n, gpus[bisect_left(names, n)]) for n in todo), clock)
    miss |= last.missing - slow
    flagged = sorted(miss.union(run.flagged))
    return changed, flagged, (t, clock, gpus, expected, view, new_slow, miss)


def _split(
    history: Mapping[str, Mapping[str, GpuHistory]],
) -> tuple[Mapping[str, NodeTracks | Mapping[str, GpuHistory]], Mapping[str, Clock]]:
    """A history's per-node tracks and clocks (``FleetHistory``'s own; any other mapping's, taken apart)."""
    if type(history) is FleetHistory:
        return history.tracks, history.clocks
    tracks: dict[str, NodeTracks | Mapping[str, GpuHistory]] = {}
    clocks: dict[str, Clock] = {}
    for name, h in history.items():
        tracks[name], clock = _compact(h)
        if clock is not None:
            clocks[name] = clock
    return tracks, clocks


def _compact(
    h: Mapping[str, GpuHistory],
) -> tuple[NodeTracks | Mapping[str, GpuHistory], Clock | None]:
    """A node's history as tracks and clock (a ``NodeHistory``), or as itself with no clock (plain)."""
    if type(h) is NodeHistory:
        return NodeTracks(h.gpus, h.quiet), (h.last_time, h.times)
    return h, None


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
        self.counter_names = layout[: self.n_counters]
        self.xids = tuple(int(c.split(":", 1)[1]) for c in layout[self.n_counters :])
        self.xid_slots = tuple(range(self.n_counters, len(layout)))
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
        return (gpus, *_compact(NodeHistory.of(sample.time, hist)))

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
            steps = prev.steps
            if raw == last_raw:
                raw = last_raw
                adj = prev.last_adj
                new_xids: tuple[tuple[int, float], ...] = ()
                moved = False
            else:
                adj = _adjust(raw, last_raw, prev.last_adj)
                new_xids = self._grown_xids(adj, prev.last_adj)
                moved = True
            if len(steps) == 1 and adj == steps[0][1]:
                # nothing grew within the longest window (the common, healthy case)
                out.append(_new_gpu(reading, raw, None, None, new_xids, False))
            else:
                ring = prev.ring(node_times)
                points = prev.points(ring)
                plan = self.timeline(t, ring)[3]
                assert plan is not None
                base_long = points[plan[0]]
                if adj == base_long:
                    out.append(_new_gpu(reading, raw, None, None, new_xids, False))
                else:
                    rates, growth = self._trend(adj, points, base_long, plan[1])
                    out.append(_new_gpu(reading, raw, rates, growth, new_xids, False))
            if appended:
                if steps[-1][1] is not adj:
                    steps = (*steps, (t, adj))
                if len(steps) > 1 and steps[1][0] <= first_time:
                    k = 1
                    while k + 1 < len(steps) and steps[k + 1][0] <= first_time:
                        k += 1
                    steps = steps[k:]
            if moved or steps is not prev.steps:
                prev = GpuTrack(raw, adj, steps)
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
            return SensedGpu(reading, raw, None, None, (), True), GpuHistory(t, raw, raw, (t,), (raw,))
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
                new_xids = self._grown_xids(adj, last_adj)
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
        rates, growth = self._trend(adj, prev.points, base_long, plan[1])
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

    def _grown_xids(self, adj: Counters, last: Counters) -> tuple[tuple[int, float], ...]:
        n = self.n_counters
        if adj[n:] == last[n:]:  # no XID channel moved (the common case): nothing can have grown
            return ()
        grown = []
        for slot, xid in zip(self.xid_slots, self.xids, strict=True):
            a, b = adj[slot], last[slot]
            if a is not None and b is not None and a > b:
                grown.append((xid, a - b))
        return tuple(grown)

    @staticmethod
    def _trend(
        adj: Counters,
        points: tuple[Counters, ...],
        base_long: Counters,
        steps: tuple[tuple[int, float], ...],
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        # Only channels that moved within the longest window can have a non-zero rate in any shorter one.
        # A window's per-hour rate: growth since its base point / max(window, time since that point).
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
        for i, per_hour in steps:
            base = points[i]
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
        if type(tr) is not GpuTrack or len(tr.steps) != 1 or tr.steps[0][1] is not tr.last_adj:
            return None
    return readings, sensed


def _adjust(raw: Counters, last_raw: Counters, last_adj: Counters) -> Counters:
    """Reset-adjusted cumulative values: a counter that went down restarted from zero (driver reload).

    Per channel: not exported now (None) keeps the last adjusted value; appearing for the first time makes the
    value its own baseline; growth adds to the adjusted value; a decrease restarts from zero.

    The common case (every channel exported before and now, none decreased) is the third rule on every
    channel, ``la + (r - lr)``, evaluated by ``map`` over C-level operators: the same arithmetic, the same
    bits."""
    if (
        None not in raw
        and None not in last_raw
        and None not in last_adj
        # NaN compares False: such a value takes the general path
        and all(map(ge, raw, last_raw))  # type: ignore[arg-type]
    ):
        return tuple(map(add, last_adj, map(sub, raw, last_raw)))
    return tuple(
        [
            la if r is None else r if la is None or lr is None else la + (r - lr) if r >= lr else la + r
            for r, lr, la in zip(raw, last_raw, last_adj, strict=True)
        ]
    )
