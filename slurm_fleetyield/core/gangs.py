"""Gang widening: training work that cannot start on green nodes borrows yellow ones.

Input: the Slurm view (nodes and jobs), priced nodes, envelopes, the risks (what made a node yellow), the
previous state's node memories (which yellow nodes carried ``fy_ok_train`` last tick), ``Params``
(``gangs``; ``settle.premium_needing_classes``).
Output: ``GangLoans``: the yellow nodes that carry ``fy_ok_train`` this tick, the figures behind it, the
reason route appends to theirs, and log events when the lent set changes.

Why: ``fy_ok_train`` sits on green nodes only (core/route.py). After a fatal fault a repaired node stays
yellow for weeks (the single-fault decay, 80 d half-life: ~16 d above the yellow threshold), so in a fleet
with many faults an 8-node pretrain gang waits for eight green nodes while yellow ones with the same hardware
run batch or sit idle. Simulated (docs/results.md, "Gang widening"): the high-fault fleet lost 10.5% net
goodput against unmodified Slurm that way, 97% of it pretrain work never done. Yellow is a risk tier, not a
verdict: a training job checkpoints, and a gang that waits does no work at all.

Rule, per tick:
1. demand: the PENDING jobs of a ``gangs.classes`` class (pretrain: the class job_submit gives
   ``fy_ok_train``) and, with ``gangs.unclassified``, jobs without a class (job_submit's class ``default``,
   also ``fy_ok_train``), each cut into per-node pieces (whole nodes of the largest node's GPU count, and the
   rest). A job's pool is the premium nodes when its class is premium-needing (the nodes it is kept for),
   all nodes otherwise (an unclassified job: all nodes);
2. supply: the idle GPUs of in-service pool nodes that carry ``fy_ok_train`` on their own (green, full NVLink
   or none, not a lemon). Each job's pieces are fitted into them (best fit, as premium widening fits decode):
   the pieces that fit nowhere are its shortfall, in nodes; the largest shortfall over the waiting jobs
   counts;
3. that many yellow pool nodes (same envelope rule, in service, not in a lifecycle stage, not lemons) carry
   ``fy_ok_train`` too: nodes lent last tick first (a loan does not hop between equal candidates), then the
   lowest risk, then by name. With ``gangs.lend_degrading = false`` a node degrading now is not lent: one
   whose risk a counter moved that grew within the trend windows (ECC errors, remapped rows, NVLink or PCIe
   errors, throttling, risk-only XIDs: the precursor some fatal faults give); a node yellow through its
   fatal history (repaired) or a stable level (rows remapped long ago) stays lendable. The default lends
   degrading nodes too: simulated, sparing them gained nothing in the default world and lost 1-5 points in
   the Titan worlds (a checkpointing gang that may die loses less than one that waits; docs/results.md,
   "Degrading nodes");
   A lent node need not be idle: the loan goes to the lowest-risk yellow nodes, and the gang starts when
   they free up. Passing over busy ones for idle, riskier ones was tried (8898c74, reverted): simulated,
   +0.55 points on openb 32x30 but -0.24 in the high-fault fleet and -4.4 / -7.8 in its Titan worlds,
   where the idle yellow node is often the one just back from repair (docs/results.md, "Gang widening");
4. nothing is lent while no such job waits; a loan ends at the first tick without a shortfall. A job that
   started on a lent node keeps running (Slurm does not stop jobs when features change).
A lent node keeps its yellow weight (lower than green's: work lands on yellow before green), so a job that
needs more nodes than are idle and green takes the lent yellow ones for the rest. Red, quarantined and
rehabilitating nodes are never lent; neither are lemons.

Stateless: the lent set of the last tick is read from the node memories (a yellow node remembered with
``fy_ok_train``), so nothing new is persisted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_fleetyield.core.model import (
    Envelope,
    LogEvent,
    NodeRisk,
    Observations,
    Tier,
    WorkloadClass,
)
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.premium import best_fit, idle_gpus, node_pieces
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.route import trainable
from slurm_fleetyield.core.signals import SIGNALS
from slurm_fleetyield.core.state import NodeMemory

OK_TRAIN = "fy_ok_train"
# Signals of counters that grew within the trend windows (core/sense.py): a GPU degrading now.
MOVING_SIGNALS = frozenset(s.name for s in SIGNALS if s.kind in ("rate", "growth", "xid"))


@dataclass(frozen=True, slots=True)
class GangLoans:
    lent: frozenset[str] = frozenset()
    need_nodes: int = 0  # per-node pieces of the waiting job with the largest shortfall
    fitting_nodes: int = 0  # of those, the pieces that fit on idle GPUs of green trainable nodes
    reason: str = ""
    events: tuple[LogEvent, ...] = ()

    @property
    def loan(self) -> tuple[frozenset[str], str]:
        """(lent nodes, why): route's arguments."""
        return self.lent, self.reason


