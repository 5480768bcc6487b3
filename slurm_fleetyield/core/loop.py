"""The tick: the one place where the order of the stages is written.

Input: the previous ``ControllerState``, this tick's ``Observations``, ``Params``, the clock ``now`` and an
``rng`` (the stages are deterministic today; the generator is threaded through for the lifecycle's randomized
canary selection, next issue). Output: a ``TickResult``: the next state, the ``Plan`` of Slurm actions, one
``NodeDecision`` per node, the per-node risk and log events. The daemon and the simulator both call ``tick``.

Order: sense -> fatal evidence -> risk -> profile -> quarantine -> price -> route -> plan -> remember.
Quarantine decides its drains (and holds) before pricing because the price of a node depends on whether it
is being drained this tick; the plan then lists the feature updates first and the drains after them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_fleetyield.core import memory, price, profile, quarantine, risk, route, sense
from slurm_fleetyield.core.model import LogEvent, NodeDecision, NodeRisk, Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import Plan
from slurm_fleetyield.core.signals import channel_layout
from slurm_fleetyield.core.state import ControllerState

__all__ = ["LogEvent", "NodeDecision", "TickResult", "tick"]


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
        return TickResult(
            state, Plan(), {}, {}, (LogEvent(now, "", "slurm_unreadable", "no plan this tick"),)
        )
    layout = channel_layout((*params.quarantine.quarantine_xids, *params.quarantine.risk_only_xids))
    sensed = sense.sense(obs, state.history, state.layout, layout, params.sense, now)
    fatal = quarantine.find_fatal(obs, sensed, state, params.quarantine)
    risks = risk.assess(sensed, fatal, state, params, now)
    envelopes = profile.profile(sensed, obs, state, params.profile)
    drains = quarantine.decide(fatal, obs, state, params.quarantine, now)
    priced = price.price(obs, sensed, risks, envelopes, drains, state, params, now)
    decisions, updates = route.route(obs, priced, envelopes)
    plan = Plan((*updates, *drains.drains), drains.holds)
    new_state = memory.remember(state, sensed, decisions, priced, fatal, drains, params, now)
    events = (*sensed.events, *drains.events, *priced.events)
    return TickResult(new_state, plan, decisions, risks, events, sensed, state, params, now)
