"""Risk: per-GPU probability of a fatal failure within the horizon, and what moved it.

Input: sensed nodes (levels, rates, window growth per GPU), this tick's fatal findings, the fatal history in
state, ``Params`` (risk model; risk-only XIDs). Output: one ``NodeRisk`` per sensed node with a ``GpuRisk``
per GPU carrying every non-zero ``Contribution``.

Model (logistic, additive in log-odds, so each term is readable on its own):
    logit(p_gpu) = logit(base) + sum(contribution of each enabled signal)
    base         = 1 - exp(-gpu_fatal_per_day x horizon_days)          (Llama 3 rate, see core/params.py)
    p_node       = 1 - prod(1 - p_gpu)
Learned multipliers (core/learn.py, empirical Bayes from resolved predictions) scale a GPU's hazard by the
multiplier of its bucket: the base rate for GPUs no signal moved, the dominant signal otherwise
(p' = 1 - (1 - p)^m); without evidence they are all 1. A GPU with fatal evidence this tick has p = 1 and
health BAD. Fatal history: one isolated failure in the window has its repeat-offender contributions decayed by
2^(-age / risk.single_fault_half_life_days) (Titan: the excess hazard after a return fades); two or more keep
the full weights. GPU health: BAD at or above red_threshold,
WARN at or above yellow_threshold, else OK. A node without fresh data has health UNKNOWN and probability NaN
(unknown, never 0): unless a pushed fatal event names it, which makes it BAD with p = 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from slurm_fleetyield.core.fatal_history import fatal_events, fatal_uuids, history_decay
from slurm_fleetyield.core.model import Contribution, GpuRisk, Health, NodeRisk
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.quarantine import Fatal
from slurm_fleetyield.core.scoring import CompiledSignal, Scorer, compile_signals, logit, signal_values
from slurm_fleetyield.core.sense import Sensed, SensedNode
from slurm_fleetyield.core.signals import (
    GPU_TEMP,
    SLOWDOWN_TEMP,
)
from slurm_fleetyield.core.state import ControllerState

__all__ = [
    "CompiledSignal",
    "Scorer",
    "assess",
    "compile_signals",
    "fatal_events",
    "fatal_uuids",
    "history_decay",
    "logit",
    "signal_values",
]


def assess(
    sensed: Sensed,
    fatal: tuple[Fatal, ...],
    state: ControllerState,
    params: Params,
    now: float,
    names: Iterable[str] | None = None,
    scorer: Scorer | None = None,
) -> dict[str, NodeRisk]:
    """Each node's risk by the model above: of every sensed node, or of ``names`` (sensed nodes) only.

    A node's risk reads its ``SensedNode`` and sample age, this tick's fatal findings naming it, its fatal
    history (``state.nodes``), the learned multipliers (``state.learn``), the params and ``now``; nothing
    else. ``scorer``: the signals compiled for these params and the sensed layout (built when not given;
    core/carry.py keeps one while both stay the same)."""
    rp = params.risk
    if scorer is None:
        scorer = Scorer(compile_signals(params, sensed.layout), params, sensed.layout)
    base = base_probability(state, params)
    mult = state.learn.multipliers if params.learn.enabled else {}  # per dominant signal (core/learn.py)
    yellow, red = rp.yellow_threshold, rp.red_threshold
    score = scorer.score
    quiet_fields = scorer.quiet_fields
    quiet_margin = scorer.quiet_margin
    margin_enabled = scorer.margin_enabled
    slowdown = scorer.slowdown
    base_health = Health.BAD if base >= red else Health.WARN if base >= yellow else Health.OK
    exp = math.exp
    BAD, WARN, OK = Health.BAD, Health.WARN, Health.OK
    fatal_by_node: dict[str, list[Fatal]] = {}
    for f in fatal:
        fatal_by_node.setdefault(f.node, []).append(f)
    nodes = sensed.nodes
    memories = state.nodes
    out: dict[str, NodeRisk] = {}
    for name in nodes if names is None else names:
        node = nodes[name]
        mem = memories.get(name)
        if mem is not None and mem.fatal_history:
            events = fatal_events(state, name, params, now)
            history = [u for _, u in events]
            decay = history_decay(events, params, now)
        else:
            history, decay = [], 1.0
        node_fatal = fatal_by_node.get(name, ())
        if not node.fresh:
            out[name] = _unknown(node, node_fatal, sensed.stale_s(name))
            continue
        fatal_gpu: dict[str, list[Fatal]] = {}
        for f in node_fatal:
            if f.uuid is not None or f.gpu is not None:
                fatal_gpu.setdefault(f.uuid or f"#{f.gpu}", []).append(f)
        gpus = []
        survive = 1.0
        n_hist = len(history)
        for g in node.gpus:  # one GPU's risk: this loop runs once per GPU of the fleet
            r = g.reading
            gf = (fatal_gpu.get(r.uuid) or fatal_gpu.get(f"#{r.index}")) if fatal_gpu else None
            if not gf and not n_hist and g.rates is None and g.growth is None:
                fget = r.fields.get
                if not any(map(fget, quiet_fields)):  # Scorer.score's quiet plan, inlined
                    temp = fget(GPU_TEMP) if margin_enabled else None
                    if temp is None or (
                        quiet_margin is not None and (fget(SLOWDOWN_TEMP) or slowdown) - temp > quiet_margin
                    ):  # nothing fires: the base probability
                        gr = GpuRisk(name, r.index, r.uuid, r.model, base_health, base, ())
                        survive *= 1.0 - base
                        gpus.append(gr)
                        continue
            n_gpu = history.count(r.uuid) if history else 0
            z, contributions = score(g, n_gpu, n_hist - n_gpu, decay)
            if gf:
                xids = tuple(sorted({f.xid for f in gf if f.xid is not None}))
                gr = GpuRisk(name, r.index, r.uuid, r.model, Health.BAD, 1.0, contributions, xids)
            else:
                gp = 1.0 / (1.0 + exp(-z)) if contributions else base
                if mult and contributions:
                    gp = _adjust(gp, mult.get(max(contributions, key=_weight).signal, 1.0))
                health = BAD if gp >= red else WARN if gp >= yellow else OK
                gr = GpuRisk(name, r.index, r.uuid, r.model, health, gp, contributions)
            survive *= 1.0 - gr.probability
            gpus.append(gr)
        p = 1.0 - survive
        node_wide = [f for f in node_fatal if f.uuid is None and f.gpu is None]
        if node_wide:
            p = 1.0
        if node_fatal:
            health = Health.BAD
            reason = "fatal: " + node_fatal[0].reason.removeprefix("fleetyield:").strip()
        else:
            health = Health.BAD if p >= red else Health.WARN if p >= yellow else Health.OK
            reason = _summary(gpus, p, base)
        out[name] = NodeRisk(name, health, p, tuple(gpus), reason, sensed.stale_s(name))
    return out


def history_due(
    history: tuple[tuple[float, str], ...], events: list[tuple[float, str]], params: Params, now: float
) -> float:
    """When the risk of a node with this fatal history can next change with time alone: a report leaves
    the ``fatal_history_days`` window (``fatal_events``' answer changes), or the single-fault decay moves to
    its next step (``history_decay``). Until then its GPUs, evidence and params decide alone."""
    span = params.risk.fatal_history_days * 86_400.0
    due = min((t for t, _ in history if t >= now - span), default=math.inf) + span
    if params.risk.single_fault_half_life_days is not None and len(events) == 1:
        step = params.risk.single_fault_decay_step_hours * 3_600.0
        if step <= 0:
            return now  # continuous decay: moves every tick
        t0 = events[0][0]
        age = max(0.0, now - t0)
        due = min(due, t0 + (age // step + 1.0) * step)
    return due


def base_probability(state: ControllerState, params: Params) -> float:
    """P(fatal within the horizon) of a GPU no signal moved: the params' base, its hazard scaled by the
    learned base multiplier (core/learn.py)."""
    base = params.risk.base_probability
    mult = state.learn.multipliers if params.learn.enabled else {}
    return _adjust(base, mult.get("base", 1.0)) if mult else base


def at_base(nr: NodeRisk, base: float, params: Params) -> NodeRisk:
    """The risk of a fresh node with no fatal evidence whose GPUs no signal moved (``nr``, assessed at
    another base probability), at ``base``: what ``assess`` gives it when only the base moved."""
    rp = params.risk
    yellow, red = rp.yellow_threshold, rp.red_threshold
    health = Health.BAD if base >= red else Health.WARN if base >= yellow else Health.OK
    gpus = [GpuRisk(nr.node, g.index, g.uuid, g.model, health, base, ()) for g in nr.gpus]
    survive = 1.0
    for _ in gpus:  # as assess multiplies them
        survive *= 1.0 - base
    p = 1.0 - survive
    health = Health.BAD if p >= red else Health.WARN if p >= yellow else Health.OK
    return NodeRisk(nr.node, health, p, tuple(gpus), _summary(gpus, p, base), nr.stale_s)


def sits_at_base(nr: NodeRisk, base: float) -> bool:
    """Whether ``assess`` scored every GPU of ``nr`` at ``base``: no signal moved it, no fatal evidence."""
    return nr.health is not Health.UNKNOWN and all(
        not g.contributions and not g.fatal_xids and g.probability == base for g in nr.gpus
    )


def _weight(c: Contribution) -> float:
    return c.weight


def _adjust(p: float, m: float) -> float:
    """Scale the hazard behind ``p`` by ``m`` (same as ``core.learn.adjust``): 1 - (1 - p)^m."""
    if m == 1.0 or p <= 0.0 or p >= 1.0:
        return p
    return -math.expm1(m * math.log1p(-p))


def _unknown(node: SensedNode, fatal: list[Fatal] | tuple[Fatal, ...], stale_s: float | None) -> NodeRisk:
    if fatal:  # a pushed event is evidence even without telemetry
        reason = "fatal: " + fatal[0].reason.removeprefix("fleetyield:").strip()
        return NodeRisk(node.node, Health.BAD, 1.0, (), reason, stale_s)
    return NodeRisk(node.node, Health.UNKNOWN, math.nan, (), f"unknown: {node.reason}", stale_s)


def _summary(gpus: list[GpuRisk], p: float, base: float) -> str:
    parts = []
    if not any(g.contributions for g in gpus):  # the sorted scan below would stop at its first GPU
        return f"risk {p:.3f}: no signal above base ({base:.4f} per GPU)"
    for g in sorted(gpus, key=lambda g: -g.probability):
        if not g.contributions:
            break
        top = ", ".join(
            f"{c.signal} {c.weight:+.1f}" for c in sorted(g.contributions, key=lambda c: -c.weight)
        )
        parts.append(f"gpu {g.index} p={g.probability:.3f} ({top})")
        if len(parts) == 3:
            break
    if not parts:
        return f"risk {p:.3f}: no signal above base ({base:.4f} per GPU)"
    return f"risk {p:.3f}: " + "; ".join(parts)
