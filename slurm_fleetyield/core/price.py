"""Price: each node's tier and its shadow price (the Slurm node weight).

Input: Slurm view, sensed nodes, risks, envelopes, this tick's drains/holds, state (last tier and features),
``Params``. Output: ``Priced``: per node the tier, the weight, the reason and evidence, and whether route must
re-assert the last known features instead of computing new ones (UNKNOWN and held nodes).

Tiers, first matching rule wins:
1. drained by someone else (reason not ``fleetyield:``): left alone, not managed (no update, drain or resume);
   (except Slurm's own reasons around a reboot of a node we are remediating: QUARANTINED, not managed);
2. drained by this tick's plan, or already drained by us: the lifecycle stage's tier (``tier_for``:
   QUARANTINED, RETIRED ...), QUARANTINED when the lifecycle has no episode for it;
3. fatal evidence whose drain is held by a safety rule: keeps its last known tier and features (a storm of
   fatal events is more likely a bad exporter or driver than hardware: do not strip the fleet of features)
   but takes the red weight, so Slurm fills every other node first (live A/B seed 3: a held node priced by
   risk alone became the most wanted node of the fleet). Its ``fy_ok_*`` class features go when the
   evidence came from the node's own agent (``Drains.fenced``, ``quarantine.fence_held_agent_evidence``):
   the agent's fatal marker makes the Prolog refuse every job there, so a job sent to it would only be
   requeued held and have Slurm drain the node past the cap (live A/B at 9777272, seed 3: an 8-GPU
   pretrain job, 60 s held until an operator released it, while batch and decode held the H100 it needed);
4. in a lifecycle stage (canary, probation ...): the stage's tier, fresh data or not (no stage before
   probation carries an ``fy_ok_*`` feature, so this can never admit normal work);
5. no fresh data: UNKNOWN, keeping the last known tier's features and weight; nothing destructive;
6. risk >= red_threshold: RED (core/gate.py proposes a drain; the node keeps running its jobs);
7. risk >= yellow_threshold: YELLOW; else GREEN.
A lemon (core/learn.py) keeps its tier; route withholds gang and premium-class features from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from slurm_fleetyield.core.learn import is_lemon
from slurm_fleetyield.core.lifecycle import LifecycleMemory, Stage, tier_for
from slurm_fleetyield.core.model import (
    FY_PREFIX,
    Envelope,
    Health,
    LogEvent,
    NodeRisk,
    Observations,
    SlurmNode,
    Tier,
)
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import DrainNode, Hold
from slurm_fleetyield.core.quarantine import Drains
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.state import ControllerState, NodeMemory
from slurm_fleetyield.core.weights import (
    _RISK_ORDERED,
    PREMIUM_OFFSET,
    RISK_STEP,
    RISK_STEPS,
    TIER_WEIGHTS,
    base_multiplier,
    relative,
    risk_weight,
    weight_of,
)

__all__ = [
    "PREMIUM_OFFSET",
    "RISK_STEP",
    "RISK_STEPS",
    "TIER_WEIGHTS",
    "Priced",
    "PricedNode",
    "base_multiplier",
    "price",
    "relative",
    "risk_weight",
    "weight_of",
]

OK_PREFIX = f"{FY_PREFIX}ok_"  # the class features (fy_ok_train, fy_ok_batch ...) that admit jobs
_NO_ENVELOPE = Envelope()  # of a node without an envelope (never mutated: frozen)


@dataclass(frozen=True, slots=True)
class PricedNode:
    node: str
    tier: Tier
    weight: int
    reason: str
    evidence: tuple[str, ...]
    managed: bool  # False: FleetYield leaves the node alone this tick
    health: Health = Health.UNKNOWN
    risk: float = float("nan")
    keep_fy: tuple[str, ...] | None = None  # re-assert these fy_ features instead of deriving new ones
    feature_tier: Tier | None = None  # tier whose features route derives (None: same as tier)
    lemon: bool = False  # repeated fatal failures (core/learn.py): no gang / premium-class features


@dataclass(frozen=True, slots=True)
class Priced:
    nodes: Mapping[str, PricedNode]
    events: tuple[LogEvent, ...] = ()
    red: tuple[str, ...] = ()  # nodes priced RED this tick (the gate's candidates)
    lemons: tuple[str, ...] = ()  # nodes whose lemon verdict is True this tick (it moves with time)


def price(
    obs: Observations,
    sensed: Sensed,
    risks: Mapping[str, NodeRisk],
    envelopes: Mapping[str, Envelope],
    drains: Drains,
    state: ControllerState,
    params: Params,
    now: float,
    lifecycle: Mapping[str, LifecycleMemory] | None = None,
    extra_drains: tuple[DrainNode, ...] = (),
    names: Iterable[str] | None = None,
) -> Priced:
    """Each node's pricing by the rules above: of every node in Slurm's view, or of ``names`` (nodes of it)
    only, in the order given. ``lifecycle``: this tick's lifecycle memories (default: the state's);
    ``extra_drains``: the lifecycle's and the gate's drains of this tick (quarantine's are in ``drains``).

    A node's pricing reads its Slurm row's drain state, reason and weight, its risk, envelope and lifecycle
    memory, its memory's tier, weight and features and its lemon verdict (its fatal history and ``now``),
    its drain reason, hold and fence, the params and the learned base multiplier; nothing else."""
    m = base_multiplier(state, params)
    red, yellow = relative(params.risk.red_threshold, m), relative(params.risk.yellow_threshold, m)
    drain_reason = {d.node: d.reason for d in drains.drains}
    for d in extra_drains:
        drain_reason.setdefault(d.node, d.reason)
    lifecycle = state.lifecycle if lifecycle is None else lifecycle
    lp = params.learn
    events: list[LogEvent] = []
    reds: list[str] = []
    lemons: list[str] = []
    held, fenced = drains.held, drains.fenced
    slurms, memories = obs.slurm, state.nodes
    out: dict[str, PricedNode] = {}
    for name in slurms if names is None else names:
        memory = memories.get(name)
        lemon = memory is not None and bool(memory.fatal_history) and is_lemon(memory, now, lp)
        if lemon:
            lemons.append(name)
        pn, event, is_red = _price_node(
            name,
            slurms[name],
            risks.get(name),
            envelopes.get(name, _NO_ENVELOPE),
            memory,
            lifecycle.get(name) if lifecycle else None,
            lemon,
            drain_reason.get(name) if drain_reason else None,
            held.get(name) if held else None,
            params,
            now,
            red,
            yellow,
            name in fenced,
            m,
        )
        out[name] = pn
        if is_red:
            reds.append(name)
        if event is not None:
            events.append(event)
    return Priced(out, tuple(events), tuple(sorted(reds)), tuple(lemons))


def priced_slurm(slurm: SlurmNode | None) -> tuple[object, ...] | None:
    """What pricing reads of a node's Slurm row: its drain state, reason and weight."""
    return None if slurm is None else (slurm.drained, slurm.reason, slurm.weight)


def priced_memory(memory: NodeMemory | None) -> tuple[object, ...] | None:
    """What pricing reads of a node's memory: last tier, weight and features, and the fatal history its
    lemon verdict is drawn from (with ``now``)."""
    return None if memory is None else (memory.tier, memory.weight, memory.fy_features, memory.fatal_history)


def _price_node(
    name: str,
    slurm: SlurmNode,
    risk: NodeRisk | None,
    env: Envelope,
    memory: NodeMemory | None,
    lc: LifecycleMemory | None,
    lemon: bool,
    drain_reason: str | None,
    hold: Hold | None,
    params: Params,
    now: float,
    red: float,
    yellow: float,
    fenced: bool = False,
    m: float = 1.0,
) -> tuple[PricedNode, LogEvent | None, bool]:
    """One node's pricing (the rules in the module docstring): the node, its tier-change event, is it RED."""
    evidence = _evidence(risk, env)
    premium = env.premium
    p = risk.probability if risk else float("nan")
    health = risk.health if risk else Health.UNKNOWN
    stage = lc.stage if lc is not None else Stage.IN_SERVICE
    if lemon:
        lp = params.learn
        evidence = (
            *evidence,
            f"lemon: >= {lp.lemon_failures} fatal failures in {lp.lemon_window_s / 86400:g} days",
        )
    if slurm.drained_by_other and stage is Stage.REMEDIATING:
        # Slurm's own reason around our reboot (rehab turned any other reason into ADMIN_DRAINED)
        assert lc is not None
        return PricedNode(
            name, tier_for(stage, Tier.QUARANTINED), slurm.weight,
            f"{lc.reason} (Slurm: {slurm.reason})", evidence, False, health, p,
        ), None, False  # fmt: skip
    if slurm.drained_by_other:
        return (
            PricedNode(
                name,
                memory.tier if memory else Tier.UNKNOWN,
                slurm.weight,
                f"drained by someone else: {slurm.reason}",
                evidence,
                False,
                health,
                p,
            ),
            None,
            False,
        )
    is_red = False
    if drain_reason is not None:
        tier = tier_for(stage, Tier.QUARANTINED)
        reason = lc.reason if lc is not None and lc.reason and stage is not Stage.IN_SERVICE else drain_reason
    elif slurm.drained_by_us:
        tier = tier_for(stage, Tier.QUARANTINED)
        reason = lc.reason if lc is not None and lc.reason and stage is not Stage.IN_SERVICE else slurm.reason
    elif hold is not None:
        reason = f"fatal evidence, drain held by {hold.rule}: {hold.detail}; red weight until drained"
        keep_tier = memory.tier if memory else Tier.UNKNOWN
        if fenced:
            reason = f"{reason}; no fy_ok_* (the agent's fatal marker: the Prolog refuses every job here)"
        kept = _keep(name, keep_tier, memory, premium, reason, evidence, params, health, p)
        kept = replace(kept, weight=weight_of(Tier.RED, premium, params))
        if fenced and kept.keep_fy is not None:
            kept = replace(kept, keep_fy=tuple(f for f in kept.keep_fy if not f.startswith(OK_PREFIX)))
        return kept, None, False
    elif stage is not Stage.IN_SERVICE:
        tier = tier_for(stage, Tier.QUARANTINED)
        reason = f"{stage.value} (lifecycle): {lc.reason}" if lc is not None else stage.value
    elif risk is None or risk.health is Health.UNKNOWN:
        why = risk.reason if risk else "unknown: not sampled"
        return _keep(name, Tier.UNKNOWN, memory, premium, why, evidence, params, health, p), None, False
    elif p >= red:
        tier, reason = Tier.RED, f"{risk.reason} (>= red {red:g})"
        is_red = True
    elif p >= yellow:
        tier, reason = Tier.YELLOW, f"{risk.reason} (>= yellow {yellow:g})"
    else:
        tier, reason = Tier.GREEN, risk.reason
    event = None
    if memory and memory.tier is not tier and memory.tier is not Tier.UNKNOWN:
        event = LogEvent(
            now,
            name,
            "tier_change",
            f"{memory.tier.value} -> {tier.value}: {reason}",
            {"from": memory.tier.value, "to": tier.value, "risk": p},
        )
    if lemon:
        reason = f"{reason}; lemon"
    weight = (
        risk_weight(tier, premium, risk, m, params)
        if params.stake.enabled and tier in _RISK_ORDERED and stage is Stage.IN_SERVICE
        else weight_of(tier, premium, params)
    )
    pn = PricedNode(name, tier, weight, reason, evidence, True, health, p, None, None, lemon)
    return pn, event, is_red


def _keep(
    name: str,
    tier: Tier,
    memory: NodeMemory | None,
    premium: bool,
    reason: str,
    evidence: tuple[str, ...],
    params: Params,
    health: Health,
    p: float,
) -> PricedNode:
    """UNKNOWN and held nodes keep what they had: last fy_ features and weight, if any were ever decided."""
    if memory is not None and memory.weight is not None:
        return PricedNode(name, tier, memory.weight, reason, evidence, True, health, p, memory.fy_features)
    weight = weight_of(Tier.UNKNOWN, premium, params)
    return PricedNode(name, tier, weight, reason, evidence, True, health, p, None, Tier.UNKNOWN)


def _evidence(risk: NodeRisk | None, env: Envelope) -> tuple[str, ...]:
    ev: list[str] = []
    if risk is not None:
        if risk.stale_s is not None:
            ev.append(f"sample age {risk.stale_s:.0f}s")
        for g in risk.gpus:
            for c in g.contributions:
                ev.append(f"gpu {g.index} {c.signal}={c.value:g} {c.detail} -> {c.weight:+.2f} log-odds")
            if g.fatal_xids:
                ev.append(f"gpu {g.index} fatal XID {','.join(map(str, g.fatal_xids))}")
    ev.extend(env.notes)
    return tuple(ev)
