"""Stake: which in-service nodes withhold which class features, priced by what the work stands to lose.

Input: the Slurm view (jobs: class, GPUs, state), priced nodes (tier, risk), envelopes, ``Params``
(``stake``, ``risk.horizon_days``). Output: ``Withheld``: per node the ``fy_ok_*`` class features it does not
carry this tick, the per-class stakes behind it, the nodes the rule weighed (with their GPUs), and the
capacity breaker's events. ``figures`` is rules 2-3 for one node, the arithmetic ``withhold`` decides by and
``explain`` shows (one function, so the two cannot disagree); ``drain_figures`` is ``drain_pays``'
arithmetic.

Why: a node's risk is a probability; whether to keep work off it depends on the work. An absolute threshold
("no training on yellow nodes") kept capacity idle to avoid losses far smaller than the work it stopped: a
4-GPU job that checkpoints hourly loses about 2 GPU-hours when a fault hits it; idling the node for a day to
avoid a 2% chance of that costs ~100 times more. Here the trade is written out.

Rule, per tick:
1. a class's stake: the GPUs a fault kills -- the largest job of the class pending or running (a gang of N
   nodes dies when any of them fails, so it weighs a node's risk by its whole size; rounded up to a power of
   two so the answer does not flicker with the queue), at least one GPU -- and the progress each of them
   loses: half the checkpoint interval (half the run when the class cannot checkpoint) plus the restart
   cost (``stake.classes``);
2. a node's fatal hazard per second from its probability over the risk horizon:
   ``lambda = -ln(1 - p) / horizon``, taken in excess of the fleet's base: the hazard of a node of as many
   GPUs with no risk signal, under the learned base multiplier (core/learn.py; what the tiers are relative
   to, core/price.py ``relative``). Keeping work off a node averts only the hazard it has above such a
   node; a fleet-wide rise of the learned base rate is evidence against no node (before this rule, at a
   learned multiplier of 7.8 on the frontier workload every node stood at p 0.119, above the gang's floor,
   and withholding from all but the breaker's room idled the gang for 28 hours);
3. running the class there loses ``excess lambda x gpus x lost_s`` GPU-seconds per second, and does
   ``min(gpus, node GPUs)`` GPU-seconds of work per second. The node withholds the class feature only when
   the first exceeds the second: expected loss above the work that would wait (the cost of withholding);
4. capacity breaker: while a class has pending work, nodes withholding it may hold at most
   ``stake.withhold_cap_fraction`` of the in-service GPUs, and never so many that the in-service GPUs still
   carrying it are fewer than its largest pending job needs (a gang over most of the fleet cannot start
   otherwise: withholding would idle it whole); past either the lowest-loss nodes carry the feature again
   and a ``stake_breaker`` event says so (the metric and status read it). In-service GPUs are counted
   whatever their model: on a mixed fleet a class bound to one model by an admin constraint has fewer.
Nodes out of service (drained, in rehabilitation, unknown) are not this stage's: their tier carries no class
feature anyway. Which of the carrying nodes a job gets is the weights' business (core/price.py: the node
most likely to fail is used last).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from slurm_fleetyield.core.model import FY_PREFIX, UNSAID_GPUS, JobView, LogEvent, Observations
from slurm_fleetyield.core.params import ClassStake, Params
from slurm_fleetyield.core.plan import SignalJobs
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.route import SERVICE_TIERS

CLASS_FEATURE: Mapping[str, str] = {  # job_submit.lua's class -> feature
    "pretrain": f"{FY_PREFIX}ok_train",
    "finetune": f"{FY_PREFIX}ok_finetune",
    "decode": f"{FY_PREFIX}ok_decode",
    "batch": f"{FY_PREFIX}ok_batch",
}


@dataclass(frozen=True, slots=True)
class Stake:
    workload: str
    gpus: int  # GPUs one fault kills
    lost_s: float  # seconds of progress (and restart) each of them loses
    job_id: int | None = None  # source of ``gpus``: the largest pending/running job of the class (None: none)
    job_gpus: int = 0  # that job's GPUs (before rounding up to a power of two)
    job_state: str = ""  # PENDING | RUNNING

    def loss_rate(self, hazard_per_s: float) -> float:
        """GPU-seconds expected lost per second of running on a node with this hazard."""
        return hazard_per_s * self.gpus * self.lost_s


@dataclass(frozen=True, slots=True)
class ClassFigures:
    """Rules 2-3 for one class on one node, in GPU-seconds per second (= GPU-hours per hour)."""

    stake: Stake
    hazard_per_s: float  # the node's fatal hazard in excess of the fleet's base (NaN: unknown risk)
    loss: float  # expected loss of running the class there: excess hazard x stake GPUs x lost seconds
    cost: float  # what withholding costs: the work the class would do there, min(stake GPUs, node GPUs)

    @property
    def withhold(self) -> bool:
        """The expected loss exceeds the work that would wait (False for an unknown risk)."""
        return self.loss > self.cost


@dataclass(frozen=True, slots=True)
class Withheld:
    nodes: Mapping[str, frozenset[str]]  # node -> class features it does not carry
    stakes: tuple[Stake, ...] = ()
    pending: frozenset[str] = frozenset()  # classes with pending work
    events: tuple[LogEvent, ...] = ()
    tripped: tuple[str, ...] = ()  # classes whose breaker held this tick
    gpus: Mapping[str, int] = field(default_factory=dict)  # the in-service nodes the rule weighed -> GPUs
    service_gpus: int = 0  # their GPUs (the breaker's cap is a share of them)
    multiplier: float = 1.0  # the learned base multiplier the excess hazard is taken over


def hazard_per_s(p: float, horizon_s: float) -> float:
    """Constant hazard that gives P(fatal within horizon) = p."""
    return math.inf if p >= 1.0 else -math.log1p(-p) / horizon_s


_job_gpus = attrgetter("gpus")


def stakes(obs: Observations, params: Params) -> tuple[Stake, ...]:
    """Rule 1: per class of ``stake.classes``, what one fault there costs."""
    largest: dict[str, JobView] = {}  # class -> its largest pending or running job, the first of equals
    for wc, js in obs.job_index.by.items():
        live = [j for j in js if j.state in ("PENDING", "RUNNING")]
        if wc is not None and live:
            largest[wc.value] = max(live, key=_job_gpus)
    out = []
    for w, cs in sorted(params.stake.classes.items()):
        top = largest.get(w)
        gpus = 1 << max(0, (top.gpus if top is not None else 1) - 1).bit_length()  # next power of two
        if top is None:
            out.append(Stake(w, gpus, cs.lost_s))
        else:
            out.append(Stake(w, gpus, cs.lost_s, top.job_id, top.gpus, top.state))
    return tuple(out)


def figures(
    st: Sequence[Stake], p: float, gpus: int, horizon_s: float, base: float = 0.0
) -> tuple[ClassFigures, ...]:
    """Rules 2-3 on a node of ``gpus`` GPUs whose fatal probability within ``horizon_s`` is ``p``, against
    the fleet's base probability ``base``."""
    lam = max(0.0, hazard_per_s(p, horizon_s) - hazard_per_s(base, horizon_s)) if p == p else math.nan
    return tuple(ClassFigures(s, lam, s.loss_rate(lam), float(min(s.gpus, gpus))) for s in st)


