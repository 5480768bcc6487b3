"""Hot spares: how many green nodes to hold empty of ordinary work for gangs that lose a node, and which.

Input: the Slurm view (jobs: nodes, GPUs, state, QOS), priced nodes (tier, risk, lemon), envelopes, this
tick's stake rule (``Withheld``: which nodes withhold a class, the in-service GPUs, the learned base
multiplier), ``Params`` (``spares``, ``risk``, ``stake``). Output: ``Spares``: the nodes held as spares this
tick (node -> the reason route writes), the figures of the rule, a log event when the count changes.

Why: a gang (a job over ``gang_min_nodes`` or more nodes) dies whole when one of its nodes fails; requeued,
it waits until enough nodes are free again (``restart_wait_s``, an ASSUMPTION swept in the simulator). A
spare is a node that carries no class feature (no ordinary work lands there) but ``fy_ok_gang`` and
``fy_ok_preempt``: only gangs and the preemptible QOS's jobs, which Slurm's QOS preemption (REQUEUE) evicts
when a gang needs the node. A spare costs its GPUs idle (or on preemptible work) for as long as it takes to
empty one (``refill_s``, an ASSUMPTION swept too).

Rule, per tick (only with ``spares.enabled``):
1. gangs: running jobs over ``gang_min_nodes`` nodes or more, pending jobs whose GPUs need as many nodes of
   the fleet's largest node (ceil(GPUs / max GPUs per node));
2. the expected gang-node faults within a refill: ``Lambda = sum over the nodes running gangs of the node's
   fatal hazard per second x refill_s``; the hazard is absolute (``-ln(1 - p) / horizon``, core/stake.py),
   not in excess of the fleet's base: a spare serves any fault, expected or not; a node of unknown risk
   counts at the base risk of its size under the learned multiplier, and so does each node a requeued
   pending gang needs (Slurm's restart count above 0: it is about to restart and keeps the spares it will
   need). A gang that never ran is not counted: a pending job cannot lose a node, and on a deep queue it
   may wait for days (openb at load 0.9: ~200 pending gangs held a spare for two weeks, for nothing). A
   node certain to fail (risk 1: a known fatal fault under a gang) is one fault, not a rate: it adds
   one to ``certain`` instead of an infinite hazard to Lambda;
3. the k-th spare (k = 1, 2, ...) is held iff ``P(certain + Poisson(Lambda) >= k) x gang GPUs x
   restart_wait_s >= node GPUs x refill_s``: the gang GPU-seconds it saves (it is used only when at least
   k faults hit gangs within a refill) against the GPU-seconds it stands idle. Gang GPUs: those of the
   gang a fault hits, in expectation (the gangs' GPUs weighted by their share of the expected faults);
   node GPUs: the candidates' median;
4. at least ``spares.min`` while a gang runs or pends; at most ``spares.max_fraction`` of the managed
   nodes, and never so many that spares plus the stake rule's withheld nodes exceed
   ``stake.withhold_cap_fraction`` of the in-service GPUs (a spare withholds every class feature: the
   breaker's cap is the one bound on capacity FleetYield keeps from ordinary work). No gang: no spare;
5. candidates: managed, green, not kept by ``keep_fy``, trainable (core/route.py), not a lemon, not running
   a gang, withholding nothing by the stake rule. Order: a spare already (it carries ``fy_spare`` in Slurm:
   no churn, no state), fewest GPUs busy with work outside the preemptible QOS (what a new spare takes
   ``refill_s`` to empty), lowest risk (unknown last), name.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.model import FY_PREFIX, UNSAID_GPUS, Envelope, LogEvent, Observations, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.route import trainable
from slurm_fleetyield.core.stake import Withheld, base_risk, hazard_per_s, node_gpus

SPARE = f"{FY_PREFIX}spare"
OK_GANG = f"{FY_PREFIX}ok_gang"
OK_PREEMPT = f"{FY_PREFIX}ok_preempt"
_NO_ENVELOPE = Envelope()


@dataclass(frozen=True, slots=True)
class Spares:
    nodes: Mapping[str, str] = field(default_factory=dict)  # spare -> why (route appends it to the reason)
    wanted: int = 0  # spares by rules 3-4 before the candidates ran out
    cap: int = 0  # rule 4's cap
    lam: float = 0.0  # expected gang-node faults within a refill, beyond the certain ones
    certain: int = 0  # gang nodes certain to fail (risk 1): one fault each
    gangs: int = 0  # gang jobs running or pending
    gang_gpus: float = 0.0  # GPUs of the gang a fault hits, in expectation
    node_gpus: int = 0  # a spare's GPUs (the candidates' median)
    events: tuple[LogEvent, ...] = ()


def poisson_tail(lam: float, k: int) -> float:
    """P(Poisson(lam) >= k)."""
    if k <= 0:
        return 1.0
    if lam <= 0.0:
        return 0.0
    term = math.exp(-lam)
    below = term
    for i in range(1, k):
        term *= lam / i
        below += term
    return max(0.0, 1.0 - below)


def wanted(
    lam: float,
    gang_gpus: float,
    node_gpus: int,
    restart_wait_s: float,
    refill_s: float,
    cap: int,
    certain: int = 0,
) -> int:
    """Rule 3: the largest k <= cap whose spare saves at least what it stands idle (the tail falls with k);
    ``certain`` faults come on top of the Poisson ones."""
    idle = node_gpus * refill_s
    k = 0
    while k < cap and poisson_tail(lam, k + 1 - certain) * gang_gpus * restart_wait_s >= idle:
        k += 1
    return k


def spares(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    wh: Withheld,
    params: Params,
    now: float,
) -> Spares:
    """Rules 1-5 (the learned base multiplier: the stake rule's, ``wh.multiplier``)."""
    sp = params.spares
    if not sp.enabled:
        return Spares()
    managed = [n for n, pn in priced.nodes.items() if pn.managed]
    gpus = obs.gpus  # node_gpus, read as a mapping
    max_gpn = max((gpus.get(n, UNSAID_GPUS) for n in managed), default=UNSAID_GPUS)
    horizon = params.risk.horizon_days * 86_400.0
    multiplier = wh.multiplier
    gang_nodes: set[str] = set()
    per_gang: list[tuple[float, int]] = []  # (the gang's expected faults, its GPUs)
    n_gangs = certain = 0
    lam = 0.0
    for j in obs.jobs:
        if j.state == "RUNNING" and len(j.nodes) >= sp.gang_min_nodes:
            n_gangs += 1
            lam_j, sure = 0.0, 0
            for n in j.nodes:
                gang_nodes.add(n)
                h = _hazard(obs, priced, n, horizon, multiplier, params)
                if math.isinf(h):
                    sure += 1
                else:
                    lam_j += h * sp.refill_s
            lam += lam_j
            certain += sure
            per_gang.append((lam_j + sure, j.gpus))
        elif j.state == "PENDING" and j.restarts > 0 and -(-j.gpus // max_gpn) >= sp.gang_min_nodes:
            n_gangs += 1
            need = -(-j.gpus // max_gpn)
            base = hazard_per_s(base_risk(max_gpn, multiplier, params), horizon)
            lam_j = min(base, 1.0) * need * sp.refill_s
            lam += lam_j
            per_gang.append((lam_j, j.gpus))
    if not n_gangs:
        return Spares()
    faults = lam + certain
    gang_gpus = sum(x * g for x, g in per_gang) / faults if faults > 0 else 0.0
    taken = gang_nodes.union(wh.nodes)  # running a gang, or withholding a class by the stake rule
    slurm = obs.slurm
    cands = [
        name
        for name, pn in priced.nodes.items()
        if pn.managed
        and pn.tier is Tier.GREEN
        and pn.keep_fy is None
        and not pn.lemon
        and name not in taken
        and name in slurm
        and trainable(envelopes.get(name, _NO_ENVELOPE), pn.lemon)
    ]
    sizes = sorted([gpus.get(n, UNSAID_GPUS) for n in cands])
    g = sizes[len(sizes) // 2] if sizes else max_gpn
    cap = int(sp.max_fraction * len(managed))
    if wh.service_gpus:
        room = params.stake.withhold_cap_fraction * wh.service_gpus - sum(wh.gpus.get(n, 0) for n in wh.nodes)
        cap = min(cap, max(0, int(room // g)))
    k = min(max(wanted(lam, gang_gpus, g, sp.restart_wait_s, sp.refill_s, cap, certain), sp.min), cap)
    chosen = _first(k, cands, obs, priced, sp.preemptible_qos) if k else []
    why = (
        f"P(>= k gang-node faults within {sp.refill_s / 3600:g} h refill; {certain} certain + "
        f"expected {lam:.2f}) x {gang_gpus:.0f} gang GPUs x {sp.restart_wait_s / 3600:g} h restart wait >= "
        f"{g} GPUs x {sp.refill_s / 3600:g} h idle"
    )
    nodes = {c: f"hot spare ({i} of {len(chosen)}: {why})" for i, c in enumerate(chosen, 1)}
    before = sum(1 for s in slurm.values() if SPARE in s.available_features)  # spares in Slurm now
    events: tuple[LogEvent, ...] = ()
    if len(nodes) != before:
        events = (
            LogEvent(
                now,
                "",
                "spares",
                f"hot spares {before} -> {len(nodes)} ({n_gangs} gang(s); {why}; cap {cap})",
                {
                    "spares": len(nodes),
                    "before": before,
                    "lambda": lam,
                    "certain": certain,
                    "gang_gpus": gang_gpus,
                    "cap": cap,
                },
            ),
        )
    return Spares(nodes, k, cap, lam, certain, n_gangs, gang_gpus, g, events)


def _hazard(
    obs: Observations, priced: Priced, node: str, horizon: float, multiplier: float, params: Params
) -> float:
    pn = priced.nodes.get(node)
    p = pn.risk if pn is not None else math.nan
    if math.isnan(p):
        p = base_risk(node_gpus(obs, node), multiplier, params)
    return hazard_per_s(p, horizon)  # inf: a certain fault (rule 2 counts it as one)


def _first(k: int, cands: list[str], obs: Observations, priced: Priced, preemptible: str) -> list[str]:
    """Rule 5's order, the first ``k`` candidates: a spare already (``fy_spare`` in Slurm), fewest GPUs busy
    outside the preemptible QOS, lowest risk (unknown last), name."""
    busy = _busy(obs, preemptible)
    slurm, nodes = obs.slurm, priced.nodes

    def order(name: str) -> tuple[bool, float, float, str]:
        s, risk = slurm[name], nodes[name].risk
        sticky = SPARE in s.available_features or SPARE in s.active_features
        return (not sticky, busy.get(name, 0.0), risk if risk == risk else math.inf, name)

    return heapq.nsmallest(k, cands, key=order)


def _busy(obs: Observations, preemptible: str) -> dict[str, float]:
    """GPUs per node held by running jobs outside the preemptible QOS (a job's GPUs spread evenly)."""
    out: dict[str, float] = {}
    for j in obs.job_index.placed:  # the jobs with nodes, in queue order
        if j.state != "RUNNING" or j.qos == preemptible:
            continue
        share = j.gpus / len(j.nodes)
        for n in j.nodes:
            out[n] = out.get(n, 0.0) + share
    return out
