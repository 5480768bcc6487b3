"""The tick: the one place where the order of the stages is written.

Input: the previous ``ControllerState``, this tick's ``Observations``, ``Params``, the clock ``now`` and an
``rng`` (proposal ids are drawn from it, so a simulation is deterministic). Output: a ``TickResult``: the next
state, the ``Plan`` of actions, one ``NodeDecision`` per node, the per-node risk, log events, the jobs settled
this tick (``ledger``), the risk model's track record (``calibration``) and ``wake_at``, the earliest time at
which the answer could change with the same observations (core/wake.py). The daemon and the simulator both
call ``tick``.

Order: sense -> fatal evidence -> risk -> profile -> quarantine -> gate (decisions) -> lifecycle -> price ->
premium reclaim -> premium widening -> gang widening -> stake (class features withheld by expected loss) ->
hot spares -> route -> keep open (and route again when a class feature is on no node) -> gate (proposals) ->
plan -> remember -> settle -> learn.
Quarantine decides its drains (and holds) before the lifecycle, because a fatal drain is the lifecycle's FATAL
event and an approved drain shares the caps left after it; the lifecycle runs before pricing because the tier
of a node in rehabilitation is its stage's; proposals come after routing because their evidence is the node's
``explain`` text. Plan order: feature updates, drains, reclaim requeues (after the update that walls their
node), lifecycle actions (reboot, reset, resume, canaries), proposals: a resumed node already carries its
canary-only features, a reboot follows its drain.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from slurm_fleetyield.core import (
    carry,
    carry_place,
    carry_sense,
    gangs,
    gate,
    keep_open,
    learn,
    premium,
    price,
    quarantine,
    reclaim,
    rehab,
    sense,
    settle,
    spares,
    stake,
    wake,
)
from slurm_fleetyield.core.model import (
    Calibration,
    Envelope,
    LedgerEntry,
    LogEvent,
    NodeDecision,
    NodeRisk,
    Observations,
)
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import DrainNode, Hold, Plan, RequeueJobs, UpdateNodes
from slurm_fleetyield.core.signals import channel_layout
from slurm_fleetyield.core.state import (
    ControllerState,
    LearnMemory,
    SettleMemory,
)

__all__ = ["LogEvent", "NodeDecision", "TickResult", "resample", "tick"]


@dataclass(frozen=True, slots=True)
class TickResult:
    state: ControllerState
    plan: Plan
    nodes: Mapping[str, NodeDecision]
    risks: Mapping[str, NodeRisk]
    events: tuple[LogEvent, ...] = ()
    # The inputs of this tick (references, no copies): what explain needs to recompute every signal value.
    sensed: sense.Sensed | None = None
    previous: ControllerState | None = None
    params: Params | None = None
    now: float = float("nan")
    ledger: tuple[LedgerEntry, ...] = ()  # jobs settled this tick (core/settle.py)
    calibration: Calibration = field(default_factory=Calibration)  # the risk model's record (core/learn.py)
    withheld: stake.Withheld | None = None  # the stake rule's tick: stakes, weighed nodes, breaker (explain)

    @property
    def wake_at(self) -> float:
        """The earliest time at which the answer could change with the same readings and Slurm view
        (core/wake.py; inf: none), computed when read: the simulator's event mode skips a grid tick before
        it; the daemon keeps its interval and never asks."""
        if self.params is None:
            return math.inf  # no tick ran (Slurm unreadable): nothing time-driven is pending from it
        return wake.wake_at(self.state, self.params, self.now)

    @property
    def signals(self) -> tuple[str, ...]:
        """Enabled signal names, in evaluation order."""
        return self.params.risk.signals if self.params else ()

    @property
    def base_probability(self) -> float:
        """Per-GPU base P(fatal within the horizon)."""
        return self.params.risk.base_probability if self.params else float("nan")

    @property
    def horizon_days(self) -> float:
        return self.params.risk.horizon_days if self.params else float("nan")


def tick(
    state: ControllerState, obs: Observations, params: Params, now: float, rng: random.Random
) -> TickResult:
    if not obs.slurm_ok:  # Slurm could not be read: acting on a stale view of it is worse than waiting
        return TickResult(state, Plan(), {}, {}, (LogEvent(now, "", "slurm_unreadable", "no plan"),))
    layout = channel_layout(params.quarantine.risk_only_xids, params.quarantine.quarantine_xids)
    sensed = carry_sense.sense(obs, state.history, state.layout, layout, params.sense, now, state.memo)
    fatal = quarantine.find_fatal(obs, sensed, state, params.quarantine)
    risks = carry.risk(sensed, fatal, state, params, now)
    envelopes = carry.profile(sensed, obs, state, params.profile)
    drains = quarantine.decide(fatal, obs, state, params.quarantine, now, rehab.out_of_service(state))
    decided = gate.decide(obs, state, risks, params, now)
    rh = rehab.rehabilitate(obs, sensed, risks, drains, decided.approvals, state, params, now)
    priced = carry_place.price(obs, sensed, risks, envelopes, drains, state, params, now, rh)
    rc = reclaim.reclaim(obs, priced, envelopes, state.reclaim, params, now)
    pw, gw = _widen(obs, priced, envelopes, risks, frozenset(rc.walled), state, params, now)
    wh = stake.withhold(obs, priced, params, now, price.base_multiplier(state, params))
    hs = spares.spares(obs, priced, envelopes, wh, params, now)
    decisions, updates, ko = _route(obs, priced, envelopes, pw, gw, rc.walled, wh, hs, state, params, now)
    explain_node = _explainer(state, decisions, risks, sensed, params, now, wh)
    proposed = gate.propose(obs, decided, rh, priced.red, risks, drains, params, now, rng, explain_node, wh)
    plan = _plan(updates, _merge_drains(drains.drains, rh.drains), rc.actions, rh, proposed, drains.holds)
    remembered = carry.remember(state, sensed, decisions, priced, fatal, drains, params, now, rh)
    ledger, settled = settle.settle(obs, state.settle, remembered, rh.lifecycle, params.settle, now)
    learned, cal = learn.learn(state.learn, risks, decisions, drains.processed, rh.lifecycle, params, now)
    after = _next_state(remembered, rh, proposed, decided, settled, learned, pw, ko, rc, state.memo)
    events = _events(sensed, drains, decided, rh, priced, pw, gw, rc, wh, hs, ko, proposed)
    return TickResult(after, plan, decisions, risks, events, sensed, state, params, now, ledger, cal, wh)


def _widen(
    obs: Observations,
    priced: price.Priced,
    envelopes: Mapping[str, Envelope],
    risks: Mapping[str, NodeRisk],
    walled: frozenset[str],
    state: ControllerState,
    params: Params,
    now: float,
) -> tuple[premium.Widening, gangs.GangLoans]:
    """Premium widening, then gang widening (their supply and last loans carried by core/carry_place.py)."""
    supply = partial(carry_place.premium_supply, state.memo)
    pw = premium.widen(obs, priced, envelopes, state.premium, params, now, walled, supply)
    lent = carry_place.gangs_lent_before(state.memo, state.nodes)
    return pw, gangs.widen(obs, priced, envelopes, risks, state.nodes, params, now, _kept(state), lent)


def _kept(state: ControllerState) -> frozenset[str]:
    """Nodes on which fy_ok_train is kept open (core/keep_open.py): gang widening leaves them be."""
    return frozenset(n for f, n in state.kept_open if f == keep_open.OK_TRAIN)


def resample(state: ControllerState, obs: Observations, params: Params, now: float) -> ControllerState:
    """The next state of a tick before ``wake_at`` (core/wake.py) whose observations are the last tick's
    re-sampled (the same readings at ``now``, the same Slurm view and jobs, no pushed event, approval or
    canary result) and whose last plan had no actions. Input: the last tick's state, those observations,
    ``Params``, ``now``. Output: that state with the trend ring moved as ``tick``'s sense stage moves it and
    ``last_tick`` at ``now``; the tick's plan would have no actions and every decision and other memory stays
    (what ``wake_at`` bounds; tests/sim/test_wake_equivalence.py checks it)."""
    layout = channel_layout(params.quarantine.risk_only_xids, params.quarantine.quarantine_xids)
    sensed = carry_sense.sense(obs, state.history, state.layout, layout, params.sense, now, state.memo)
    return replace(state, history=sensed.history, layout=sensed.layout, last_tick=now)


def _route(
    obs: Observations,
    priced: price.Priced,
    envelopes: Mapping[str, Envelope],
    pw: premium.Widening,
    gw: gangs.GangLoans,
    walled: Mapping[str, str],
    wh: stake.Withheld,
    hs: spares.Spares,
    state: ControllerState,
    params: Params,
    now: float,
) -> tuple[Mapping[str, NodeDecision], tuple[UpdateNodes, ...], keep_open.Opened]:
    """Route, then keep open: when a class feature is on no node, route again with it kept open on the node
    chosen (core/carry_place.py routes again only the nodes that change). Premium widening lends a node
    walled by premium reclaim only the keep-open decode loan, and only as a last resort."""
    (lent, why), (train_lent, train_why) = pw.loan, gw.loan
    how = {
        "lent": lent, "lent_reason": why, "train_lent": train_lent, "train_reason": train_why,
        "batch_wall": params.premium.batch, "walled": walled, "withheld": wh.nodes,
        "service": params.stake.enabled, "reserve": params.premium.reserve, "spares": hs.nodes,
        "spares_on": params.spares.enabled,
    }  # fmt: skip
    decisions, updates = carry_place.route(state, obs, priced, envelopes, **how)
    ko = keep_open.keep_open(obs, decisions, priced, envelopes, state.kept_open, params, now)
    if ko.lent:
        decisions, updates = carry_place.route(
            state, obs, priced, envelopes, **how, opened=ko.lent, open_reason=ko.reason
        )
    return decisions, updates, ko


def _events(*stages: Any) -> tuple[LogEvent, ...]:
    """The log events of the stages, in stage order."""
    return tuple(e for stage in stages for e in stage.events)


def _next_state(
    remembered: ControllerState,
    rh: rehab.Rehab,
    proposed: gate.Proposed,
    decided: gate.Decided,
    settled: SettleMemory,
    learned: LearnMemory,
    pw: premium.Widening,
    ko: keep_open.Opened,
    rc: reclaim.Reclaim,
    memo: dict[str, Any],
) -> ControllerState:
    return replace(
        remembered,
        lifecycle=rh.lifecycle,
        lifecycle_drained=rh.seen_drained,
        proposals=proposed.proposals,
        denials=decided.denials,
        settle=settled,
        learn=learned,
        premium=pw.memory,
        kept_open=ko.memory,
        reclaim=rc.memory,
        memo=memo,
    )


def _plan(
    updates: tuple[UpdateNodes, ...],
    drains: tuple[DrainNode, ...],
    requeues: tuple[RequeueJobs, ...],
    rh: rehab.Rehab,
    proposed: gate.Proposed,
    holds: tuple[Hold, ...],
) -> Plan:
    """Plan order: updates, drains, reclaim's requeues (less any job a drain requeues already), lifecycle
    actions, proposals; holds: quarantine's, then the lifecycle's."""
    if requeues and drains:
        gone = {j for d in drains for j in d.requeue_jobs}
        kept = []
        for a in requeues:
            jobs = tuple(j for j in a.jobs if j not in gone)
            if jobs:
                kept.append(a if jobs == a.jobs else replace(a, jobs=jobs))
        requeues = tuple(kept)
    return Plan((*updates, *drains, *requeues, *rh.actions, *proposed.actions), (*holds, *rh.holds))


def _explainer(
    state: ControllerState,
    decisions: Mapping[str, NodeDecision],
    risks: Mapping[str, NodeRisk],
    sensed: sense.Sensed,
    params: Params,
    now: float,
    wh: stake.Withheld,
) -> Callable[[str], str]:
    """``explain`` of a node as this tick sees it (the evidence of a drain proposal)."""

    def explain_node(node: str) -> str:
        from slurm_fleetyield.core.explain import explain  # explain reads a TickResult: imported late

        partial = TickResult(state, Plan(), decisions, risks, (), sensed, state, params, now, withheld=wh)
        return explain(node, partial)

    return explain_node


def _merge_drains(fatal: tuple[DrainNode, ...], lifecycle: tuple[DrainNode, ...]) -> tuple[DrainNode, ...]:
    """One drain per node: the lifecycle's reason (e.g. RETIRED) over quarantine's, quarantine's requeues."""
    if not lifecycle:
        return fatal
    later = {d.node: d for d in lifecycle}
    out = [replace(d, reason=later[d.node].reason, cause=later.pop(d.node).cause) if d.node in later else d
           for d in fatal]  # fmt: skip
    seen = {d.node for d in out}
    for d in lifecycle:
        if d.node not in seen and d.node in later:
            out.append(d)
            seen.add(d.node)
    return tuple(out)