def base_risk(gpus: int, multiplier: float, params: Params) -> float:
    """P(fatal within the horizon) of a node of ``gpus`` GPUs with no risk signal: the model's base per GPU
    under the learned multiplier."""
    return -math.expm1(gpus * max(1.0, multiplier) * math.log1p(-params.risk.base_probability))


def withhold(
    obs: Observations, priced: Priced, params: Params, now: float, multiplier: float = 1.0
) -> Withheld:
    """Rules 2-4 over the in-service priced nodes; ``multiplier``: the learned base multiplier."""
    sp = params.stake
    if not sp.enabled:
        return Withheld({})
    horizon = params.risk.horizon_days * 86_400.0
    st = stakes(obs, params)
    # the lowest excess hazard at which any class is withheld anywhere (a node of one GPU): nodes below it
    # carry all
    floor = min((1.0 / (s.gpus * s.lost_s) for s in st), default=math.inf)
    pending_gpus = {  # class -> its largest pending job's GPUs
        w.value: max(j.gpus for j in js) for w, js in obs.job_index.pending_by.items() if w is not None
    }
    pending = frozenset(pending_gpus)
    gpus = obs.gpus  # node_gpus, read as a mapping
    gpus_of = {  # the in-service nodes' GPUs
        name: gpus.get(name, UNSAID_GPUS)
        for name, pn in priced.nodes.items()
        if pn.tier in SERVICE_TIERS and pn.managed and pn.keep_fy is None
    }
    service_gpus = sum(gpus_of.values())
    out: dict[str, frozenset[str]] = {}
    losses: dict[str, list[tuple[float, str]]] = {}
    # per node size: (the base risk of such a node, the risk at which its excess hazard reaches the floor);
    # a fleet has a few sizes, so this tick computes each once
    by_size: dict[int, tuple[float, float]] = {}
    for g in set(gpus_of.values()):
        b = base_risk(g, multiplier, params)
        by_size[g] = (b, -math.expm1(-(floor + hazard_per_s(b, horizon)) * horizon))
    for name, g in gpus_of.items():
        pn = priced.nodes[name]
        base, at_floor = by_size[g]
        if not pn.risk >= at_floor:
            continue  # below every class's floor; NaN (unknown) carries what it had
        drop = []
        for fig in figures(st, pn.risk, g, horizon, base):
            if fig.withhold:
                drop.append(CLASS_FEATURE[fig.stake.workload])
                losses.setdefault(fig.stake.workload, []).append((fig.loss / g, name))
        if drop:
            out[name] = frozenset(drop)
    events: list[LogEvent] = []
    tripped: list[str] = []
    for w, nodes in sorted(losses.items()):
        held = sum(gpus_of[n] for _, n in nodes)
        need = pending_gpus.get(w, 0)
        room = service_gpus - need if need <= service_gpus else service_gpus  # too big to fit: not ours
        cap = min(sp.withhold_cap_fraction * service_gpus, room)
        if w not in pending or held <= cap:
            continue
        tripped.append(w)
        nodes.sort(reverse=True)  # highest loss per GPU first: those stay withheld
        keep, used = set(), 0
        for _, n in nodes:
            if used + gpus_of[n] > cap:
                continue
            keep.add(n)
            used += gpus_of[n]
        feat = CLASS_FEATURE[w]
        for _, n in nodes:
            if n not in keep:
                rest = out[n] - {feat}
                if rest:
                    out[n] = rest
                else:
                    del out[n]
        events.append(
            LogEvent(
                now,
                "",
                "stake_breaker",
                f"{feat}: withholding it from {held} of {service_gpus} in-service GPUs would exceed the cap "
                f"({sp.withhold_cap_fraction:.0%}, and room for the largest pending {w} job: "
                f"{pending_gpus.get(w, 0)} GPUs) while {w} work is pending; {len(nodes) - len(keep)} "
                f"node(s) keep it",
                {
                    "class": w,
                    "withheld_gpus": used,
                    "would_withhold_gpus": held,
                    "service_gpus": service_gpus,
                    "largest_pending_gpus": pending_gpus.get(w, 0),
                },
            )
        )
    return Withheld(out, st, pending, tuple(events), tuple(tripped), gpus_of, service_gpus, multiplier)


