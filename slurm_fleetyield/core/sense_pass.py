"""One node's sensing pass: fresh-or-UNKNOWN, the expected GPU count, the node's trend memory moved on.

Input: one tick's ``Observations``, the previous history, ``SenseParams`` and ``now``; ``_Pass.node(name)``
senses one node into the pass's outputs (``nodes``, ``tracks``, ``clocks``, ``times``, ``changed``,
``flagged``). Output: those mappings, which ``sense.sense`` wraps into ``Sensed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurm_fleetyield.core.model import Health, NodeSample, Observations
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.signals import RECOVERY_ACTION
from slurm_fleetyield.core.state import Clock, FleetHistory, GpuHistory, NodeTracks
from slurm_fleetyield.core.trends import SensedGpu, Tracker, compact

if TYPE_CHECKING:
    from slurm_fleetyield.core.carry_sense import _Last


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


_NO_NODES: Mapping[str, SensedNode] = {}


def missing(expected: int | None, visible: int) -> int:
    """GPUs missing from a fresh sample: how many fewer are visible than expected (none when nothing is)."""
    return 0 if expected is None or visible >= expected else expected - visible


class _Pass:
    """One ``sense`` call's outputs and per-tick constants; ``node(name)`` senses one node into them."""

    __slots__ = (
        "changed",
        "clocks",
        "flagged",
        "history",
        "last_now",
        "last_times",
        "moved_clock",
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
        tracker: Tracker,
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
        self.moved_clock: tuple[Clock | None, float | None, Clock | None] = (None, None, None)

    def set_outputs(
        self,
        nodes: dict[str, SensedNode],
        tracks: dict[str, NodeTracks | Mapping[str, GpuHistory]],
        clocks: dict[str, Clock],
        times: dict[str, float],
        moved_clock: tuple[Clock | None, float | None, Clock | None] | None = None,
    ) -> None:
        """The pass's outputs, already filled for the nodes it will not sense (and, given: the clock moved
        for them, as ``moved_clock`` holds it)."""
        self.nodes, self.tracks, self.clocks, self.times = nodes, tracks, clocks, times
        self.history = FleetHistory(tracks, clocks)
        if moved_clock is not None:
            self.moved_clock = moved_clock

    def node(self, name: str) -> None:
        now = self.now
        sample = self.samples.get(name)
        tr = self.old_tracks.get(name)
        if sample is None or sample.error or now - sample.time > self.stale_after_s:
            if sample is not None:
                self.times[name] = sample.time
            self.nodes[name] = SensedNode(
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
            c_in, c_t, c_out = self.moved_clock
            if clock is not c_in or t != c_t:
                c_out = (t, self.tracker.timeline(t, clock[1])[0])
                self.moved_clock = (clock, t, c_out)
            self.clocks[name] = c_out  # type: ignore[assignment]
            self.tracks[name] = tr
            new_xids = asks_recovery = False  # the very readings as last tick: flagged then if at all
        else:
            gpus, self.tracks[name], new_clock = self.tracker.node(sample, tr, clock)
            if new_clock is not None:
                self.clocks[name] = new_clock
            else:
                self.clocks.pop(name, None)
            new_xids = any(g.new_xids for g in gpus)
            asks_recovery = any(g.reading.fields.get(RECOVERY_ACTION) for g in gpus)
        p = self.pget(name)
        if p is not None and p.gpus is gpus and p.health is Health.OK and p.expected_gpus == expected:
            self.nodes[name] = p  # the same node: only its sample's time moved
            if now - t != self.last_now - self.last_times[name]:
                self.changed.append(name)
        else:
            self.nodes[name] = SensedNode(name, Health.OK, "fresh sample", gpus, expected)
            self.changed.append(name)
        if new_xids or asks_recovery or missing(expected, len(gpus)):  # sn.missing_gpus, without the property
            self.flagged.append(name)


def _split(
    history: Mapping[str, Mapping[str, GpuHistory]],
) -> tuple[Mapping[str, NodeTracks | Mapping[str, GpuHistory]], Mapping[str, Clock]]:
    """A history's per-node tracks and clocks (``FleetHistory``'s own; any other mapping's, taken apart)."""
    if type(history) is FleetHistory:
        return history.tracks, history.clocks
    tracks: dict[str, NodeTracks | Mapping[str, GpuHistory]] = {}
    clocks: dict[str, Clock] = {}
    for name, h in history.items():
        tracks[name], clock = compact(h)
        if clock is not None:
            clocks[name] = clock
    return tracks, clocks


def _unknown_reason(sample: NodeSample | None, stale_after_s: float, now: float) -> str:
    """Why a node is UNKNOWN: no sample, a failed scrape, or a sample older than ``stale_after_s``."""
    if sample is None:
        return "no sample"
    if sample.error:
        return f"scrape failed: {sample.error}"
    return f"sample is {now - sample.time:.0f}s old (stale after {stale_after_s:.0f}s)"
