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
from collections.abc import Callable, Mapping
from typing import Any

from slurm_fleetyield.core.fatal_history import fatal_events, fatal_uuids, history_decay
from slurm_fleetyield.core.model import Contribution, GpuRisk, Health, NodeRisk, fast_new
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.quarantine import Fatal
from slurm_fleetyield.core.scoring import CompiledSignal, Scorer, compile_signals, logit, signal_values
from slurm_fleetyield.core.sense import Sensed, SensedGpu, SensedNode
from slurm_fleetyield.core.signals import (
    GPU_TEMP,
    SLOWDOWN_TEMP,
)
from slurm_fleetyield.core.state import ControllerState, note_changes

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
    sensed: Sensed, fatal: tuple[Fatal, ...], state: ControllerState, params: Params, now: float
) -> Mapping[str, NodeRisk]:
    rp = params.risk
    # The scorer depends only on the params and the channel layout: built again only when either changed
    made = state.memo.setdefault("scorer", {})
    if made.get("params") is params and made.get("layout") == sensed.layout:
        scorer = made["scorer"]
    else:
        scorer = Scorer(compile_signals(params, sensed.layout), params, sensed.layout)
        made.update(params=params, layout=sensed.layout, scorer=scorer)
    base = rp.base_probability
    mult = state.learn.multipliers if params.learn.enabled else {}
    if mult:  # learned hazard multipliers (core/learn.py): the quiet GPUs' base, and per dominant signal
        base = _adjust(base, mult.get("base", 1.0))
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
    # A node whose sensed GPUs are the very objects of its last scoring, with the same fatal history, no
    # fatal evidence then or now, the same params, base and learned multipliers, scores the same: reuse it.
    memo = state.memo.setdefault("risk", {})
    mkey = (params, base, sensed.layout, mult)
    memories = state.nodes
    base_out, items, due, rebase = _carried(sensed, fatal_by_node, state, mkey, now)
    out: dict[str, NodeRisk] = dict(base_out) if base_out is not None else {}
    rebased: list[str] = []
    if rebase and base_out is not None:
        # only the learned base moved: a node left out of ``items`` whose GPUs all sat at the old base (no
        # signal, no fatal evidence, the same GPUs and history) scores every GPU at the new base
        todo = {n for n, _ in items}
        old_base = state.memo["risk_last"]["mkey"][1]
        for name, nr in base_out.items():
            if name in todo or nr.health is Health.UNKNOWN:
                continue
            hit = memo.get(name)
            if hit is None or hit[2] is not nr or not _at_base(nr.gpus, old_base):
                items.append((name, sensed.nodes[name]))  # not known to sit at the base: score it
                continue
            gpus = []
            survive = 1.0
            for g in nr.gpus:
                gpus.append(_new_gpu_risk(name, g.index, g.uuid, g.model, base_health, base, ()))
                survive *= 1.0 - base
            p = 1.0 - survive
            health = Health.BAD if p >= red else Health.WARN if p >= yellow else Health.OK
            out[name] = new = NodeRisk(name, health, p, tuple(gpus), _summary(gpus, p, base), nr.stale_s)
            memo[name] = (hit[0], mkey, new, hit[3])
            rebased.append(name)
    for name, node in items:
        mem = memories.get(name)
        if mem is not None and mem.fatal_history:
            events = fatal_events(state, name, params, now)
            history = [u for _, u in events]
            decay = history_decay(events, params, now)
            due[name] = (mem.fatal_history, history_due(mem.fatal_history, events, params, now))
        else:
            history, decay = [], 1.0
        node_fatal = fatal_by_node.get(name, ())
        if not node.fresh:
            out[name] = _unknown(node, node_fatal, sensed.stale_s(name))
            continue
        if not node_fatal:
            hit = memo.get(name)
            if hit is not None and hit[0] is node.gpus and hit[1] == mkey and hit[3] == (history, decay):
                nr = hit[2]
                stale = sensed.stale_s(name)
                if nr.stale_s != stale:
                    nr = NodeRisk(name, nr.health, nr.probability, nr.gpus, nr.reason, stale)
                out[name] = nr
                continue
        fatal_gpu: dict[str, list[Fatal]] = {}
        for f in node_fatal:
            if f.uuid is not None or f.gpu is not None:
                fatal_gpu.setdefault(f.uuid or f"#{f.gpu}", []).append(f)
        gpus = []
        survive = 1.0
        n_hist = len(history)
        for g in node.gpus:  # _gpu_risk, inlined: this loop runs once per GPU of the fleet
            r = g.reading
            gf = (fatal_gpu.get(r.uuid) or fatal_gpu.get(f"#{r.index}")) if fatal_gpu else None
            if not gf and not n_hist and g.rates is None and g.growth is None:
                fget = r.fields.get
                if not any(map(fget, quiet_fields)):  # Scorer.score's quiet plan, inlined
                    temp = fget(GPU_TEMP) if margin_enabled else None
                    if temp is None or (
                        quiet_margin is not None and (fget(SLOWDOWN_TEMP) or slowdown) - temp > quiet_margin
                    ):  # nothing fires: the base probability
                        gr = _new_gpu_risk(name, r.index, r.uuid, r.model, base_health, base, ())
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
                gr = _new_gpu_risk(name, r.index, r.uuid, r.model, health, gp, contributions)
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
        out[name] = nr = NodeRisk(name, health, p, tuple(gpus), reason, sensed.stale_s(name))
        if not node_fatal:
            memo[name] = (node.gpus, mkey, nr, (history, decay))
        else:
            memo.pop(name, None)
    # the nodes with a GPU whose score read a learned multiplier (one with contributions): the only ones a
    # change of the signals' multipliers alone can move (_carried)
    if base_out is None:
        scored = {n for n, nr in out.items() if any(g.contributions for g in nr.gpus)}
    else:
        scored = set(state.memo["risk_last"]["scored"])
        for n, _ in items:
            if any(g.contributions for g in out[n].gpus):
                scored.add(n)
            else:
                scored.discard(n)
    state.memo["risk_last"] = {
        "since": sensed.nodes,
        "out": out,
        "mkey": mkey,
        "fatal": frozenset(fatal_by_node),
        "due": due,
        "scored": frozenset(scored),
    }
    note_changes(
        state.memo, "risk", out, base_out, [*(n for n, _ in items), *rebased] if base_out is not None else ()
    )
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


