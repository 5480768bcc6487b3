"""GPU trend memory: per-GPU counter rings, compact per-node tracks sharing one clock, the fleet's history.

Input: what core/trends.py computes from each sample. Output: the ``history`` of ``ControllerState`` (a
mapping node -> GPU uuid -> ``GpuHistory``), kept compactly as ``FleetHistory`` (time-free ``NodeTracks``
plus one ``Clock`` per node) and bounded to the longest trend window.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Counters = tuple[float | None, ...]  # one value per channel of ``ControllerState.layout``; None: not exported


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


@dataclass(slots=True)
class GpuTrack:
    """Compact trend memory of one GPU inside a ``NodeHistory`` (the node holds ``last_time`` and the ring of
    times): the stored points as run-length steps, ``step_points[i]`` from ``step_times[i]`` on, a step
    wherever the stored point changed, the first at or before the GPU's first ring time. A GPU whose counters
    did not move keeps the very same object from tick to tick (nothing to rebuild, nothing new for the
    garbage collector). A value, never changed once built; not frozen only for speed
    (tests/core/test_values_stay_unassigned.py)."""

    last_raw: Counters
    last_adj: Counters
    step_times: tuple[float, ...]
    step_points: tuple[Counters, ...]

    def ring(self, node_times: tuple[float, ...]) -> tuple[float, ...]:
        """This GPU's ring of times: the node's, from the GPU's first stored point on."""
        first = self.step_times[0]
        if first <= node_times[0]:
            return node_times
        return node_times[bisect_left(node_times, first) :]

    def points(self, times: tuple[float, ...]) -> tuple[Counters, ...]:
        points = self.step_points
        if len(points) == 1:
            return (points[0],) * len(times)
        starts = self.step_times
        out = []
        k, last = 0, len(starts) - 1
        for t in times:
            while k < last and starts[k + 1] <= t:
                k += 1
            out.append(points[k])
        return tuple(out)

    def point_at(self, t: float) -> Counters:
        """The stored point at ring time ``t`` (``points`` at one time): that of the last step at or before
        ``t``, found by binary search, so a trend reads its few window bases without expanding the ring."""
        i = bisect_right(self.step_times, t) - 1
        return self.step_points[max(i, 0)]  # as ``points``: a time before the first step reads the first

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
                starts: list[float] = []
                points: list[Counters] = []
                for t, p in zip(h.times, h.points, strict=True):
                    if not points or points[-1] != p:
                        starts.append(t)
                        points.append(p)
                gpus[uuid] = GpuTrack(h.last_raw, h.last_adj, tuple(starts), tuple(points))
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