@dataclass(frozen=True, slots=True)
class DrainFigures:
    """``drain_pays``' arithmetic, in GPU-hours."""

    p: float  # P(fatal within the horizon) the drain is weighed at: the risk, at most stake.drain_precision
    moved_gpu_h: float  # progress + restart the requeued jobs lose now (the stake moved off the node)
    next_gpu_h: float  # the largest pending stake, which would land there next
    repair_gpu_h: float  # the node's GPUs down for stake.repair_s (a fault costs it anyway)
    drain_gpu_h: float  # the node's GPUs down for stake.drain_s
    risk: float = math.nan  # the node's risk (P(fatal within the horizon) by the risk model)

    @property
    def averted_gpu_h(self) -> float:
        return self.p * (self.moved_gpu_h + self.next_gpu_h + self.repair_gpu_h)

    @property
    def cost_gpu_h(self) -> float:
        return self.drain_gpu_h + self.moved_gpu_h

    @property
    def pays(self) -> bool:
        return self.averted_gpu_h > self.cost_gpu_h

    @property
    def why(self) -> str:
        return f"averted {self.averted_gpu_h:.1f} GPU-h (p {self.p:.2f}) vs cost {self.cost_gpu_h:.1f} GPU-h"

    def as_dict(self) -> dict[str, float | bool]:
        """JSON-able, for the proposal's log event."""
        return {
            "p": self.p,
            "risk": self.risk,
            "moved_gpu_h": self.moved_gpu_h,
            "next_gpu_h": self.next_gpu_h,
            "repair_gpu_h": self.repair_gpu_h,
            "drain_gpu_h": self.drain_gpu_h,
            "averted_gpu_h": self.averted_gpu_h,
            "cost_gpu_h": self.cost_gpu_h,
            "pays": self.pays,
        }


