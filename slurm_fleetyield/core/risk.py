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
from dataclasses import dataclass
from typing import Any

from slurm_fleetyield.core.model import Contribution, GpuRisk, Health, NodeRisk, fast_new
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.quarantine import Fatal
from slurm_fleetyield.core.sense import Sensed, SensedGpu, SensedNode
from slurm_fleetyield.core.signals import (
    COUNTER_CHANNELS,
    GPU_TEMP,
    HW_SLOWDOWN_BITS,
    SIGNALS_BY_NAME,
    SLOWDOWN_TEMP,
    SignalSpec,
    xid_channel,
)
from slurm_fleetyield.core.state import ControllerState, note_changes

# A value reader: (gpu, past fatal events of this GPU, past fatal events of the node's other GPUs) -> value.
Reader = Callable[[SensedGpu, int, int], float | None]


@dataclass(frozen=True, slots=True)
class CompiledSignal:
    name: str
    read: Reader
    steps: tuple[tuple[float, float], ...]
    lower_is_worse: bool
    unit: str

    def contribution(self, value: float) -> float:
        c = 0.0
        if self.lower_is_worse:
            for threshold, logodds in self.steps:
                if value <= threshold:
                    c = logodds
        else:
            for threshold, logodds in self.steps:
                if value >= threshold:
                    c = logodds
        return c


def compile_signals(params: Params, layout: tuple[str, ...]) -> tuple[CompiledSignal, ...]:
    """Resolve every enabled signal to a reader over the channel layout (once per tick, not per GPU)."""
    rp = params.risk
    slot = {name: i for i, name in enumerate(layout)}
    risk_xid_slots = tuple(slot[xid_channel(x)] for x in params.quarantine.risk_only_xids)
    out = []
    for name in rp.signals:
        spec = SIGNALS_BY_NAME[name]
        scale = rp.weights.get(name, 1.0)
        steps = tuple((t, w * scale) for t, w in rp.steps.get(name, spec.steps))
        read = _reader(spec, slot, risk_xid_slots, rp.default_slowdown_temp_c)
        out.append(CompiledSignal(name, read, steps, spec.lower_is_worse, spec.unit))
    return tuple(out)


def _reader(spec: SignalSpec, slot: Mapping[str, int], xid_slots: tuple[int, ...], slowdown: float) -> Reader:
    kind = spec.kind
    if kind == "level":
        fields = spec.fields

        def level(g: SensedGpu, _h: int, _n: int) -> float | None:
            get = g.reading.fields.get
            vals = [v for v in (get(f) for f in fields) if v is not None]
            return sum(vals) if vals else None

        return level
    if kind in ("rate", "growth", "xid"):
        idx = xid_slots if kind == "xid" else tuple(slot[f] for f in spec.fields if f in COUNTER_CHANNELS)
        scale = spec.scale
        use_rates = kind == "rate"

        def windowed(g: SensedGpu, _h: int, _n: int) -> float | None:
            raw = g.raw
            present = [i for i in idx if raw[i] is not None]
            if not present:
                return None
            series = g.rates if use_rates else g.growth
            if series is None:
                return 0.0
            return sum(series[i] for i in present) * scale

        return windowed
    if kind == "margin":

        def margin(g: SensedGpu, _h: int, _n: int) -> float | None:
            f = g.reading.fields
            temp = f.get(GPU_TEMP)
            if temp is None:
                return None
            limit = f.get(SLOWDOWN_TEMP) or slowdown
            return limit - temp

        return margin
    if kind == "hw_throttle":
        fields = spec.fields

        def throttle(g: SensedGpu, _h: int, _n: int) -> float | None:
            get = g.reading.fields.get
            for f in fields:
                bits = get(f)
                if bits is not None:
                    b = int(bits)
                    return float(sum(1 for bit in HW_SLOWDOWN_BITS if b & bit))
            return None

        return throttle
    if kind == "gpu_history":
        return lambda _g, h, _n: float(h)
    if kind == "node_history":
        return lambda _g, _h, n: float(n)
    raise ValueError(f"signal {spec.name!r} has unknown kind {kind!r}")  # a programming error in signals.py


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


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
            due[name] = (mem.fatal_history, _history_due(mem.fatal_history, events, params, now))
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


