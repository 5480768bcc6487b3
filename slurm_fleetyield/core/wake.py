"""When the core next needs to run: the earliest time at which its answer could change with time alone.

Input: the state a tick produced (``TickResult.state``), ``Params`` and that tick's ``now``. Output: one
time, ``wake_at`` (``inf``: no time-driven rule is pending; ``now``: a rule moves every tick), a pure function
of its inputs. Fed the same readings re-sampled (a simulator's scrape: the same reading objects at a later
time), the same Slurm view and no pushed event, approval or canary result, a tick before ``wake_at`` gives
the same plan and decisions, and a next state that differs only in the trend ring and ``last_tick``: what
``core.loop.resample`` computes (sense alone). The ring is not a deadline but it is a change: later rates
read where its points fall (a window's base point, its divisor), so a skipped re-sample would move them.

Each rule below contributes its next deadline; ``wake_at`` is the min:

- freshness (sense): a node not sampled at ``now`` goes stale ``stale_after_s`` after its newest sample;
- trend windows (sense): a GPU whose counters moved within its ring: every tick (its rates move as the
  windows slide; not derived per window here: conservative);
- fatal history (risk, price): a report leaves the ``fatal_history_days`` window or the single-fault decay
  takes its next step (``risk.history_due``); a failure leaves the lemon window;
- drain rate cap (quarantine): a recent drain leaves ``window_s``; held fatal evidence is reconsidered every
  tick (``now``);
- proposals (gate): expiry, the withdrawal hysteresis (``below_since + withdraw_after_s``); an approved one
  held by a cap is retried every tick; a denial's cooldown ends;
- lifecycle (rehab): a stage deadline (``until``); a node in another stage than IN_SERVICE: every tick (its
  stage timers are not derived here: conservative);
- learn: the earliest due prediction;
- premium, reclaim, keep-open and settle memories that hold a time: every tick (conservative, not derived).
A conservative ``now`` is always sound (the simulator then ticks as it would without wake times).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from slurm_fleetyield.core.fatal_history import fatal_events
from slurm_fleetyield.core.history import FleetHistory, GpuHistory, GpuTrack, NodeTracks
from slurm_fleetyield.core.lifecycle_types import Stage
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.risk import history_due
from slurm_fleetyield.core.state import ControllerState

__all__ = ["wake_at"]


def wake_at(state: ControllerState, params: Params, now: float) -> float:
    """The min of every time-driven rule's next deadline (see the module's docs)."""
    return min(
        _stale(state.history, params, now),
        _moving(state.history, now),
        _fatal_history(state, params, now),
        _drain_window(state, params, now),
        _proposals(state, params, now),
        _lifecycle(state, now),
        _learn(state),
        _memories(state, now),
    )


def _stale(history: Mapping[str, Mapping[str, GpuHistory]], params: Params, now: float) -> float:
    """A node whose newest sample is older than the tick (not re-sampled) goes stale ``stale_after_s`` after
    it. A node sampled at ``now`` is taken to be sampled again at the next tick (``resample``)."""
    last = math.inf
    if type(history) is FleetHistory:
        seen: set[int] = set()  # a clock is shared by every node sampled at the same times
        for clock in history.clocks.values():
            if id(clock) not in seen:
                seen.add(id(clock))
                if clock[0] < now:
                    last = min(last, clock[0])
        plain: Iterable[Mapping[str, GpuHistory]] = [
            h  # type: ignore[misc]
            for h in history.tracks.values()
            if type(h) is not NodeTracks
        ]
    else:
        plain = history.values()
    for gpus in plain:
        for g in gpus.values():
            if g.last_time < now:
                last = min(last, g.last_time)
    return last + params.sense.stale_after_s


def _moving(history: Mapping[str, Mapping[str, GpuHistory]], now: float) -> float:
    """A GPU whose counters moved within its ring (or that has one point only): its window rates move as the
    windows slide over the points, every tick (``now``). A node whose tracks are ``quiet`` (one stored point
    per GPU, equal to its last value) is still."""
    if type(history) is FleetHistory:
        for node, h in history.tracks.items():
            if type(h) is NodeTracks:
                if h.quiet is not None:
                    continue
                if len(history.clocks[node][1]) < 2:
                    return now
                for tr in h.gpus.values():
                    if type(tr) is GpuTrack:
                        if len(tr.step_points) > 1 or tr.step_points[-1] != tr.last_adj:
                            return now
                    elif _moved(tr):  # type: ignore[arg-type]
                        return now
            elif any(_moved(g) for g in h.values()):  # type: ignore[union-attr]
                return now
        return math.inf
    return now if any(_moved(g) for gpus in history.values() for g in gpus.values()) else math.inf


def _moved(g: GpuHistory) -> bool:
    return len(g.times) < 2 or any(p != g.last_adj for p in g.points)


def _fatal_history(state: ControllerState, params: Params, now: float) -> float:
    """A fatal report leaving the history window, the single-fault decay's next step, a failure leaving the
    lemon window."""
    due = math.inf
    window = params.learn.lemon_window_s
    for name, mem in state.nodes.items():
        if not mem.fatal_history:
            continue
        due = min(due, history_due(mem.fatal_history, fatal_events(state, name, params, now), params, now))
        due = min(due, min((t for t, _ in mem.fatal_history if t >= now - window), default=math.inf) + window)
    return due


def _drain_window(state: ControllerState, params: Params, now: float) -> float:
    """A recent drain leaving the rate window; held fatal evidence (reconsidered every tick)."""
    if state.held_fatal:
        return now
    w = params.quarantine.window_s
    return min((t + w for t in state.drain_times if t + w > now), default=math.inf)


def _proposals(state: ControllerState, params: Params, now: float) -> float:
    """Proposal expiry, withdrawal hysteresis, approved-but-held retries, the end of a denial's cooldown."""
    gp = params.gate
    due = math.inf
    for p in state.proposals.values():
        if p.approved_by:
            return now
        due = min(due, p.expires_at)
        if p.below_since is not None:
            due = min(due, p.below_since + gp.withdraw_after_s)
    for d in state.denials.values():
        due = min(due, d.time + gp.deny_cooldown_s)
    return due


def _lifecycle(state: ControllerState, now: float) -> float:
    """A stage deadline; any node outside IN_SERVICE: every tick (its timers are not derived here)."""
    due = math.inf
    for m in state.lifecycle.values():
        if m.stage is not Stage.IN_SERVICE:
            return now
        if m.until is not None:
            due = min(due, m.until)
    return due


def _learn(state: ControllerState) -> float:
    nd = state.learn.next_due
    return math.inf if nd is None else nd


def _memories(state: ControllerState, now: float) -> float:
    """Premium, reclaim, keep-open and settle memories holding a time: every tick (conservative)."""
    pm, rc = state.premium, state.reclaim
    if pm.lent or pm.waiting_since is not None or pm.last_waiting is not None or pm.claims:
        return now
    if pm.gang_seen is not None or rc.blocked or rc.walls or rc.requeued or rc.served:
        return now
    if any(n for _, n in state.kept_open) or state.settle.pending:
        return now
    return math.inf