def drain_pays(node: str, p: float, obs: Observations, params: Params, wh: Withheld) -> tuple[bool, str]:
    """``drain_figures``' verdict and its figures in words."""
    fig = drain_figures(node, p, obs, params, wh)
    return fig.pays, fig.why


def drain_figures(node: str, p: float, obs: Observations, params: Params, wh: Withheld) -> DrainFigures:
    """Does a pre-emptive drain of ``node`` (fatal probability ``p`` within the horizon, false alarms
    included: that is what a probability is) pay? The drain moves the work a fault there would kill:
    the jobs it requeues now (each loses half a checkpoint interval and a restart at once) and the work
    that would land there next (the largest of this tick's stakes, ``wh``, among the pending classes); jobs
    without the Requeue flag run to their end on the node either way. Averted: p x (the stake moved + the
    node's GPUs down for ``repair_s``, which a fault costs anyway), p being the risk at most
    ``stake.drain_precision`` (how often telemetry evidence of a coming fault can be right). Cost: the
    node's GPUs down for ``drain_s`` plus the requeue's loss."""
    sp = params.stake
    default = ClassStake()
    g = node_gpus(obs, node)
    moved = 0.0
    for j in obs.jobs:
        if j.state != "RUNNING" or node not in j.nodes or not j.requeue:
            continue
        cs = sp.classes.get(j.workload.value, default) if j.workload is not None else default
        if cs.checkpoint_s > 0:
            moved += j.gpus * cs.lost_s
    nxt = max((x.gpus * x.lost_s for x in wh.stakes if x.workload in wh.pending), default=0.0)
    pe = min(p, sp.drain_precision)
    return DrainFigures(
        pe, moved / 3600.0, nxt / 3600.0, g * sp.repair_s / 3600.0, g * sp.drain_s / 3600.0, p
    )


def signals_checkpoint(job: JobView, params: Params) -> str:
    """Which of ``job``'s processes handle checkpoint signals ('steps' | 'batch'; '' for none): its class's
    ``checkpoint_signals``, for a job Slurm may requeue. Such a job is asked to checkpoint by a drain
    instead of being requeued from its last periodic checkpoint."""
    if job.workload is None or not job.requeue:
        return ""
    cs = params.stake.classes.get(job.workload.value)
    return "" if cs is None or cs.checkpoint_signals == "off" else cs.checkpoint_signals


def signal_actions(
    node: str, jobs: tuple[JobView, ...], signal: str, reason: str, params: Params
) -> list[SignalJobs]:
    """One ``SignalJobs`` per target for the jobs on ``node`` that follow the convention."""
    by: dict[str, list[int]] = {}
    for j in jobs:
        t = signals_checkpoint(j, params)
        if t:
            by.setdefault(t, []).append(j.job_id)
    return [SignalJobs(node, tuple(sorted(ids)), signal, reason, t) for t, ids in sorted(by.items())]


def node_gpus(obs: Observations, node: str) -> int:
    """A node's GPUs from Slurm's Gres (``UNSAID_GPUS`` when Slurm does not say)."""
    return obs.gpus.get(node, UNSAID_GPUS)
