"""Learn: hold the risk model to account, recalibrate it from evidence, and flag lemon nodes.

Input: the previous ``LearnMemory``, this tick's risks (what the model said) and node decisions (tiers: only
nodes in service are predicted), the fatal findings acted on, the
lifecycle memories (nodes taken out of service for other reasons are censored), the multipliers the risk stage
used, ``Params`` and ``now``. Output: the next ``LearnMemory`` and a ``Calibration`` (reliability table, Brier
score, learned multipliers).

Predictions: each node in service has one open prediction "P(fatal within the horizon) = p, made at t". It
resolves as an event when fatal evidence on the node is acted on before ``t + horizon``, as a non-event when
the horizon passes; a node drained for another reason (approval, admin) is censored (dropped, no verdict). A
new prediction is made when the node has none. Cost: resolutions and new predictions only (the due scan runs
when the earliest due time has passed), so a steady tick is O(changed nodes).

Recalibration (empirical Bayes, Poisson-Gamma): every prediction carries the expected events of the RAW model
(multipliers removed), split by signal bucket: ``base`` for GPUs with no signal, else the GPU's dominant
signal. An event is attributed to the bucket of its GPU (or shared by expected share when node-wide). With a
Gamma(prior, prior) prior on each bucket's hazard multiplier the posterior mean is
    multiplier = (prior_strength + observed events) / (prior_strength + expected events),
bounded to [min_multiplier, max_multiplier] and republished only when it moved by more than
``publish_tolerance`` of the published value (each new value re-scores every GPU of its bucket).
``core/risk.py`` scales each GPU's hazard by its bucket's multiplier: p' = 1 - (1 - p)^m. With no evidence
every multiplier is 1 and risk is the published-rate model.

Lemons: a node with ``lemon_failures`` fatal failures (evidence closer than ``lemon_dedup_s`` is one failure)
within ``lemon_window_s`` is a lemon (Meta RSC: ~1.2% of nodes cause a large share of interruptions): it keeps
batch work when healthy but loses gang and premium-class admission (``core/route.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slurm_fleetyield.core.lifecycle import LifecycleMemory, Stage
from slurm_fleetyield.core.model import Calibration, GpuRisk, NodeDecision, NodeRisk, ReliabilityBin, Tier
from slurm_fleetyield.core.params import LearnParams, Params
from slurm_fleetyield.core.quarantine import Fatal
from slurm_fleetyield.core.state import LearnMemory, NodeMemory, Prediction

BASE = "base"
PREDICTED_TIERS = frozenset({Tier.GREEN, Tier.YELLOW, Tier.RED, Tier.PROBATION})


def bucket_of(g: GpuRisk) -> str:
    """``base`` for a GPU no signal moved, else its dominant (largest log-odds) signal."""
    if not g.contributions:
        return BASE
    return max(g.contributions, key=lambda c: c.weight).signal


def adjust(p: float, m: float) -> float:
    """Scale the hazard behind probability ``p`` by ``m``: 1 - (1 - p)^m."""
    if m == 1.0 or p <= 0.0 or p >= 1.0:
        return p
    return -math.expm1(m * math.log1p(-p))


def bin_edges(n: int) -> tuple[float, ...]:
    """Log-spaced edges 0, 1e-4 ... 1: fleet probabilities live in the first decades."""
    return (0.0, *(10 ** (-4 + 4 * i / (n - 1)) for i in range(n - 1)), 1.0 + 1e-12)[: n + 1]


def learn(
    mem: LearnMemory,
    risks: Mapping[str, NodeRisk],
    decisions: Mapping[str, NodeDecision],
    processed: tuple[Fatal, ...],
    lifecycle: Mapping[str, LifecycleMemory],
    params: Params,
    now: float,
) -> tuple[LearnMemory, Calibration]:
    lp = params.learn
    n_bins = lp.bins
    preds = mem.predictions
    counts = list(mem.bin_count) if len(mem.bin_count) == n_bins else [0] * n_bins
    sum_p = list(mem.bin_p) if len(mem.bin_p) == n_bins else [0.0] * n_bins
    sum_y = list(mem.bin_y) if len(mem.bin_y) == n_bins else [0.0] * n_bins
    observed = dict(mem.observed)
    expected = dict(mem.expected)
    brier, resolved = mem.brier_sum, mem.resolved
    edges = bin_edges(n_bins)
    changed = False
    new_preds: dict[str, Prediction] | None = None

    def resolve(p: Prediction, y: float, gpu: int | None) -> None:
        nonlocal brier, resolved
        i = _bin(p.p, edges)
        counts[i] += 1
        sum_p[i] += p.p
        sum_y[i] += y
        brier += (p.p - y) ** 2
        resolved += 1
        for b, e in p.parts:
            expected[b] = expected.get(b, 0.0) + e
        if y:
            if gpu is not None and p.gpu_buckets:
                b = dict(p.gpu_buckets).get(gpu, BASE)
                observed[b] = observed.get(b, 0.0) + 1.0
            else:
                tot = sum(e for _, e in p.parts) or 1.0
                for b, e in p.parts:
                    observed[b] = observed.get(b, 0.0) + e / tot

    # events: fatal evidence acted on this tick
    for f in processed:
        p = (preds if new_preds is None else new_preds).get(f.node)
        if p is not None and f.time <= p.due:
            if new_preds is None:
                new_preds = dict(preds)
            del new_preds[f.node]
            resolve(p, 1.0, f.gpu)
            changed = True
    # censored: taken out of service for another reason
    for name, lc in lifecycle.items():
        if lc.stage is not Stage.IN_SERVICE and name in (preds if new_preds is None else new_preds):
            if new_preds is None:
                new_preds = dict(preds)
            del new_preds[name]
            changed = True
    # non-events: horizon passed
    next_due = mem.next_due
    if next_due is not None and now >= next_due:
        if new_preds is None:
            new_preds = dict(preds)
        for name, p in list(new_preds.items()):
            if now >= p.due:
                del new_preds[name]
                resolve(p, 0.0, None)
        changed = True
    # new predictions for nodes in service without one
    cur = new_preds if new_preds is not None else preds
    if len(cur) < len(risks):
        h = params.risk.horizon_days * 86_400.0
        mult = mem.multipliers if lp.enabled else {}
        for name in [n for n in risks if n not in cur]:  # the few without a prediction, in risks' order
            r, d = risks[name], decisions.get(name)
            if d is None or d.tier not in PREDICTED_TIERS:
                continue
            pr = r.probability
            if (
                math.isnan(pr)
                or pr >= 1.0
                or (
                    name in lifecycle
                    and lifecycle[name].stage is not Stage.IN_SERVICE
                    and lifecycle[name].stage is not Stage.PROBATION
                )
            ):
                continue
            if new_preds is None:
                new_preds = cur = dict(preds)
            new_preds[name] = _predict(name, r, now, h, mult)
            changed = True
    if not changed:
        return mem, _calibration(mem, edges, lp)
    final = new_preds if new_preds is not None else preds
    due = min((p.due for p in final.values()), default=None)
    mults = _published(mem.multipliers, observed, expected, lp)
    out = LearnMemory(
        final, due, tuple(counts), tuple(sum_p), tuple(sum_y), brier, resolved, observed, expected, mults
    )
    return out, _calibration(out, edges, lp)


def _published(
    old: Mapping[str, float], observed: Mapping[str, float], expected: Mapping[str, float], lp: LearnParams
) -> Mapping[str, float]:
    """The multipliers to publish: each bucket's bounded posterior mean, except that a published value is kept
    while the mean stays within ``publish_tolerance`` of it (``old`` itself when nothing moved that far)."""
    tol = lp.publish_tolerance
    out: dict[str, float] = {}
    for b, e in expected.items():
        m = min(
            lp.max_multiplier,
            max(lp.min_multiplier, (lp.prior_strength + observed.get(b, 0.0)) / (lp.prior_strength + e)),
        )
        prev = old.get(b)
        if prev is not None and abs(m - prev) <= tol * prev:
            m = prev
        out[b] = m
    return old if out == old else out


def _predict(name: str, r: NodeRisk, now: float, horizon_s: float, mult: Mapping[str, float]) -> Prediction:
    parts: dict[str, float] = {}
    gb = []
    quiet = 0.0
    for g in r.gpus:
        if not g.contributions:  # the common case: no signal, the (adjusted) base rate
            quiet += g.probability
            continue
        b = bucket_of(g)
        m = mult.get(b, 1.0)
        parts[b] = parts.get(b, 0.0) + (adjust(g.probability, 1.0 / m) if m != 1.0 else g.probability)
        gb.append((g.index, b))
    if quiet:
        m = mult.get(BASE, 1.0)
        n = sum(1 for g in r.gpus if not g.contributions)
        # every quiet GPU has the same adjusted base probability: un-adjust it once
        parts[BASE] = n * adjust(quiet / n, 1.0 / m) if m != 1.0 else quiet
    return Prediction(name, now, horizon_s, r.probability, tuple(sorted(parts.items())), tuple(gb))


def _bin(p: float, edges: tuple[float, ...]) -> int:
    for i in range(len(edges) - 1):
        if p < edges[i + 1]:
            return i
    return len(edges) - 2


def _calibration(mem: LearnMemory, edges: tuple[float, ...], lp: LearnParams) -> Calibration:
    bins = []
    for i in range(len(edges) - 1):
        n = mem.bin_count[i] if i < len(mem.bin_count) else 0
        pm = mem.bin_p[i] / n if n else math.nan
        fy = mem.bin_y[i] / n if n else math.nan
        bins.append(ReliabilityBin(edges[i], min(edges[i + 1], 1.0), pm, fy, n))
    brier = mem.brier_sum / mem.resolved if mem.resolved else math.nan
    return Calibration(tuple(bins), brier, mem.resolved, dict(mem.multipliers), len(mem.predictions))


def is_lemon(m: NodeMemory | None, now: float, lp: LearnParams) -> bool:
    if m is None or len(m.fatal_history) < lp.lemon_failures:
        return False
    start = now - lp.lemon_window_s
    failures, last = 0, -math.inf
    for t, _ in m.fatal_history:
        if t < start:
            continue
        if t - last > lp.lemon_dedup_s:
            failures += 1
        last = t
    return failures >= lp.lemon_failures
