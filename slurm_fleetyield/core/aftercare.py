"""Aftercare: what counts as evidence of a fault after a remediation (an incident in canary or probation).

Input: a node's ``NodeRisk`` and ``SensedNode`` of this tick, the counters recorded when its remediation
proved OK (``LifecycleMemory.baseline``, taken by ``baseline``), the risk-only XIDs and the red threshold.
Output: ``incident``: None, or the post-remediation risk with the fault's key (GPU and dominant signal).

Why: ECC and row-remap counters are non-volatile: a GPU reset or a reboot does not clear them, and the
windowed rates and growths over any counter still hold what grew before the remediation. Read as they are,
the scar that justified the drain would be "an incident in canary" after every remediation, and three of
them an RMA. The rule: a contribution to the risk is evidence after the remediation only when its input
moved since then:
- counter-backed signals (``level``, ``rate``, ``growth``, ``xid``): one of their fields (or risk-only XID
  totals) is above its baseline value; a pending remap still pending is the same remap, not a new one;
- present-state readings (``margin``, ``hw_throttle``): a reset or reboot resets them, so what they show now
  is now;
- fatal history (``gpu_history``, ``node_history``): never; a new fatal fault takes the FATAL path.
The post-remediation risk of a GPU is the logistic model over those contributions only (base + their
log-odds, as ``core/risk.py`` combines them); the node's is 1 - prod(1 - p_gpu). An incident needs it at or
above red. A failed canary job and a new fatal XID are evidence by themselves (the lifecycle's own events).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_fleetyield.core.model import Contribution, NodeRisk
from slurm_fleetyield.core.sense import SensedNode
from slurm_fleetyield.core.signals import SIGNALS, SIGNALS_BY_NAME

COUNTER_KINDS = frozenset({"level", "rate", "growth"})
PRESENT_KINDS = frozenset({"margin", "hw_throttle", "state"})
BASELINE_FIELDS: tuple[str, ...] = tuple(
    sorted({f for s in SIGNALS if s.kind in COUNTER_KINDS for f in s.fields})
)
"""Every field a counter-backed signal reads: what the baseline records per GPU."""

Baseline = tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Incident:
    probability: float  # post-remediation risk of the node
    key: str  # ``incident:gpu<i>:<signal>``: the fault, for counting failures once per fault
    detail: str


def baseline(node: SensedNode, risk_only_xids: tuple[int, ...]) -> Baseline:
    """The counters of this sample, ``<gpu index>:<field>`` and ``<gpu index>:xid:<n>`` -> value."""
    out: list[tuple[str, float]] = []
    for g in node.gpus:
        r = g.reading
        for f in BASELINE_FIELDS:
            v = r.fields.get(f)
            if v is not None:
                out.append((f"{r.index}:{f}", float(v)))
        for x in risk_only_xids:
            v = r.xid_totals.get(x)
            if v is not None:
                out.append((f"{r.index}:xid:{x}", float(v)))
    return tuple(sorted(out))


def extend(old: Baseline, now: Baseline) -> Baseline:
    """``old`` plus the keys first seen now (a field not exported at the baseline: its value when first seen
    is its baseline, never new evidence)."""
    known = {k for k, _ in old}
    added = [(k, v) for k, v in now if k not in known]
    return tuple(sorted((*old, *added))) if added else old


def incident(
    risk: NodeRisk,
    node: SensedNode,
    base: Baseline,
    risk_only_xids: tuple[int, ...],
    base_probability: float,
    red: float,
) -> Incident | None:
    """The post-remediation risk of the node when it is at or above ``red``, else None."""
    if not risk.gpus or not node.fresh:
        return None
    before = dict(base)
    readings = {g.reading.index: g.reading for g in node.gpus}
    z0 = math.log(base_probability / (1.0 - base_probability))
    survive = 1.0
    strongest: tuple[float, int, str] | None = None
    for gr in risk.gpus:
        reading = readings.get(gr.index)
        if reading is None:
            continue
        now = {f"{gr.index}:{f}": float(v) for f, v in reading.fields.items() if v is not None}
        now.update({f"{gr.index}:xid:{x}": float(v) for x, v in reading.xid_totals.items()})
        new = [c for c in gr.contributions if _after(c, gr.index, now, before, risk_only_xids)]
        if not new:
            survive *= 1.0 - base_probability
            continue
        z = z0 + sum(c.weight for c in new)
        survive *= 1.0 - 1.0 / (1.0 + math.exp(-z))
        top = max(new, key=lambda c: c.weight)
        if strongest is None or top.weight > strongest[0]:
            strongest = (top.weight, gr.index, top.signal)
    p = 1.0 - survive
    if strongest is None or p < red:
        return None
    _, gpu, signal = strongest
    return Incident(p, f"incident:gpu{gpu}:{signal}", f"risk {p:.2f} >= red {red:g} since the remediation")


def _after(
    c: Contribution,
    gpu: int,
    now: Mapping[str, float],
    before: Mapping[str, float],
    risk_only_xids: tuple[int, ...],
) -> bool:
    spec = SIGNALS_BY_NAME.get(c.signal)
    if spec is None:
        return False
    if spec.kind in PRESENT_KINDS:
        return True
    if spec.kind in COUNTER_KINDS:
        keys = [f"{gpu}:{f}" for f in spec.fields]
    elif spec.kind == "xid":
        keys = [f"{gpu}:xid:{x}" for x in risk_only_xids]
    else:  # fatal history: evidence from before, by definition
        return False
    return any(k in now and now[k] > before.get(k, now[k]) for k in keys)