def _carried(
    sensed: Sensed,
    fatal_by_node: Mapping[str, list[Fatal]],
    state: ControllerState,
    mkey: tuple[Any, ...],
    now: float,
) -> tuple[Mapping[str, NodeRisk] | None, list[tuple[str, SensedNode]], dict[str, tuple[Any, float]], bool]:
    """The answer to start from and the nodes to assess: last tick's answer and only the nodes that may
    differ from it, when that is known; else nothing and every node.

    Known when sense found the nodes that changed against the very nodes last tick's answer was assessed
    from (``Sensed.changed``), the params, base and layout are the same, and ``state.nodes`` is the very
    mapping ``memory.remember`` indexed (``fatal_history_index``: its nodes with a fatal history). Assessed
    again: the changed nodes, the nodes with fatal evidence now or last tick, those with a fatal history
    that is another object than when last assessed or whose due time (``history_due``) has come, and,
    when the learned multipliers changed, the nodes with a GPU whose score read one (``scored``). Every
    other node is fresh now and was then, with the very same GPUs and staleness, no evidence, and no
    history or the very same one with nothing due, and read no multiplier that moved: it scores what it
    scored last tick. The third value: per node with a history, (that history, due). The fourth: whether
    the learned base moved too (params and layout the same), when every other node whose GPUs all sat at
    the old base has them at the new one (``assess``)."""
    nodes = sensed.nodes
    last = state.memo.get("risk_last")
    hist = state.memo.get("fatal_history_index")
    if (
        sensed.changed is None
        or last is None
        or last["since"] is not sensed.since
        or hist is None
        or hist[0] is not state.nodes
    ):
        return None, list(nodes.items()), {}, False
    todo = {*sensed.changed, *fatal_by_node, *last["fatal"]}
    was = last["mkey"]
    if was != mkey:
        # params and layout the same: only learned multipliers moved. A signal's is read only by a GPU with
        # contributions; the base only by one without (its probability is the base): assess rebases those
        if was[0] is not mkey[0] or was[2] != mkey[2]:
            return None, list(nodes.items()), {}, False
        todo |= last["scored"]
    due = last["due"]
    memories = state.nodes
    for n in hist[1]:
        d = due.get(n)
        m = memories.get(n)
        if d is None or m is None or d[0] is not m.fatal_history or now >= d[1] - 1.0:  # 1 s early: floats
            todo.add(n)
    return last["out"], [(n, nodes[n]) for n in sorted(todo) if n in nodes], dict(due), was[1] != mkey[1]


def _at_base(gpus: tuple[GpuRisk, ...], base: float) -> bool:
    """Whether every GPU was scored at ``base``: no signal moved it and no fatal evidence."""
    return all(not g.contributions and not g.fatal_xids and g.probability == base for g in gpus)


def _weight(c: Contribution) -> float:
    return c.weight


def _adjust(p: float, m: float) -> float:
    """Scale the hazard behind ``p`` by ``m`` (same as ``core.learn.adjust``): 1 - (1 - p)^m."""
    if m == 1.0 or p <= 0.0 or p >= 1.0:
        return p
    return -math.expm1(m * math.log1p(-p))


def _gpu_risk(
    node: str,
    g: SensedGpu,
    fatal: list[Fatal] | None,
    scorer: Scorer,
    base: float,
    n_gpu: int,
    n_node: int,
    yellow: float,
    red: float,
    decay: float = 1.0,
) -> GpuRisk:
    r = g.reading
    z, contributions = scorer.score(g, n_gpu, n_node, decay)
    if fatal:
        xids = tuple(sorted({f.xid for f in fatal if f.xid is not None}))
        return GpuRisk(node, r.index, r.uuid, r.model, Health.BAD, 1.0, contributions, xids)
    p = 1.0 / (1.0 + math.exp(-z)) if contributions else base
    health = Health.BAD if p >= red else Health.WARN if p >= yellow else Health.OK
    return GpuRisk(node, r.index, r.uuid, r.model, health, p, contributions)


_new_gpu_risk: Callable[..., GpuRisk] = fast_new(GpuRisk)  # built once per GPU per tick (model.fast_new)


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
