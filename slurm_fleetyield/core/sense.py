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
from slurm_fleetyield.core.signals import FATAL_XID_PREFIX, trended, xid_channel
from slurm_fleetyield.core.state import Counters, GpuHistory
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
    """The history to sense from, in ``layout``'s channels. When the tracked channels changed (a config edit
    of the XID lists, or a version that keeps other channels in the ring), every GPU's history is carried
    over channel by channel, by name: a channel the old layout did not keep reads as not exported then
    (None), so its next value is its own baseline, as for a counter that appears. A GPU keeps its trends and
    its last totals, so an XID that grew across the change is still new."""
    if not old_layout or old_layout == layout:
        return (), history
    raw_from = _channel_map(old_layout, layout)
    adj_from = _channel_map(old_layout[: trended(old_layout)], layout[: trended(layout)])
    moved = {
        node: {uuid: _relaid(h, raw_from, adj_from) for uuid, h in gpus.items()}
        for node, gpus in history.items()
    }
    event = LogEvent(
        now, "", "history_relayout", "tracked channels changed; GPU history carried over by channel"
    )
    return (event,), moved


def _channel_map(old: tuple[str, ...], new: tuple[str, ...]) -> tuple[int | None, ...]:
    """Per channel of ``new``: its index in ``old`` (an XID's channel under either of its names), or None."""
    at = {_xid_name(c): i for i, c in enumerate(old)}
    return tuple(at.get(_xid_name(c)) for c in new)


def _xid_name(channel: str) -> str:
    """A quarantine XID's channel under its risk-only name (the same XID total either way)."""
    return (
        xid_channel(int(channel[len(FATAL_XID_PREFIX) :]))
        if channel.startswith(FATAL_XID_PREFIX)
        else channel
    )


def _relaid(h: GpuHistory, raw_from: tuple[int | None, ...], adj_from: tuple[int | None, ...]) -> GpuHistory:
    def pick(values: Counters, at: tuple[int | None, ...]) -> Counters:
        return tuple(None if i is None else values[i] for i in at)

    points = tuple(pick(p, adj_from) for p in h.points)
    return GpuHistory(h.last_time, pick(h.last_raw, raw_from), pick(h.last_adj, adj_from), h.times, points)
