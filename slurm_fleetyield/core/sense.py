"""Sense: turn one tick's raw samples into fresh-or-UNKNOWN nodes with per-GPU counter trends.

Input: ``Observations`` (Slurm view, node samples), the previous ``ControllerState`` (GPU history), ``now``.
Output: ``Sensed``: one ``SensedNode`` per node known to Slurm or sampled, and the updated, bounded history.

A node is UNKNOWN when it has no sample, its scrape failed, or its newest sample is older than
``stale_after_s``: no data is not evidence, so UNKNOWN never reads as healthy or as bad. Only a fresh,
successful sample can reveal a missing GPU (fewer GPUs than the agent's ``expected_gpus`` or Slurm's Gres
count).

Trends (core/trends.py): counters are reset-adjusted and kept as a bounded ring per GPU; a window's rate is
growth since the oldest point inside it divided by the window length. One node's pass is core/sense_pass.py.

Time is kept apart from what a sample brings: ``Sensed.times`` holds each node's sample time, and the
history (``FleetHistory``) each compact node's clock. A quiet node (no counter moved, nothing grew within
the longest window) sampled again with the very same readings keeps its very ``SensedNode`` and tracks;
only its clock moves. core/carry_sense.py senses again only the nodes that may have changed since the
last call (tests/core/test_sense_quick.py checks it against this module's full pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.model import LogEvent, Observations
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.sense_pass import SensedNode, _Pass, missing
from slurm_fleetyield.core.state import GpuHistory
from slurm_fleetyield.core.trends import SensedGpu, Tracker

__all__ = ["Sensed", "SensedGpu", "SensedNode", "missing", "sense"]


@dataclass(frozen=True, slots=True)
class Sensed:
    nodes: Mapping[str, SensedNode]
    history: Mapping[str, Mapping[str, GpuHistory]]
    layout: tuple[str, ...]
    events: tuple[LogEvent, ...] = ()
    # The fresh nodes with a GPU whose XID counts grew, a GPU whose driver requests a recovery action (first
    # seen: unchanged readings are not flagged again) or fewer GPUs than expected, by name: the only ones
    # where quarantine.find_fatal can find scrape evidence. None: not indexed (look at every node).
    flagged: tuple[str, ...] | None = None
    # Against ``since`` (an earlier tick's ``nodes``, with the same names in the same order): the nodes whose
    # SensedNode is another object or whose sample age moved. Every other node is fresh in both, the very
    # same SensedNode (same GPU objects) and as old, so a stage that read only those from it may hand back
    # its answer for ``since`` (core/carry.py). None: not known.
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
) -> Sensed:
    """Every node's pass (core/sense_pass.py), in name order: the rule. core/carry_sense.py senses again
    only the nodes that can have changed since the last call."""
    events, history = relayout(history, old_layout, layout, now)
    run = _Pass(obs, history, params, Tracker(layout, params, now), now, None, None)
    for name in sorted({*obs.slurm, *obs.samples}):
        run.node(name)
    return Sensed(run.nodes, run.history, layout, events, tuple(run.flagged), None, None, run.times, now)


def relayout(
    history: Mapping[str, Mapping[str, GpuHistory]],
    old_layout: tuple[str, ...],
    layout: tuple[str, ...],
    now: float,
) -> tuple[tuple[LogEvent, ...], Mapping[str, Mapping[str, GpuHistory]]]:
    """The history to sense from: none when the tracked channels changed (a config edit: old points do not
    line up with the new channels), with the event that says so."""
    if old_layout and old_layout != layout:
        return (LogEvent(now, "", "history_reset", "tracked channels changed; GPU history restarted"),), {}
    return (), history
