"""What sense carries from the last call: the nodes sensed again, and the fast path when every node is
sampled at one time (the simulator's ``FleetScrape``).

Input: the tick's observations, the last history and what the last call left (``_Last``, kept in
``ControllerState.memo``, never persisted). Output: ``Sensed``, equal to ``sense.sense``'s (every node's
pass), with ``changed`` and ``since`` set. When every node is sampled at one time, ``quick`` senses only the
nodes whose readings or GPU counts changed or that were not quiet, with C-level passes over the rest.
tests/core/test_sense_quick.py checks it against a full pass.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, is_not, ne
from typing import Any

from slurm_fleetyield.core.model import FleetScrape, Health, Observations, SlurmNode
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.sense import Sensed, relayout
from slurm_fleetyield.core.sense_pass import SensedNode, _Pass
from slurm_fleetyield.core.state import (
    Clock,
    FleetHistory,
    GpuHistory,
    NodeTracks,
    changed_keys,
    slurm_view,
    sorted_names,
)
from slurm_fleetyield.core.trends import Tracker


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
NO_INDEX: tuple[Any, ...] = ()


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


def keep(run: _Pass, names: list[str], memo: dict[str, Any]) -> tuple[Any, ...]:
    """``_Last``'s fast-path index after sensing every node (empty when the samples are not uniform)."""
    u = _uniform(run, names)
    if u is None:
        return NO_INDEX
    t, gpus, expected = u
    clock = run.moved_clock[2]
    if clock is None:  # no node took the inline quiet path: any fast-class node's clock will do
        tracks = run.tracks
        for name in names:
            tr = tracks.get(name)
            if type(tr) is NodeTracks and tr.quiet is not None and name in run.clocks:
                clock = run.clocks[name]
                break
        else:
            return NO_INDEX
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


def quick(
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
    run.set_outputs(
        dict(last.nodes),
        dict(run.old_tracks),  # type: ignore[arg-type]
        dict.fromkeys(names, clock),
        dict.fromkeys(names, t),
        (last.clock, t, clock),
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


def sense(
    obs: Observations,
    history: Mapping[str, Mapping[str, GpuHistory]],
    old_layout: tuple[str, ...],
    layout: tuple[str, ...],
    params: SenseParams,
    now: float,
    memo: dict[str, Any],
) -> Sensed:
    """``sense.sense`` from the last call (``memo``: ``ControllerState.memo``, where it is kept with the
    sorted node names): a node whose pass gives the very GPUs as last time keeps its very ``SensedNode``,
    ``Sensed.changed`` lists the nodes that are other objects or whose sample aged against the last call's
    (``Sensed.since``), and when every node is sampled at one time ``quick`` senses only the nodes that
    may have changed."""
    events, history = relayout(history, old_layout, layout, now)
    sm = memo.setdefault("sense", {})
    names = sorted_names(sm, obs.slurm, obs.samples)
    last: _Last | None = sm.get("last")
    since = last.nodes if last is not None and last.names is names else None
    run = _Pass(obs, history, params, Tracker(layout, params, now), now, since, last)
    got = quick(run, names, last, history, layout, memo) if since is not None and last is not None else None
    changed: list[str] | tuple[str, ...]
    if got is None:
        for name in names:
            run.node(name)
        changed, flagged = run.changed, run.flagged
        index = keep(run, names, memo)
    else:
        changed, flagged, index = got
    sm["last"] = _Last(names, run.nodes, run.times, now, run.history, params, layout, *index)
    return Sensed(
        run.nodes,
        run.history,
        layout,
        events,
        tuple(flagged),
        tuple(changed) if since is not None else None,
        since,
        run.times,
        now,
    )