def widen(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    risks: Mapping[str, NodeRisk],
    memories: Mapping[str, NodeMemory],
    params: Params,
    now: float,
    kept_open: frozenset[str] = frozenset(),
    lent: frozenset[str] | None = None,
) -> GangLoans:
    """``kept_open``: yellow nodes that carried fy_ok_train last tick only because core/keep_open.py kept
    it open there (not a gang loan); ``lent``: ``lent_before(memories)`` when already known
    (core/carry_place.py)."""
    gp = params.gangs
    before = (lent_before(memories) if lent is None else lent) - kept_open
    if not gp.enabled:
        return GangLoans(events=_changed(before, frozenset(), now, "gang widening off"))
    # A tuple of members, not a set and not .value: hashing an Enum member and reading its .value are
    # Python-level calls, a tuple compares by identity (and str ==) in C. Pending first: most jobs run.
    wanted: tuple[WorkloadClass | None, ...] = tuple(WorkloadClass(c) for c in gp.classes)
    if gp.unclassified:
        wanted = (*wanted, None)
    # by class, in queue order within one (the pick below does not depend on the order: lowest id wins ties)
    pending = obs.job_index.pending_by
    waiting = [j for w in dict.fromkeys(wanted) for j in pending.get(w, ()) if j.gpus > 0]
    if not waiting:
        return GangLoans(events=_changed(before, frozenset(), now, "no training job waiting"))
    max_node = max((s.gpu_count for s in obs.slurm.values()), default=0)
    idle = idle_gpus(obs)  # in-service nodes only
    green: dict[bool, list[int]] = {True: [], False: []}  # free GPUs of green trainable nodes, by pool
    yellow: dict[bool, list[tuple[bool, float, str]]] = {True: [], False: []}
    pnodes = priced.nodes
    GREEN, YELLOW = Tier.GREEN, Tier.YELLOW
    for name, free in idle.items():
        pn = pnodes.get(name)
        if pn is None or (pn.tier is GREEN and not free) or (pn.tier is not GREEN and pn.tier is not YELLOW):
            continue  # a full green node holds no piece (most of a busy fleet); other tiers are never lent
        env = envelopes.get(name)
        if env is None or not own_features(pn) or not trainable(env, pn.lemon):
            continue
        if pn.tier is YELLOW and not gp.lend_degrading and degrading(risks.get(name)):
            continue
        pools = (True, False) if env.premium else (False,)  # premium pool: premium nodes; the other: all
        for pool in pools:
            if pn.tier is GREEN:
                green[pool].append(free)
            else:
                yellow[pool].append((name not in before, pn.risk, name))
    # The job with the largest shortfall, the lowest job id among equals (Slurm's age order). A queue holds
    # many jobs of the same size: each (GPUs, pool) is fitted once.
    fitted: dict[tuple[int, bool], tuple[int, int]] = {}
    premium_classes = tuple(WorkloadClass(c) for c in params.settle.premium_needing_classes)
    best: tuple[int, int, int, bool] | None = None  # (shortfall, job id, pieces, premium pool)
    for j in waiting:
        pool = j.workload in premium_classes
        got = fitted.get((j.gpus, pool))
        if got is None:
            chunks = sorted(node_pieces(j, max_node), reverse=True)
            got = fitted[(j.gpus, pool)] = (len(best_fit(chunks, green[pool])), len(chunks))
        unfit = got[0]
        if unfit and (best is None or unfit > best[0] or (unfit == best[0] and j.job_id < best[1])):
            best = (unfit, j.job_id, got[1], pool)
    short, need, fits, premium_pool = 0, 0, 0, False
    if best is not None:
        short, need, fits, premium_pool = best[0], best[2], best[2] - best[0], best[3]
    lent = frozenset(n for *_, n in sorted(yellow[premium_pool])[:short])
    where = "premium green" if premium_pool else "green"
    reason = (
        f"a pending training job needs {need} node(s), {fits} fit on idle {where} GPUs; "
        f"{len(lent)} yellow lent"
    )
    why = reason if short else "no shortfall: every pending training job fits on idle green GPUs"
    return GangLoans(lent, need, fits, reason, _changed(before, lent, now, why))


def degrading(nr: NodeRisk | None) -> bool:
    """A counter that grew within the trend windows (ECC errors, remapped rows, NVLink/PCIe errors,
    throttling time, risk-only XIDs) moved a GPU's risk; no risk known: True (nothing is lent blind)."""
    if nr is None:
        return True
    return any(c.signal in MOVING_SIGNALS for g in nr.gpus for c in g.contributions)


def own_features(pn: PricedNode) -> bool:
    """Priced from fresh data into a plain tier (not UNKNOWN/held, not a lifecycle stage's features)."""
    return pn.managed and pn.keep_fy is None and pn.feature_tier is None


def lent_before(memories: Mapping[str, NodeMemory]) -> frozenset[str]:
    """The yellow nodes that carried fy_ok_train last tick."""
    return frozenset(n for n, m in memories.items() if _lent(m))


def _lent(m: NodeMemory) -> bool:
    return m.tier is Tier.YELLOW and OK_TRAIN in m.fy_features


def _changed(before: frozenset[str], after: frozenset[str], now: float, why: str) -> tuple[LogEvent, ...]:
    lend = [
        LogEvent(now, n, "gang_lend", f"{OK_TRAIN} lent to yellow node: {why}")
        for n in sorted(after - before)
    ]
    back = [LogEvent(now, n, "gang_return", f"{OK_TRAIN} returned: {why}") for n in sorted(before - after)]
    return (*lend, *back)