def _history_due(
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
    that is another object than when last assessed or whose due time (``_history_due``) has come, and,
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

_LEVEL, _WINDOW, _MARGIN, _THROTTLE, _GPU_HIST, _NODE_HIST = range(6)


class Scorer:
    """The hot path of the risk stage: the same arithmetic as ``CompiledSignal.read`` + ``contribution``, with
    the dispatch flattened into one loop and quiet inputs skipped early (a 100k-GPU tick evaluates ~1.7M
    signal values). ``tests/core/test_risk.py`` checks that both paths agree."""

    def __init__(self, compiled: tuple[CompiledSignal, ...], params: Params, layout: tuple[str, ...]) -> None:
        rp = params.risk
        slot = {name: i for i, name in enumerate(layout)}
        xid_slots = tuple(slot[xid_channel(x)] for x in params.quarantine.risk_only_xids)
        self.base_logit = logit(rp.base_probability)
        self.slowdown = rp.default_slowdown_temp_c
        plan: list[tuple[int, str, Any, float, tuple[tuple[float, float], ...], str]] = []
        arg: Any  # the fields, (slot indices, rates or growth) or nothing, by code
        for cs in compiled:
            spec = SIGNALS_BY_NAME[cs.name]
            if spec.kind == "level":
                code, arg, scale = _LEVEL, spec.fields, 1.0
            elif spec.kind in ("rate", "growth", "xid"):
                idx = xid_slots if spec.kind == "xid" else tuple(slot[f] for f in spec.fields)
                code, arg, scale = _WINDOW, (idx, spec.kind == "rate"), spec.scale
            elif spec.kind == "margin":
                code, arg, scale = _MARGIN, None, 1.0
            elif spec.kind == "hw_throttle":
                code, arg, scale = _THROTTLE, spec.fields, 1.0
            elif spec.kind == "gpu_history":
                code, arg, scale = _GPU_HIST, None, 1.0
            else:
                code, arg, scale = _NODE_HIST, None, 1.0
            plan.append((code, cs.name, arg, scale, cs.steps, cs.unit))
        self.plan = tuple(plan)
        # Quiet-GPU shortcut: with no counter growth (rates and growth None) every windowed signal is skipped,
        # and when no level/throttle field is set (all absent or 0) those are skipped too; what is left is the
        # margin and fatal-history signals, evaluated by the same loop in the same order (same sum, same
        # contributions). Any set field falls back to the full plan.
        self.quiet_fields = tuple(
            f for code, _n, arg, *_ in self.plan if code in (_LEVEL, _THROTTLE) for f in arg
        )
        self.quiet_plan = tuple(p for p in self.plan if p[0] not in (_LEVEL, _THROTTLE, _WINDOW))
        # Of the quiet plan, without fatal history only the margin signal can fire: below this margin (None:
        # the signal is disabled) a quiet GPU is scored in full, above it it has no contribution at all.
        self.quiet_margin = next((p[4][0][0] for p in self.quiet_plan if p[0] == _MARGIN and p[4]), None)
        self.margin_enabled = any(p[0] == _MARGIN for p in self.quiet_plan)

    def score(
        self, g: SensedGpu, n_gpu: int, n_node: int, decay: float = 1.0
    ) -> tuple[float, tuple[Contribution, ...]]:
        """``decay`` scales the fatal-history contributions (see ``history_decay``)."""
        z = self.base_logit
        out: list[Contribution] = []
        fget = g.reading.fields.get
        raw = g.raw
        plan = self.plan
        if g.rates is None and g.growth is None and not any(map(fget, self.quiet_fields)):
            plan = self.quiet_plan
        for code, name, arg, scale, steps, unit in plan:
            if code == _LEVEL:
                v = None
                for f in arg:
                    x = fget(f)
                    if x is not None:
                        v = x if v is None else v + x
                if not v:
                    continue
            elif code == _WINDOW:
                idx, use_rates = arg
                series = g.rates if use_rates else g.growth
                if series is None:
                    continue
                v = 0.0
                present = False
                for i in idx:
                    if raw[i] is not None:
                        present = True
                        v += series[i]
                if not present or not v:
                    continue
                v *= scale
            elif code == _MARGIN:
                temp = fget(GPU_TEMP)
                if temp is None:
                    continue
                v = (fget(SLOWDOWN_TEMP) or self.slowdown) - temp
                if v > steps[0][0]:
                    continue
                c = 0.0
                for t, w in steps:
                    if v <= t:
                        c = w
                if c:
                    z += c
                    out.append(Contribution(name, v, c, unit))
                continue
            elif code == _THROTTLE:
                bits = None
                for f in arg:
                    bits = fget(f)
                    if bits is not None:
                        break
                if not bits:
                    continue
                b = int(bits)
                v = float(sum(1 for bit in HW_SLOWDOWN_BITS if b & bit))
                if not v:
                    continue
            elif code == _GPU_HIST:
                if not n_gpu:
                    continue
                v = float(n_gpu)
            else:
                if not n_node:
                    continue
                v = float(n_node)
            c = 0.0
            for t, w in steps:
                if v >= t:
                    c = w
            if code >= _GPU_HIST:
                c *= decay
            if c:
                z += c
                out.append(Contribution(name, v, c, unit))
        return z, tuple(out)


def fatal_uuids(state: ControllerState, node: str, params: Params, now: float) -> list[str]:
    """GPU uuids ("" for node-wide) of the node's distinct fatal events within ``fatal_history_days``
    (``fatal_events`` without the times)."""
    return [u for _, u in fatal_events(state, node, params, now)]


def history_decay(events: list[tuple[float, str]], params: Params, now: float) -> float:
    """Scale of the repeat-offender contributions: 2^(-age / single_fault_half_life_days) when ``events``
    (``fatal_events``) is one isolated failure, else 1 (none, or a repeat offender: full weights).

    Titan (Ostrouchov et al., SC '20; olcf/TitanGPULife gc_full.csv): after a GPU's return to service
    following its first fatal event (in place or re-inserted), the hazard of a second one relative to
    never-failed GPUs fits exp(5.78 x 2^(-t / 80 d)): x342 in the first week, x106 in days 7-30, x48 in days
    30-90, x4.0 beyond (``sim/calibrate.post_failure_hazard``). The age is taken in whole
    ``single_fault_decay_step_hours`` steps, so the value is constant between steps."""
    half_life = params.risk.single_fault_half_life_days
    if half_life is None or len(events) != 1:
        return 1.0
    age = max(0.0, now - events[0][0])
    step = params.risk.single_fault_decay_step_hours * 3_600.0
    if step > 0:
        age -= age % step
    return 2.0 ** (-age / (half_life * 86_400.0))


def fatal_events(state: ControllerState, node: str, params: Params, now: float) -> list[tuple[float, str]]:
    """(time, GPU uuid or "" for node-wide) of the node's distinct fatal events within ``fatal_history_days``.

    One fault reaches the history through several reports: an XID 79 arrives as the pushed XID, the pushed
    'GPU missing' of the same GPU and the scrape's unnamed 'GPU missing'. The repeat-offender signals count
    failures (Titan: a GPU that had already failed), so reports closer than ``learn.lemon_dedup_s`` (the
    project's "one failure" window, as for lemons) are one: a GPU's repeats within it are dropped, and an
    unnamed report within it of any other report is that report's twin."""
    memory = state.nodes.get(node)
    if memory is None or not memory.fatal_history:
        return []
    start = now - params.risk.fatal_history_days * 86_400.0
    # The answer only changes when the history object, the params or the set of events inside the window
    # does: kept in ``state.memo`` (not persisted) with the range of window starts it holds for. Callers
    # must not mutate the list.
    memo = state.memo.setdefault("fatal_events", {})
    hit = memo.get(node)
    if hit is not None and hit[0] is memory.fatal_history and hit[1] is params and hit[2] < start <= hit[3]:
        return hit[4]  # type: ignore[no-any-return]
    out = _fatal_events(memory.fatal_history, start, params.learn.lemon_dedup_s)
    lo = max((t for t, _ in memory.fatal_history if t < start), default=-math.inf)
    hi = min((t for t, _ in memory.fatal_history if t >= start), default=math.inf)
    memo[node] = (memory.fatal_history, params, lo, hi, out)
    return out


def _fatal_events(
    history: tuple[tuple[float, str], ...], start: float, dedup: float
) -> list[tuple[float, str]]:
    hist = sorted(h for h in history if h[0] >= start)
    if len(hist) < 2:
        return hist
    named = [t for t, u in hist if u]
    last: dict[str, float] = {}
    out: list[tuple[float, str]] = []
    for t, u in hist:
        if u in last and t - last[u] <= dedup:
            continue
        if not u and any(abs(t - x) <= dedup for x in named):
            continue
        last[u] = t
        out.append((t, u))
    return out


def signal_values(
    g: SensedGpu, compiled: tuple[CompiledSignal, ...], n_gpu: int, n_node: int, decay: float = 1.0
) -> tuple[tuple[str, float | None, float], ...]:
    """Every enabled signal's (name, value, contribution) for one GPU: the slow, obvious path (explain).
    ``decay`` scales the fatal-history signals' contributions (``history_decay``)."""
    out = []
    for cs in compiled:
        v = cs.read(g, n_gpu, n_node)
        c = 0.0 if v is None else cs.contribution(v)
        if SIGNALS_BY_NAME[cs.name].kind in ("gpu_history", "node_history"):
            c *= decay
        out.append((cs.name, v, c))
    return tuple(out)


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
