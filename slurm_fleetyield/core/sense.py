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
only its clock moves. When every node is sampled at one time (the simulator), ``_quick`` senses only the
nodes whose readings or GPU counts changed, or that were not quiet, with C-level passes over the rest
(tests/core/test_sense_quick.py checks it against a full pass).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_fleetyield.core import sense_quick
from slurm_fleetyield.core.model import LogEvent, Observations
from slurm_fleetyield.core.params import SenseParams
from slurm_fleetyield.core.sense_pass import SensedNode, _Pass, missing
from slurm_fleetyield.core.sense_quick import _Last
from slurm_fleetyield.core.state import GpuHistory, sorted_names
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
    run = _Pass(obs, history, params, Tracker(layout, params, now), now, since, last)
    quick = None
    if since is not None and last is not None and memo is not None:
        quick = sense_quick.quick(run, names, last, history, layout, memo)
    changed: list[str] | tuple[str, ...]
    if quick is None:
        for name in names:
            run.node(name)
        changed, flagged = run.changed, run.flagged
        keep = sense_quick.keep(run, names, memo)
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
