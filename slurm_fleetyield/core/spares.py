"""Hot spares for gangs: how many green nodes to keep ready so that a requeued gang restarts at once.

Input: Slurm's jobs and nodes (``Observations``), the priced nodes (tier, risk, lemon, managed), the
envelopes, ``spares`` params and the learned base multiplier. Output: ``Spares``: the nodes held as spares,
each with its reason, and the figures of the rule.
core/route.py turns a spare's class features into ``fy_spare``,
``fy_ok_gang`` and ``fy_ok_preempt``; with spares on, every node carrying ``fy_ok_train`` also carries
``fy_ok_gang`` and every node carrying ``fy_ok_batch`` also ``fy_ok_preempt`` (job_submit.lua sends gangs to
the first and preemptible work to the second). Slurm's QOS preemption (PreemptMode=REQUEUE) empties a spare
filled with preemptible work when a gang needs it.

The rule, in GPU-seconds:
1. gangs are the running jobs of at least ``gang_min_nodes`` nodes (and pending jobs that need as many of the
   largest nodes); a fault on any node of a gang stops the whole gang, which is requeued;
2. the gangs' faults within ``refill_s`` (the time a newly designated spare takes to empty) are Poisson with
   mean ``L`` = the sum over the gangs' nodes of the node's fatal hazard (its risk over the risk horizon, as
   core/stake.py reads it, absolute: a spare covers any fault) times ``refill_s``;
3. the k-th spare saves the k-th restart's wait: it is held while
   ``P(faults >= k) x G x restart_wait_s >= node GPUs x refill_s``, with ``G`` the gangs' GPUs weighted by
   their share of ``L``, i.e. while the gang GPU-seconds it is expected to save are at least the GPU-seconds
   it stands idle (preemptible work may fill it meanwhile, so this over-counts its cost: a safe side);
4. at least ``min`` while a gang runs or pends, at most ``max_fraction`` of the managed nodes.
With no gang nothing is held, and a fleet of small gangs at ordinary fault rates holds none: the rule cannot
withhold capacity for less than it saves.

Candidates: managed, in service and green, its features derived (no kept list), trainable (core/route.py),
not a lemon, not drained, running no gang; ordered: a spare last tick first (no churn), then fewest GPUs busy
with work that is not preemptible, lowest risk, name.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.model import FY_PREFIX, Envelope, Observations, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.route import trainable
from slurm_fleetyield.core.stake import base_risk, hazard_per_s, node_gpus

SPARE = f"{FY_PREFIX}spare"


@dataclass(frozen=True, slots=True)
class Spares:
    nodes: Mapping[str, str] = field(default_factory=dict)  # spare -> why
    wanted: int = 0  # spares the rule asks for (before the cap and the candidates)
    expected_faults: float = 0.0  # L: the gangs' faults expected within refill_s
    gang_gpus: int = 0  # G
    gang_nodes: int = 0


def poisson_tail(lam: float, k: int) -> float:
    """P(N >= k) for N ~ Poisson(lam)."""
    if k <= 0:
        return 1.0
    term = total = math.exp(-lam)
    for i in range(1, k):
        term *= lam / i
        total += term
    return max(0.0, 1.0 - total)


def size(lam: float, gang_gpus: int, spare_gpus: int, params: Params) -> int:
    """Rule 3: the largest k with P(faults >= k) x G x restart_wait_s >= spare GPUs x refill_s."""
    sp = params.spares
    idle = spare_gpus * sp.refill_s
    k = 0
    while poisson_tail(lam, k + 1) * gang_gpus * sp.restart_wait_s >= idle:
        k += 1
    return k


def choose(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    params: Params,
    multiplier: float = 1.0,
) -> Spares:
    sp = params.spares
    if not sp.enabled:
        return Spares()
    horizon = params.risk.horizon_days * 86_400.0
    largest = max((node_gpus(obs, n) for n in obs.slurm), default=8)
    gangs = [j for j in obs.jobs if j.state == "RUNNING" and len(j.nodes) >= sp.gang_min_nodes]
    pending = any(
        j.state == "PENDING" and -(-j.gpus // largest) >= sp.gang_min_nodes for j in obs.jobs
    )  # fmt: skip
    on_gangs: set[str] = set()
    lam = weighted = 0.0
    for j in gangs:
        lam_j = 0.0
        for n in j.nodes:
            on_gangs.add(n)
            pn = priced.nodes.get(n)
            p = pn.risk if pn is not None else math.nan
            if p != p:
                p = base_risk(node_gpus(obs, n), multiplier, params)
            lam_j += hazard_per_s(p, horizon) * sp.refill_s
        lam += lam_j
        weighted += lam_j * j.gpus
    gang_gpus = round(weighted / lam) if lam > 0 else 0
    wanted = size(lam, gang_gpus, largest, params) if math.isfinite(lam) and lam > 0 else 0
    if gangs or pending:
        wanted = max(wanted, sp.min)
    managed = [n for n, pn in priced.nodes.items() if pn.managed]
    cap = int(sp.max_fraction * len(managed))
    if wanted == 0 or cap == 0:
        return Spares({}, wanted, lam, gang_gpus, len(on_gangs))
    preemptible = {q.lower() for q in sp.preemptible_qos}
    busy: dict[str, float] = {}
    for j in obs.jobs:
        if j.state == "RUNNING" and j.nodes and j.qos.lower() not in preemptible:
            for n in j.nodes:
                busy[n] = busy.get(n, 0.0) + j.gpus / len(j.nodes)
    candidates = []
    for n in managed:
        pn, slurm = priced.nodes[n], obs.slurm.get(n)
        env = envelopes.get(n)
        if slurm is None or env is None or n in on_gangs or pn.keep_fy is not None or pn.lemon:
            continue
        if (pn.feature_tier or pn.tier) is not Tier.GREEN or pn.tier is not Tier.GREEN or slurm.drained:
            continue
        if not trainable(env, pn.lemon):
            continue
        risk = pn.risk if pn.risk == pn.risk else 1.0
        candidates.append((SPARE not in slurm.available_features, busy.get(n, 0.0), risk, n))
    held = sorted(candidates)[: min(wanted, cap)]
    out: dict[str, str] = {}
    total = len(held)
    for i, (_, _, _, n) in enumerate(held, start=1):
        tail = poisson_tail(lam, i)
        if tail * gang_gpus * sp.restart_wait_s >= largest * sp.refill_s:
            why = (
                f"hot spare {i} of {total}: P(>= {i} faults on the gangs' {len(on_gangs)} nodes within "
                f"{sp.refill_s / 3600:g} h) {tail:.3g} x {gang_gpus} GPUs x {sp.restart_wait_s:g} s saved >= "
                f"{largest} GPUs x {sp.refill_s:g} s idle"
            )
        else:
            why = f"hot spare {i} of {total}: the admin floor spares.min = {sp.min} while a gang runs/pends"
        out[n] = why
    return Spares(out, wanted, lam, gang_gpus, len(on_gangs))
