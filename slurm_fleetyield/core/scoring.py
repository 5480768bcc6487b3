"""Signal scoring: each enabled signal compiled to a value reader and a log-odds contribution.

Input: ``Params`` (the enabled signals and their weights) and the channel layout of the sensed counters.
Output: ``CompiledSignal`` per signal (the obvious path, used by explain and tests) and ``Scorer`` (the same
arithmetic as one pass per GPU: the risk stage's hot path); ``signal_values`` lists every signal's value and
contribution for one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_fleetyield.core.model import Contribution
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.signals import (
    COUNTER_CHANNELS,
    GPU_TEMP,
    HW_SLOWDOWN_BITS,
    SIGNALS_BY_NAME,
    SLOWDOWN_TEMP,
    SignalSpec,
    xid_channel,
)
from slurm_fleetyield.core.trends import SensedGpu

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
    if kind in ("level", "state"):
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
            if spec.kind in ("level", "state"):
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
        # Skipped inputs: with no counter growth (rates and growth None) every windowed signal is skipped,
        # and when no level/throttle field is set (all absent or 0) those are; what is left is evaluated by
        # the same loop in the same order (same sum, same contributions). ``plans[growth, fields set]``.
        self.quiet_fields = tuple(
            f for code, _n, arg, *_ in self.plan if code in (_LEVEL, _THROTTLE) for f in arg
        )
        self.quiet_plan = tuple(p for p in self.plan if p[0] not in (_LEVEL, _THROTTLE, _WINDOW))
        self.plans = {
            (True, True): self.plan,
            (True, False): tuple(p for p in self.plan if p[0] not in (_LEVEL, _THROTTLE)),
            (False, True): tuple(p for p in self.plan if p[0] != _WINDOW),
            (False, False): self.quiet_plan,
        }
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
        plan = self.plans[g.rates is not None or g.growth is not None, any(map(fget, self.quiet_fields))]
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
