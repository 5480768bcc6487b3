"""The discrete-event simulation: one fleet, one job stream, one fault plan, one policy.

Input: ``SimConfig`` (fleet, horizon, control interval, repair times, human delay, fault and workload
knobs), a policy name, the jobs (``sim/traces.py``) and the fault plan (``sim/faults.py``), both drawn
from the seed so that every policy of a run sees the same jobs and the same faults. Output: a ``dict``
of metrics (see ``sim/report.py``).

Policies:
- ``baseline``: unmodified Slurm. No fy_ features, all weights 1; an NHC-style check drains a node on the
  fatal event itself; the admin resumes it after the repair. Jobs carry only their admin constraint.
- ``fleetyield``: the real ``core.loop.tick`` with default ``Params``, driven exactly as the daemon drives it
  (``controller_step``): read the simulated Slurm, scrape (``NodeSample``s built from latent GPU health),
  pending pushed fatal events, tick, apply the plan. Jobs get job_submit.lua's class constraint
  (decode -> fy_ok_decode, batch -> fy_ok_batch, finetune -> fy_ok_finetune, pretrain -> fy_ok_train).
  Drain proposals (the plan's ``ProposeDrain`` actions, made on entering the red tier) are approved by a
  simulated admin after ``human_delay_h`` if the proposal is still open (not withdrawn, not expired) and the
  node is still red, in service: the approval enters the next tick as a ``GateDecision`` (what the daemon's
  intake makes of a verified approval; no I/O, no signature), and the drain, its reason and its requeue list
  come from that tick's plan (core/rehab.py -> lifecycle APPROVED_DRAIN): only jobs with Slurm's Requeue flag
  are requeued, the others (here: jobs that cannot checkpoint, submitted ``--no-requeue``) run to their end.
  Once the node is empty the admin powers it off and swaps the GPUs that showed precursor telemetry in the
  last 2 days or a fatal history (DOWN for ``swap_h``); the lifecycle then brings it back (remediation,
  canary, probation), or the admin resumes it when the lifecycle parked it for a human.
- ``oracle``: knows every future fault: drains a node ``oracle_lead_s`` before each fault (checkpointing
  first: no progress lost), swaps the GPU, and routes with the core's own feature/weight functions fed the
  true state (lemon nodes yellow). The upper bound.
- ``baseline_aa``: an A/A control, unmodified Slurm exactly as ``baseline`` but with another, equally blind
  node order (node weights from a permutation fixed by the seed). Its spread against ``baseline`` is the
  placement-chaos floor of every comparison: a policy that only moves work to other, identical nodes differs
  from the baseline by about that much on a seed, with a mean of zero.
- ablations: ``fy_no_premium`` (decode gets fy_ok_finetune: no premium reservation at all),
  ``fy_no_widening`` (``premium.enabled = False``: the old wall, decode never on premium GPUs),
  ``fy_no_yellow`` (batch needs fy_tier_green too, no gang widening: no yellow reclaim), ``fy_no_drain``
  (proposals never approved), ``fy_no_gangs`` (``gangs.enabled = False``: fy_ok_train on green nodes only),
  ``fy_no_spares`` (``spares.enabled = False``: no hot spares, core/spares.py).
Hot spares: the FleetYield policies run with ``[core.spares] enabled = true`` (site params). Jobs then ask
job_submit.lua's spare-aware features: a pretrain gang (``spares.gang_min_nodes`` nodes or more)
fy_ok_gang instead of fy_ok_train, and on the frontier workload its background batch runs in the preemptible
QOS (``fy_preemptible``) and asks fy_ok_preempt instead of fy_ok_batch; a job of any other QOS that cannot
start may requeue such jobs (Slurm's QOS preemption, REQUEUE: they lose their progress since the last
checkpoint, as any requeue; ``SimSlurm.preempt_for``). Gang restart wait: from a gang's requeue to its next
start (every policy).
The core sees the queue as ``squeue`` shows it: running jobs with their nodes and GPUs, and every pending job
with its class and GPUs (premium widening, core/premium.py, decides from them).

Control interval: a tick every ``control_interval_s`` (default 900 s = 15 simulated minutes) plus an
immediate tick on every pushed fatal event (the live daemon ticks every 30 s and at once on a push; 15 min
keeps a 1,000-node x 90-day run tractable, and the core's trends use a 1 h window, which 15-min points
resolve). Scheduling passes run at most every ``sched_interval_s`` (Slurm's sched_interval, 60 s).

Fatal faults (the world after one, the same for every policy; only who notices and what they do differ):
- the GPU is dead from the fault on and its XID shows in its telemetry (XID 79 hides the GPU from the scrape
  until repaired), but Slurm does not know: the node stays in service;
- a job on it of more than one GPU hangs in its next collective until ``collective_timeout_s`` (PyTorch's
  ``init_process_group`` timeout: 10 min for NCCL by default, pytorch.org/docs/stable/distributed.html;
  swept 5-30 min), then fails and is requeued; a 1-GPU job fails at once. A job Slurm places on the dead
  node before anyone drains it fails the same way (so a requeued gang can land on it again);
- NHC, as Slurm's HealthCheckProgram every ``health_check_interval_s`` (LBNL NHC's documented example: 300 s;
  swept 60-600 s), drains the node at its next run under every policy; draining does not kill the hung job;
- FleetYield's agent pushes the XID at once: the core's quarantine drains the node and requeues the jobs on
  it with Slurm's Requeue flag in the same tick (fast requeue: no hang);
- once the dead node is drained and empty it is DOWN for ``repair_h`` (reset, diagnostics), then comes back.
A decode job is an inference service (openb's qos LS: latency-sensitive, inference-like): what it served is
served, so an interruption loses only the requests in flight (``SERVICE_INFLIGHT_S``, assumption: a minute)
and its restart, and the service runs on elsewhere for the rest of its life (``service_loss = "inflight"``;
``"run"``: the earlier assumption that it loses its whole run, kept to compare). Any other job that is
requeued restarts from its last checkpoint if checkpointable, else from zero, and each restart spends
``restart_s`` (scheduling, initialisation, checkpoint load; assumption: 5 min, swept) before progress; a
checkpoint write blocks training for the job's ``ckpt_write_s`` every ``checkpoint_s`` of work. The GPU time
a job holds without progress (hang, restart) counts as wasted, with the progress it loses (``stalled_gpu_h``
is that part). ``ettr``: the training gangs' effective training time ratio (``_ettr_of``).
A quiet corruption (SDC) is not seen by anyone: it costs the affected jobs one checkpoint
interval of redone work (whole run when not checkpointable; a decode service under ``"inflight"`` the
requests in flight, as at an interruption) and counts as a failure hitting a job.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import json
import math
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm_fleetyield.core import price, route
from slurm_fleetyield.core.loop import TickResult, resample, tick
from slurm_fleetyield.core.model import (
    Envelope,
    FatalEvent,
    FleetScrape,
    GateDecision,
    GpuReading,
    JobView,
    NodeSample,
    Observations,
    Tier,
)
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import DrainNode, Plan, ProposeDrain, RequeueJobs, WithdrawProposal
from slurm_fleetyield.core.signals import (
    COUNTER_CHANNELS,
    GPU_TEMP,
    REMAP_FAILURE,
    REMAP_PENDING,
    SLOWDOWN_TEMP,
)
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.sim import faults as fm
from slurm_fleetyield.sim import traces, workload
from slurm_fleetyield.sim.cluster import WORKLOAD_CLASS, SimSlurm, new_job_view
from slurm_fleetyield.sim.data import openb_pods

POLICIES = (
    "baseline",
    "fleetyield",
    "oracle",
    "fy_no_premium",
    "fy_no_widening",
    "fy_no_yellow",
    "fy_no_drain",
    "fy_no_gangs",
    "fy_no_spares",
    "fy_tiers",
    "baseline_aa",
)
BARE = frozenset({"baseline", "baseline_aa"})  # unmodified Slurm
SERVICE_LOSS = ("inflight", "run")
SERVICE_INFLIGHT_S = 60.0  # assumption: an interrupted inference service loses about a minute of requests
FY_POLICIES = frozenset(POLICIES) - BARE - {"oracle"}
PREMIUM_MODEL, PREMIUM_TYPE = "NVIDIA H100 80GB HBM3", "h100"
OTHER_MODEL, OTHER_TYPE = "NVIDIA L40S", "l40s"
ADMIN_CONSTRAINT = {"pretrain": ("h100",)}  # gangs need NVLink boards under every policy (an admin feature)
CLASS_FEATURE = {  # prolog_epilog/job_submit.lua
    "decode": ("fy_ok_decode",),
    "batch": ("fy_ok_batch",),
    "finetune": ("fy_ok_finetune",),
    "pretrain": ("fy_ok_train",),
}
PREMIUM_NEEDING = frozenset({"pretrain"})
PREEMPT_TRIES = 5  # blocked jobs per pass that may preempt (Slurm tries preemption per job it schedules)
BASE_FIELDS: Mapping[str, float] = {
    **dict.fromkeys(COUNTER_CHANNELS, 0.0),
    REMAP_FAILURE: 0.0,
    REMAP_PENDING: 0.0,
    GPU_TEMP: 55.0,
    SLOWDOWN_TEMP: 87.0,
}
DAY, HOUR = 86_400.0, 3_600.0
SIM_ADMIN = "sim-admin"  # the simulated approver, as GateDecision.admin

TICK_MODES = ("plain", "event")

# event kinds on the heap (job arrivals are not events: ``Simulation.run`` reads them beside the heap)
END, FAULT, TICK, SCHED, REPAIRED, APPROVE, ORACLE, SWAPPED, HANGUP, CHECK = range(1, 11)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated run. Every field is a ``fleetyield simulate`` option."""

    nodes: int = 64
    gpus_per_node: int = 8
    premium_share: float = 0.5  # share of H100 (NVLink, premium) nodes; the rest are L40S (PCIe)
    days: float = 30.0
    seed: int = 0
    workload: str = "openb"  # openb | synthetic | frontier | path to a generic/sacct trace
    openb_path: str = str(openb_pods())
    load: float = 0.7  # offered GPU-hours / fleet GPU-hours
    gpu_scale: int = 8
    max_duration_h: float = 72.0
    control_interval_s: float = 900.0
    # "event" (the default): a grid tick runs only when something the core reads changed since its last tick
    # or its ``wake_at`` is due; "plain": the controller ticks on every control-interval grid point. Same
    # plans and reports (docs/simulator.md, tests/sim/test_wake_equivalence.py).
    tick_mode: str = "event"
    sched_interval_s: float = 60.0
    repair_h: float = 24.0  # fatal fault: reset, diagnostics, back in service
    swap_h: float = 24.0  # approved / oracle drain: GPU swapped, back in service
    human_delay_h: float = 4.0  # drain proposal -> approval
    oracle_lead_s: float = 3600.0
    bf_max_job_test: int = 100
    # the world after a fatal fault (see "Fatal faults" in the module's docs)
    collective_timeout_s: float = 600.0  # PyTorch's NCCL process-group timeout default (10 min)
    health_check_interval_s: float = 300.0  # Slurm HealthCheckInterval running NHC (LBNL NHC's example)
    restart_s: float = 300.0  # per restart: scheduling, initialisation, checkpoint load (assumption, swept)
    service_loss: str = "inflight"  # decode services: "inflight" (keep what they served) | "run" (lose it)
    faults: fm.FaultParams = field(default_factory=fm.FaultParams)
    background_load: float = 0.5  # frontier: traces.FrontierParams.background_load
    # decision-core overrides for the FleetYield policies, as JSON of the config file's [core] table
    # (``simulate --params FILE``); applied under each ablation's own switch
    core: str = ""

    @property
    def horizon_s(self) -> float:
        return self.days * DAY

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["faults"] = asdict(self.faults)
        if self.faults.post_return == "none":  # the default: reports stay byte-identical to before the option
            del d["faults"]["post_return"]
        if self.background_load == 0.5:  # the default: reports stay byte-identical to before the option
            del d["background_load"]
        if self.tick_mode == "event":  # the default: same reports as plain, written as before the option
            del d["tick_mode"]
        if not self.core:
            del d["core"]
        else:
            d["core"] = json.loads(self.core)
        return d


def policy_params(policy: str, core: str = "") -> Params:
    """Default ``Params`` (with ``core``'s overrides, JSON of a [core] table); ``fy_no_widening`` switches
    premium widening off (the old wall), ``fy_no_gangs`` gang widening (fy_ok_train on green nodes only),
    ``fy_tiers`` the stake rule (class features by absolute risk tiers, the rule before it)."""
    over: dict[str, Any] = json.loads(core) if core else {}

    def with_(section: str, **kw: Any) -> Params:
        return Params(**{**over, section: {**over.get(section, {}), **kw}})

    if policy == "fy_no_widening":
        return with_("premium", enabled=False)
    if policy in ("fy_no_gangs", "fy_no_yellow"):  # no yellow reclaim: no yellow node lent to gangs either
        return with_("gangs", enabled=False)
    if policy == "fy_tiers":
        return with_("stake", enabled=False)
    if policy == "fy_no_spares":
        return with_("spares", enabled=False)
    return Params(**over)


def _site_params(p: Params, cfg: SimConfig, policy: str = "fleetyield") -> Params:
    """What the simulated site configures beyond the defaults: hot spares on (with the preemptible QOS and
    job_submit.lua's fy_ok_gang / fy_ok_preempt mapping; not under ``fy_no_spares`` nor when ``core`` sets
    ``spares`` itself); the frontier workload's gangs follow the checkpoint-signal convention (its chaos
    training job implements it), so its pretrain class says so."""
    if policy != "fy_no_spares" and '"spares"' not in cfg.core:
        p = p.model_copy(update={"spares": p.spares.model_copy(update={"enabled": True})})
    if cfg.workload != "frontier" or "checkpoint_signals" in cfg.core:
        return p
    classes = dict(p.stake.classes)
    if "pretrain" in classes:
        classes["pretrain"] = classes["pretrain"].model_copy(update={"checkpoint_signals": "steps"})
    return p.model_copy(update={"stake": p.stake.model_copy(update={"classes": classes})})


# ---- inputs shared by all policies of a seed -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Inputs:
    nodes: tuple[str, ...]
    premium: frozenset[str]
    jobs: tuple[traces.Job, ...]
    plan: fm.FaultPlan


_TRACE_CACHE: dict[tuple, list[traces.Job]] = {}


def build_inputs(cfg: SimConfig) -> Inputs:
    """Fleet, jobs and faults of one seed (independent streams, so changing one knob keeps the others)."""
    names = tuple(f"n{i:04d}" for i in range(cfg.nodes))
    n_other = cfg.nodes - round(cfg.premium_share * cfg.nodes)
    step = cfg.nodes / n_other if n_other else 0
    other = (
        {names[min(cfg.nodes - 1, int(i * step + step / 2))] for i in range(n_other)} if n_other else set()
    )
    premium = frozenset(n for n in names if n not in other)
    fleet_gpus = cfg.nodes * cfg.gpus_per_node
    job_rng = random.Random(f"jobs-{cfg.seed}")
    if cfg.workload == "openb":
        key = (cfg.openb_path, cfg.gpu_scale, cfg.gpus_per_node, cfg.max_duration_h)
        if key not in _TRACE_CACHE:
            _TRACE_CACHE[key] = traces.load_openb(
                cfg.openb_path, cfg.gpu_scale, cfg.gpus_per_node, cfg.max_duration_h
            )[0]
        jobs = traces.fill(
            _TRACE_CACHE[key], cfg.horizon_s, fleet_gpus, cfg.load, job_rng, traces.OPENB_DAYS * DAY
        )
    elif cfg.workload == "frontier":
        fp = traces.FrontierParams(background_load=cfg.background_load)
        jobs = traces.frontier(fp, cfg.horizon_s, cfg.nodes, cfg.gpus_per_node, job_rng)
    elif cfg.workload == "synthetic":
        jobs = traces.synthetic(
            traces.SyntheticParams(), cfg.horizon_s, fleet_gpus, cfg.load, job_rng, cfg.gpus_per_node
        )
    else:
        raw = traces.load(cfg.workload)
        traces.check_fits(raw, cfg.nodes, cfg.gpus_per_node, cfg.workload)  # by the trace's own job ids
        span = max((j.submit for j in raw), default=0.0) or cfg.horizon_s
        jobs = traces.fill(raw, cfg.horizon_s, fleet_gpus, cfg.load, job_rng, span)
    too_big = [j for j in jobs if j.gpus_per_node > cfg.gpus_per_node or j.nodes > cfg.nodes]
    if too_big:
        j = too_big[0]
        raise traces.TraceError(
            cfg.workload,
            None,
            f"job {j.job_id} needs {j.nodes} x {j.gpus_per_node} GPUs, "
            f"larger than the fleet ({cfg.nodes} x {cfg.gpus_per_node})",
        )
    plan = fm.generate(
        names,
        cfg.gpus_per_node,
        cfg.faults,
        cfg.horizon_s,
        random.Random(f"faults-{cfg.seed}"),
        cfg.repair_h * HOUR,
    )
    return Inputs(names, premium, tuple(jobs), plan)


def _requeueable(j: traces.Job) -> bool:
    """Slurm's Requeue flag: a job that cannot checkpoint (decode services) is submitted ``--no-requeue``."""
    return j.checkpoint_s is not None


# ---- the controller step (what the daemon does per tick, minus I/O) ---------------------------------------


@contextmanager
def _long_lived_heap() -> Iterator[None]:
    """Garbage-collector settings for the event loop (results unchanged; only CPU time).

    A run keeps a large long-lived heap (every job of the trace, its state, the controller state) and each
    tick allocates hundreds of thousands of short-lived objects that die by reference counting, almost none of
    them in cycles. With CPython's default thresholds (700, 10, 10) every 700 net allocations start a
    collection, and the older generations, which hold the whole heap, are traversed again and again (1,000
    nodes x 33 days: 28,011 / 2,546 / 117 collections that freed 616 objects). Freezing what exists when the
    loop starts (``gc.freeze``) and raising the thresholds cuts that run from 120.0 to 83.8 CPU seconds.
    Cycles are still collected, just less often; the previous settings are restored afterwards.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 1_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def controller_step(
    state: ControllerState,
    slurm: Any,
    samples: Mapping[str, NodeSample],
    pending: Sequence[FatalEvent],
    params: Params,
    now: float,
    rng: random.Random,
    gate_decisions: Sequence[GateDecision] = (),
) -> TickResult:
    """Read Slurm through the port, build ``Observations`` as ``Daemon.tick_once`` does, call ``tick``, apply.

    The daemon's order is kept: nodes, jobs, samples, pending inbox events, gate decisions -> tick -> apply
    (only when the plan has actions). ``gate_decisions``: the admins' verified approvals/denials, as the
    daemon's intake delivers them. ``tests/sim/test_equivalence.py`` checks this against
    ``slurm_fleetyield.daemon``."""
    nodes = slurm.read_nodes()
    jobs = tuple(slurm.read_jobs())
    canaries = slurm.canary_results() if hasattr(slurm, "canary_results") else ()
    obs = Observations(
        time=now,
        slurm=nodes,
        samples=samples,
        fatal_events=tuple(pending),
        jobs=jobs,
        canary_results=canaries,
        gate_decisions=tuple(gate_decisions),
    )
    result = tick(state, obs, params, now, rng)
    if result.plan.actions:
        slurm.apply(result.plan)
    return result


# ---- one run -----------------------------------------------------------------------------------------------


def _submit(j: traces.Job) -> float:
    return j.submit


class _JobState:
    __slots__ = (
        "done",
        "ended",
        "extra",
        "finished",
        "first_start",
        "hung_since",
        "job",
        "rate",
        "restarts",
        "run_id",
        "saved",
        "started",
        "startup",
    )

    def __init__(self, job: traces.Job) -> None:
        self.job = job
        self.done = 0.0
        self.extra = 0.0  # work to redo after a quiet corruption
        self.started: float | None = None
        self.first_start: float | None = None
        self.ended: float | None = None  # completed at
        self.run_id = 0
        self.finished = False  # completed: its work is already counted as useful
        self.hung_since: float | None = None  # stuck in a collective on a dead GPU since
        self.startup = 0.0  # the current run's restart cost (no progress during it)
        self.restarts = 0
        self.saved = 0.0  # progress of an off-cycle checkpoint (a checkpoint signal)
        # work per second of running: a blocking checkpoint write every checkpoint_s of work
        c, w = job.checkpoint_s, job.ckpt_write_s
        self.rate = c / (c + w) if c and w > 0 else 1.0

    def progress(self, t: float) -> float:
        """Work done by ``t``: retained work plus this run's, less its start-up, frozen while it hangs."""
        if self.started is None:
            return self.done
        end = t if self.hung_since is None else min(t, self.hung_since)
        return self.done + max(0.0, end - self.started - self.startup) * self.rate

    def wall_left(self, startup: float) -> float:
        """Wall-clock seconds a (re)start needs to finish: start-up plus the remaining work at its rate."""
        return startup + (self.job.duration + self.extra - self.done) / self.rate


class Simulation:
    def __init__(self, cfg: SimConfig, policy: str, inputs: Inputs, params: Params | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        self.cfg, self.policy, self.inp = cfg, policy, inputs
        self.params = params or _site_params(policy_params(policy, cfg.core), cfg, policy)
        sp = self.params.spares
        self.gang_min = sp.gang_min_nodes
        self.spares_on = sp.enabled and policy in FY_POLICIES
        # the preemptible QOS: the frontier's background batch, only with spares (job_submit.lua's mapping)
        self.preempt_qos = sp.preemptible_qos if self.spares_on and cfg.workload == "frontier" else ""
        self._constraints: dict[tuple[str, bool, bool], frozenset[str]] = {}
        self.now = 0.0
        self.heap: list[tuple[float, int, int, Any]] = []
        self.seq = 0
        self.premium = inputs.premium
        specs = []
        for n in inputs.nodes:
            prem = n in self.premium
            specs.append(
                (
                    n,
                    cfg.gpus_per_node,
                    PREMIUM_TYPE if prem else OTHER_TYPE,
                    (PREMIUM_TYPE,) if prem else (OTHER_TYPE,),
                )
            )
        self.slurm = SimSlurm(specs, self._requeue_from_drain, cfg.bf_max_job_test)
        self.slurm.pending = self._pending_views
        self.slurm.on_signal = self._signal
        if policy == "baseline_aa":  # the same blind Slurm, another node order (a fixed permutation)
            order = list(inputs.nodes)
            random.Random(f"aa-{cfg.seed}").shuffle(order)
            for i, name in enumerate(order):
                n = self.slurm.nodes[name]
                self.slurm.set_features(name, n.features, 1 + i)
        self._views: dict[int, JobView] = {}
        self.jobs: dict[int, _JobState] = {}
        self.queue: list[tuple[float, int]] = []  # (submit, job_id), priority order
        self.queue_views: list[JobView] = []  # the same jobs as squeue shows them, same order
        self.constraint: dict[str, frozenset[str]] = {
            c: frozenset(ADMIN_CONSTRAINT.get(c, ()) + self._class_features(c)) for c in traces.CLASSES
        }
        self.sched_pending = False
        # faults
        self.cancelled: set[int] = set()
        self.broken: dict[str, fm.Fault] = {}  # a dead GPU, the node not yet out of service -> its fault
        self.gpu_failed: dict[tuple[str, int], int] = {}  # fatal events per GPU (repeat share)
        self.fault_hist: list[tuple[float, str, int, float | None]] = []  # time, node, GPU, its swap time
        self.swapped_at: dict[tuple[str, int], float] = {}
        self.hidden: set[tuple[str, int]] = set()
        self.xids: dict[tuple[str, int], dict[int, float]] = {}
        self.lemons = set(inputs.plan.lemons)
        self.plan_multiplier = inputs.plan.lemon_multiplier
        self.faults_by_gpu: dict[tuple[str, int], list[fm.Fault]] = {}
        for f in inputs.plan.faults:
            self.faults_by_gpu.setdefault((f.node, f.gpu), []).append(f)
        self.episodes = fm.episodes_by_gpu(inputs.plan.episodes)
        self.ep_starts = sorted(inputs.plan.episodes, key=lambda e: e.start)
        self.ep_ptr = 0
        self.active_eps: list[fm.Episode] = []
        # controller
        self.state = ControllerState.empty()
        self.rng = random.Random(f"tick-{cfg.seed}")
        self.pending_events: list[FatalEvent] = []
        self.readings: dict[tuple[str, int], GpuReading] = {}
        # node -> its readings tuple, in the nodes' order; None: to build again (``_samples``), as ``stale``
        self.node_gpus: dict[str, tuple[GpuReading, ...] | None] = dict.fromkeys(inputs.nodes)
        self.stale_gpus: set[str] = set(inputs.nodes)
        self.last_decisions: Mapping[str, Any] = {}
        self.proposed: dict[str, float] = {}  # node -> when its approval was scheduled
        self.open_proposals: dict[str, tuple[str, float]] = {}  # the gate's view: node -> (id, expires_at)
        self.pending_decisions: list[GateDecision] = []  # approvals for the next tick
        self.awaiting_swap: dict[str, tuple[tuple[str, int], ...]] = {}  # approved drains not yet empty
        self.swap_down: set[str] = set()  # powered off for an approved drain's GPU swap
        self.repairing: set[str] = set()  # DOWN for a fatal fault's repair
        self.swapping: set[str] = set()
        self.ticks = 0  # grid and immediate ticks, skipped ones included (the report's ``ticks``)
        self.ticks_skipped = 0  # event mode: grid ticks skipped (nothing the core reads changed, no wake due)
        self.tick_s = 0.0
        self.event_mode = cfg.tick_mode == "event"
        # the last tick's result while its plan had no actions (None: it had some, or no tick yet), then its
        # ``wake_at``, read only when a grid tick could otherwise be skipped (``_wake``)
        self.wake_of: TickResult | float | None = None
        # what the core read at its last tick: readings per node, Slurm's node views, the job views
        self.seen: tuple[dict[str, Any], dict[str, Any], tuple[Any, ...]] | None = None
        self.tick_log: list[tuple[float, str, TickResult]] | None = None  # tests: every tick that ran
        self.last_spares = 0  # nodes carrying fy_spare after the last tick (a skipped tick counts them again)
        # job_submit.lua is enabled once the controller has labelled the nodes (its bootstrap rule): before
        # the first tick no submission is refused
        self.labelled = False
        # metrics
        self.m: dict[str, float] = dict.fromkeys(
            (
                "useful_gpu_h",
                "wasted_gpu_h",
                "failures_hitting_jobs",
                "fatal_faults",
                "quiet_faults",
                "premium_misuse_gpu_h",
                "drained_gpu_h",
                "drains",
                "preemptive_drains",
                "requeues",
                "jobs_completed",
                "false_drains",
                "refused_jobs",
                "refused_gpu_h",
                "reclaimed_jobs",
                "stalled_gpu_h",
                "train_interruptions",
                "preemptions",
                "spare_node_ticks",
            ),
            0.0,
        )
        self.gang_requeued: dict[int, float] = {}  # gang -> when it was requeued (restart wait)
        self.gang_waits: list[float] = []
        self.wait_sum: dict[str, float] = dict.fromkeys(traces.CLASSES, 0.0)
        self.wait_n: dict[str, int] = dict.fromkeys(traces.CLASSES, 0)
        self.misuse_gpus = 0  # GPUs of non-premium-needing work on premium nodes
        self.pending_premium = 0  # queued premium-needing jobs
        self._last_t = 0.0

    def _pending_views(self) -> tuple[JobView, ...]:
        if len(self.queue_views) != len(self.queue):  # the queue was replaced wholesale (tests do)
            self.queue_views = [self._view(self.jobs[jid].job) for _, jid in self.queue]
        return tuple(self.queue_views)

    def _view(self, j: traces.Job) -> JobView:
        v = self._views.get(j.job_id)
        if v is None:
            restarts = self.jobs[j.job_id].restarts if j.job_id in self.jobs else 0
            v = self._views[j.job_id] = new_job_view(
                j.job_id, "PENDING", (), _requeueable(j), WORKLOAD_CLASS[j.workload], j.gpus, (), "", restarts
            )
        return v

    def _qos(self, j: traces.Job) -> str:
        return self.preempt_qos if self.preempt_qos and j.workload == "batch" else ""

    def _constraint(self, j: traces.Job) -> frozenset[str]:
        """job_submit.lua's constraint of ``j``: its class's, with spares a gang's fy_ok_gang for fy_ok_train
        and a preemptible job's fy_ok_preempt for fy_ok_batch."""
        base = self.constraint[j.workload]
        if not self.spares_on:
            return base
        key = (j.workload, j.workload == "pretrain" and j.nodes >= self.gang_min, bool(self._qos(j)))
        c = self._constraints.get(key)
        if c is None:
            swap = {}
            if key[1]:
                swap["fy_ok_train"] = "fy_ok_gang"
            if key[2]:
                swap["fy_ok_batch"] = "fy_ok_preempt"
            c = self._constraints[key] = frozenset(swap.get(f, f) for f in base)
        return c

    def _class_features(self, c: str) -> tuple[str, ...]:
        if self.policy in BARE:
            return ()
        if self.policy in ("fy_no_premium", "oracle") and c == "decode":
            return ("fy_ok_finetune",)
        if self.policy == "fy_no_yellow" and c == "batch":
            return ("fy_ok_batch", "fy_tier_green")
        return CLASS_FEATURE[c]

    # ---- event plumbing ----------------------------------------------------------------------------------

    def push(self, t: float, kind: int, payload: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, payload))

    def _advance(self, t: float) -> None:
        dt = t - self._last_t
        if dt > 0:
            if self.pending_premium and self.misuse_gpus:
                self.m["premium_misuse_gpu_h"] += self.misuse_gpus * dt / HOUR
            if self.slurm.out:
                self.m["drained_gpu_h"] += self.slurm.out * self.cfg.gpus_per_node * dt / HOUR
            self._last_t = t
        self.now = t

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        horizon = cfg.horizon_s
        for j in self.inp.jobs:
            self.jobs[j.job_id] = _JobState(j)
        self.horizon = horizon
        # Arrivals are not pushed: they are read in time order beside the heap and win every tie, as they
        # would in it (pushed first, they would carry the lowest sequence numbers, in the trace's order).
        # The heap then holds only what the run schedules (thousands of events, not every job).
        arrivals = sorted(self.inp.jobs, key=_submit)  # stable: the trace's order among equal times
        arrive_t = [j.submit for j in arrivals]
        arrive_id = [j.job_id for j in arrivals]
        for f in self.inp.plan.faults:
            self.push(f.time, FAULT, f)
            if self.policy == "oracle":
                self.push(max(0.0, f.time - cfg.oracle_lead_s), ORACLE, f)
        if self.policy not in BARE:
            self.push(0.0, TICK, "periodic")  # seq 0-ish: label nodes before the first job
        handlers = {
            END: self._end,
            FAULT: self._fault,
            TICK: self._tick,
            SCHED: self._sched,
            REPAIRED: self._repaired,
            APPROVE: self._approve,
            ORACLE: self._oracle_drain,
            SWAPPED: self._swapped,
            HANGUP: self._hangup,
            CHECK: self._check,
        }
        heap = self.heap
        arrive = self._arrive
        i, n = 0, len(arrive_t)
        with _long_lived_heap():
            while True:
                if i < n and (not heap or arrive_t[i] <= heap[0][0]):
                    t = arrive_t[i]
                    if t > horizon:
                        break
                    self._advance(t)
                    arrive(arrive_id[i])
                    i += 1
                    continue
                if not heap or heap[0][0] > horizon:
                    break
                t, _, kind, payload = heapq.heappop(heap)
                self._advance(t)
                handlers[kind](payload)
        self._advance(horizon)
        for js in self.jobs.values():  # progress of jobs still running at the end counts as useful
            if js.started is not None:
                self.m["useful_gpu_h"] += js.job.gpus * min(js.progress(horizon), js.job.duration) / HOUR
                hung = horizon - js.hung_since if js.hung_since is not None else 0.0
                self._stalled(js.job.gpus, min(js.startup, horizon - js.started) + hung)
            elif js.done and not js.finished:  # interrupted, waiting in the queue: its retained progress
                self.m["useful_gpu_h"] += js.job.gpus * js.done / HOUR
        return self._metrics()

    # ---- jobs --------------------------------------------------------------------------------------------

    def _arrive(self, job_id: int) -> None:
        js = self.jobs[job_id]
        if self.labelled and not self.slurm.accepts(self._constraint(js.job)):
            # sbatch refuses a constraint no node carries: the job never pends (and no widening sees it)
            self.m["refused_jobs"] += 1
            self.m["refused_gpu_h"] += js.job.gpu_hours
            return
        self._enqueue(js)

    def _enqueue(self, js: _JobState) -> None:
        key = (js.job.submit, js.job.job_id)
        i = bisect.bisect_right(self.queue, key)
        self.queue.insert(i, key)
        self.queue_views.insert(i, self._view(js.job))
        if js.job.workload in PREMIUM_NEEDING:
            self.pending_premium += 1
        self._want_sched()

    def _want_sched(self) -> None:
        if not self.sched_pending and self.queue:
            iv = self.cfg.sched_interval_s
            t = math.floor(self.now / iv) * iv + iv if iv > 0 else self.now
            self.sched_pending = True
            self.push(t, SCHED)

    def _sched(self, _payload: Any = None) -> None:
        self.sched_pending = False
        if not self.queue:
            return
        q = []
        head = self.queue[: self.cfg.bf_max_job_test]
        for _submit, jid in head:
            js = self.jobs[jid]
            j = js.job
            q.append((jid, self._constraint(j), j.nodes, j.gpus_per_node, js.wall_left(self._startup(js))))
        placed = self.slurm.schedule(self.now, q)
        started: set[int] = set()
        if placed:
            started = {jid for jid, _ in placed}
            n = len(head)  # every placed job is in the head: rebuild only that part of the queue
            self.queue_views[:n] = [v for v in self.queue_views[:n] if v.job_id not in started]
            self.queue[:n] = [e for e in head if e[1] not in started]
            for jid, nodes in placed:
                self._start(jid, nodes)
        if self.preempt_qos:
            self._preempt([e for e in q if e[0] not in started])

    def _preempt(self, blocked: Sequence[tuple[int, frozenset[str], int, int, float]]) -> None:
        """Slurm's QOS preemption after the pass: the first few jobs outside the preemptible QOS that did not
        start, in priority order, requeue preemptible jobs when that lets them start (``preempt_for``)."""
        tries = 0
        for jid, constraint, nn, gpn, _wall in blocked:
            js = self.jobs[jid]
            if self._qos(js.job) or js.started is not None:
                continue
            tries += 1
            if tries > PREEMPT_TRIES:
                break
            got = self.slurm.preempt_for(constraint, nn, gpn, self.preempt_qos)
            if got is None:
                continue
            nodes, victims = got
            for v in victims:
                self.m["preemptions"] += 1
                self._interrupt(v)
            key = (js.job.submit, jid)
            i = bisect.bisect_left(self.queue, key)
            assert self.queue[i] == key
            del self.queue[i], self.queue_views[i]
            self._start(jid, nodes)

    def _start(self, jid: int, nodes: tuple[str, ...]) -> None:
        js = self.jobs[jid]
        j = js.job
        js.startup = self._startup(js)
        remaining = js.wall_left(js.startup)
        self.slurm.start(
            jid, nodes, j.gpus_per_node, self.now + remaining, j.workload, _requeueable(j), self._qos(j)
        )
        at = self.gang_requeued.pop(jid, None)
        if at is not None:
            self.gang_waits.append(self.now - at)
        js.started = self.now
        js.hung_since = None
        js.run_id += 1
        if js.first_start is None:
            js.first_start = self.now
            self.wait_sum[j.workload] += self.now - j.submit
            self.wait_n[j.workload] += 1
        if j.workload in PREMIUM_NEEDING:
            self.pending_premium -= 1
        else:
            self.misuse_gpus += sum(j.gpus_per_node for n in nodes if n in self.premium)
        self.push(self.now + remaining, END, (jid, js.run_id))
        if self.broken and any(n in self.broken for n in nodes):
            # placed on a dead GPU nobody has drained yet (the baseline between the fault and NHC)
            self.m["failures_hitting_jobs"] += 1
            self._hang(js)

    def _startup(self, js: _JobState) -> float:
        """A restart pays ``restart_s`` (the trace's durations already hold the first start's set-up)."""
        return self.cfg.restart_s if js.restarts else 0.0

    def _release(self, js: _JobState) -> None:
        p = self.slurm.finish(js.job.job_id)
        if js.job.workload not in PREMIUM_NEEDING:
            self.misuse_gpus -= sum(p.gpus_per_node for n in p.nodes if n in self.premium)
        js.started = None
        if self.broken:
            for n in p.nodes:
                if n in self.broken:
                    self._maybe_repair(n)
        if self.awaiting_swap:
            for n in p.nodes:
                if n in self.awaiting_swap and not self.slurm.jobs_on(n):
                    self._start_swap(n)
        self._want_sched()

    def _end(self, payload: tuple[int, int]) -> None:
        jid, run_id = payload
        js = self.jobs[jid]
        if js.run_id != run_id or js.started is None:
            return  # interrupted since
        self._stalled(js.job.gpus, js.startup)
        self._release(js)
        js.done = js.job.duration
        js.extra = 0.0
        js.finished = True
        js.ended = self.now
        self.m["useful_gpu_h"] += js.job.gpu_hours
        self.m["jobs_completed"] += 1

    def _interrupt(self, jid: int, keep_progress: bool = False) -> None:
        js = self.jobs[jid]
        if js.started is None:
            return
        j = js.job
        progress = js.progress(self.now)
        # GPU time held without progress: this run's restart cost and the hang on a dead GPU
        ran = self.now - js.started
        hang = self.now - js.hung_since if js.hung_since is not None else 0.0
        self._stalled(j.gpus, min(js.startup, ran) + hang)
        if keep_progress:
            retained = progress
        elif self._keeps_served(j):
            retained = max(0.0, progress - SERVICE_INFLIGHT_S)  # a service keeps what it served
        elif j.checkpoint_s:
            retained = max(math.floor(progress / j.checkpoint_s) * j.checkpoint_s, min(js.saved, progress))
        else:
            retained = 0.0
        self.m["wasted_gpu_h"] += j.gpus * (progress - retained) / HOUR
        js.done = min(retained, j.duration + js.extra)
        js.run_id += 1
        js.restarts += 1
        js.hung_since = None
        self._release(js)
        self.m["requeues"] += 1
        if j.nodes >= self.gang_min:
            self.gang_requeued[jid] = self.now
        self._views.pop(jid, None)  # squeue shows the new restart count
        self._enqueue(js)

    def _signal(self, jid: int, signal: str) -> None:
        """The job's checkpoint-signal handler (core/plan.py SignalJobs): USR2 checkpoints now (the write
        blocks training for ``ckpt_write_s``), USR1 checkpoints and requeues the job. A job hung on a dead GPU
        cannot checkpoint: it ignores both."""
        js = self.jobs[jid]
        j = js.job
        if js.started is None or js.hung_since is not None or not j.checkpoint_s:
            return
        js.saved = js.progress(self.now)
        self._stalled(j.gpus, j.ckpt_write_s)
        if signal == "USR1":
            self._interrupt(jid)
            return
        js.run_id += 1  # the write moves its end (progress is not paused for it: seconds, a simplification)
        p = self.slurm.extend(jid, j.ckpt_write_s)
        self.push(p.end, END, (jid, js.run_id))

    def _stalled(self, gpus: int, seconds: float) -> None:
        """GPU time a job held without progress (restart, hang): wasted."""
        if seconds > 0:
            self.m["stalled_gpu_h"] += gpus * seconds / HOUR
            self.m["wasted_gpu_h"] += gpus * seconds / HOUR

    def _requeue_from_drain(self, jid: int) -> None:
        self._interrupt(jid, keep_progress=self.policy == "oracle")

    # ---- faults ------------------------------------------------------------------------------------------

    def _voided(self, f: fm.Fault) -> bool:
        """Cancelled, or a post-return follow-up of a fault that was cancelled (never happened, or its GPU
        was swapped): then it is cancelled too, and so are its own follow-ups."""
        if f.parent is not None and f.parent in self.cancelled:
            self.cancelled.add(f.fault_id)
        return f.fault_id in self.cancelled

    def _fault(self, f: fm.Fault) -> None:
        if self._voided(f):
            return
        node = f.node
        jobs = self.slurm.jobs_on(node)
        if f.quiet:
            self.m["quiet_faults"] += 1
            for jid in jobs:
                js = self.jobs[jid]
                j = js.job
                redo = self._quiet_redo(js)
                js.extra += redo
                self.m["wasted_gpu_h"] += j.gpus * redo / HOUR
                self.m["failures_hitting_jobs"] += 1
                # the job now ends later: move its END
                js.run_id += 1
                p = self.slurm.extend(jid, redo / js.rate)
                self.push(p.end, END, (jid, js.run_id))
            return
        n = self.slurm.nodes[node]
        if n.down or node in self.swapping or node in self.broken:
            return  # already dead, or out for repair or a GPU swap: the GPU is being looked at anyway
        self.m["fatal_faults"] += 1
        key = (node, f.gpu)
        self.gpu_failed[key] = self.gpu_failed.get(key, 0) + 1
        self.fault_hist.append((self.now, node, f.gpu, self.swapped_at.get(key)))
        self.broken[node] = f
        for jid in jobs:
            self.m["failures_hitting_jobs"] += 1
            self._hang(self.jobs[jid])
        x = self.xids.setdefault(key, {})
        assert f.xid is not None
        x[f.xid] = x.get(f.xid, 0.0) + 1.0
        self._dirty_gpu(key)
        if f.xid == 79:
            self.hidden.add(key)
        # NHC (Slurm's HealthCheckProgram) finds it at its next run, under every policy
        iv = self.cfg.health_check_interval_s
        self.push(math.floor(self.now / iv) * iv + iv, CHECK, node)
        if self.policy in FY_POLICIES:
            self.pending_events.append(
                FatalEvent(
                    f"sim-{f.fault_id}",
                    node,
                    self.now,
                    "xid",
                    f.gpu,
                    self._uuid(key),
                    f.xid,
                    f"XID {f.xid}",
                    "agent-push",
                )
            )
            self._tick("push")

    def _quiet_redo(self, js: _JobState) -> float:
        """Seconds of work a quiet corruption makes the job redo: one checkpoint interval if it checkpoints;
        an inference service under ``service_loss="inflight"`` the requests in flight, as at an interruption
        (what it served before is served); any other job its whole run so far."""
        j = js.job
        progress = js.progress(self.now)
        if self._keeps_served(j):
            return min(progress, SERVICE_INFLIGHT_S)
        return j.checkpoint_s or progress

    def _keeps_served(self, j: traces.Job) -> bool:
        """An inference service under ``service_loss="inflight"``: what it served is served, whatever
        interrupts or corrupts it; it loses only the requests in flight."""
        return j.workload == "decode" and self.cfg.service_loss == "inflight"

    def _hang(self, js: _JobState) -> None:
        """The job's GPU died under it: a job of more than one GPU waits in its next collective until the
        timeout, then fails; a 1-GPU job fails at once (its CUDA call returns the error)."""
        if js.started is None or js.hung_since is not None:
            return
        js.hung_since = self.now
        js.run_id += 1  # its END is void
        if js.job.workload == "pretrain":
            self.m["train_interruptions"] += 1
        wait = self.cfg.collective_timeout_s if js.job.gpus > 1 else 0.0
        self.push(self.now + wait, HANGUP, (js.job.job_id, js.run_id))

    def _hangup(self, payload: tuple[int, int]) -> None:
        """The hung job fails (collective timeout): Slurm requeues it (its progress since the last
        checkpoint lost), unless a drain requeued it first."""
        jid, run_id = payload
        js = self.jobs[jid]
        if js.run_id == run_id and js.started is not None:
            self._interrupt(jid)

    def _check(self, node: str) -> None:
        """NHC's periodic run on ``node``: a dead GPU nobody took out yet is drained the NHC way (the jobs
        on it are not killed: a hung one keeps the node until its timeout)."""
        f = self.broken.get(node)
        n = self.slurm.nodes[node]
        if f is None or n.drain or n.down:
            return
        self.slurm.set_drain(node, f"nhc: XID {f.xid} on gpu {f.gpu}")
        self._maybe_repair(node)

    def _maybe_repair(self, node: str) -> None:
        """A dead node that is drained (by anyone) and empty goes DOWN for its repair (reset, diagnostics)."""
        n = self.slurm.nodes[node]
        if node not in self.broken or not n.drain or self.slurm.jobs_on(node):
            return
        del self.broken[node]
        self.slurm.set_down(node, True)
        self.repairing.add(node)
        self.push(self.now + self.cfg.repair_h * HOUR, REPAIRED, node)

    def _drain(self, node: str, reason: str) -> None:
        """The oracle's drain: requeues every job on the node, keeping its progress (it checkpoints first)."""
        action = DrainNode(node, reason, self.slurm.jobs_on(node), cause="approved")
        self.slurm.apply(Plan((action,)))
        self.m["drains"] += 1

    def _repaired(self, node: str) -> None:
        self.repairing.discard(node)
        for g in range(self.cfg.gpus_per_node):
            if (node, g) in self.hidden:
                self.hidden.discard((node, g))
                self._dirty_gpu((node, g))
        if node not in self.swap_down:  # else the swap's end powers it on
            self._power_on(node)

    def _power_on(self, node: str) -> None:
        n = self.slurm.nodes[node]
        self.slurm.set_down(node, False)
        if n.drain and (
            n.reason.startswith("nhc:")
            or "XID" in n.reason
            or "GPU missing" in n.reason
            or "needs a human" in n.reason  # FleetYield's lifecycle parked it for exactly this repair
        ):
            self.slurm.resume(node)  # the admin resumes a node drained for a fault that is now repaired
        self._want_sched()

    def _swap(self, node: str, keys: Sequence[tuple[str, int]]) -> None:
        """Replace GPUs: their future precursor-announced faults and a lemon's excess faults vanish, telemetry
        restarts. The new GPU has the base hazard: a lemon's later faults are thinned to 1 / multiplier of
        them, each kept or dropped by a draw fixed by (seed, fault id), so every policy thins alike. The old
        GPU's post-return follow-ups (``--post-return``: those of faults before the swap) are cancelled."""
        for key in keys:
            self.swapped_at[key] = self.now
            self.xids.pop(key, None)
            self.gpu_failed.pop(key, None)
            lemon = key in self.lemons
            self.lemons.discard(key)
            keep = 1.0 / self.plan_multiplier if lemon else 1.0
            for f in self.faults_by_gpu.get(key, ()):  # in time order: a parent before its follow-ups
                if f.time <= self.now or self._voided(f):
                    continue
                announced = f.episode is not None and f.episode.start <= self.now
                excess = (
                    lemon
                    and not f.follow_up  # follow-ups come at the base rate, not the lemon's
                    and random.Random(f"lemon-swap-{self.cfg.seed}-{f.fault_id}").random() >= keep
                )
                # fault ids index the plan's faults (faults.generate numbers them in order)
                old_gpu = f.parent is not None and self.inp.plan.faults[f.parent].time <= self.now
                if announced or excess or old_gpu:
                    self.cancelled.add(f.fault_id)
            self._dirty_gpu(key)

    def _swapped(self, payload: tuple[str, tuple[tuple[str, int], ...]]) -> None:
        node, keys = payload
        self._swap(node, keys)
        self.swapping.discard(node)
        if node in self.swap_down:  # an approved drain's swap: power on; the lifecycle takes it from there
            self.swap_down.discard(node)
            if node not in self.repairing:
                self._power_on(node)
            return
        n = self.slurm.nodes[node]  # the oracle's swap: the node was only drained
        if n.drain and not n.down:
            self.slurm.resume(node)
            self._want_sched()

    # ---- oracle ------------------------------------------------------------------------------------------

    def _oracle_drain(self, f: fm.Fault) -> None:
        if self._voided(f):
            return
        n = self.slurm.nodes[f.node]
        if n.down or n.drain:
            # already out of service: swap the GPU when it comes back (the fault will be absorbed)
            self.cancelled.add(f.fault_id)
            return
        self._drain(f.node, f"oracle: {f.cls} on gpu {f.gpu} in {self.cfg.oracle_lead_s:.0f}s")
        self.m["preemptive_drains"] += 1
        self.cancelled.add(f.fault_id)
        self.swapping.add(f.node)
        self.push(self.now + self.cfg.swap_h * HOUR, SWAPPED, (f.node, ((f.node, f.gpu),)))

    def _oracle_route(self) -> None:
        lemon_nodes = {n for n, _ in self.lemons}
        for name, n in self.slurm.nodes.items():
            prem = name in self.premium
            if n.drain or n.down:
                tier = Tier.QUARANTINED
            elif name in lemon_nodes:
                tier = Tier.YELLOW
            else:
                tier = Tier.GREEN
            env = Envelope("", prem, prem, prem, True, True)
            fy = route.fy_features(tier, env)
            self.slurm.set_features(name, (*n.admin_features, *fy), price.weight_of(tier, prem, self.params))

    # ---- controller --------------------------------------------------------------------------------------

    def _uuid(self, key: tuple[str, int]) -> str:
        gen = self.swapped_at.get(key)
        return f"GPU-{key[0]}-{key[1]}" + (f"-s{int(gen)}" if gen is not None else "")

    def _dirty_gpu(self, key: tuple[str, int]) -> None:
        self.readings.pop(key, None)
        if key[0] in self.node_gpus:
            self.node_gpus[key[0]] = None
            self.stale_gpus.add(key[0])

    def _reading(self, key: tuple[str, int], model: str, nvlink: bool) -> GpuReading:
        r = self.readings.get(key)
        if r is not None:
            return r
        fields: Mapping[str, float] = BASE_FIELDS
        since = self.swapped_at.get(key, -1.0)
        eps = [e for e in self.episodes.get(key, ()) if e.start <= self.now and e.start > since]
        if eps:
            f = dict(BASE_FIELDS)
            for e in eps:
                for k, v in fm.episode_fields(e, self.now, nvlink).items():
                    f[k] = max(f.get(k, 0.0), v) if k in (REMAP_PENDING,) else f.get(k, 0.0) + v
            fields = f
        r = GpuReading(
            key[1], self._uuid(key), model, f"0000:{key[1]:02x}:00.0", fields, dict(self.xids.get(key, {}))
        )
        self.readings[key] = r
        return r

    def _samples(self) -> FleetScrape:
        # episodes that started, or are still moving, invalidate their GPU's cached reading
        while self.ep_ptr < len(self.ep_starts) and self.ep_starts[self.ep_ptr].start <= self.now:
            self.active_eps.append(self.ep_starts[self.ep_ptr])
            self.ep_ptr += 1
        still = []
        for e in self.active_eps:
            self._dirty_gpu((e.node, e.gpu))
            if e.end + self.cfg.control_interval_s >= self.now:
                still.append(e)
        self.active_eps = still
        gpn = self.cfg.gpus_per_node
        node_gpus = self.node_gpus
        for name in self.stale_gpus:
            prem = name in self.premium
            model = PREMIUM_MODEL if prem else OTHER_MODEL
            node_gpus[name] = tuple(
                self._reading((name, g), model, prem) for g in range(gpn) if (name, g) not in self.hidden
            )
        self.stale_gpus.clear()
        # one scrape of the whole fleet at ``now``; an unchanged node's readings are the very tuple again
        return FleetScrape(self.now, dict(node_gpus), gpn)  # type: ignore[arg-type]

    def _tick(self, why: str) -> None:
        self.labelled = True
        if why == "periodic":
            self.push(self.now + self.cfg.control_interval_s, TICK, "periodic")
        if self.policy == "oracle":
            self._oracle_route()
            self._want_sched()
            return
        import time as _time

        t0 = _time.perf_counter()
        scrape = self._samples()
        if self.event_mode and self._skippable(why, scrape):
            assert self.seen is not None
            obs = Observations(time=self.now, slurm=self.seen[1], samples=scrape, jobs=self.seen[2])
            self.state = resample(self.state, obs, self.params, self.now)
            self.ticks += 1
            self.ticks_skipped += 1
            self.m["spare_node_ticks"] += self.last_spares
            self.tick_s += _time.perf_counter() - t0
            self._want_sched()
            return
        pending, self.pending_events = self.pending_events, []
        decisions, self.pending_decisions = self.pending_decisions, []
        result = controller_step(
            self.state,
            self.slurm,
            scrape,
            pending,
            self.params,
            self.now,
            self.rng,
            gate_decisions=decisions,
        )
        if self.event_mode:
            self.wake_of = None if result.plan.actions else result
        if self.tick_log is not None:
            self.tick_log.append((self.now, why, result))
        self.tick_s += _time.perf_counter() - t0
        self.ticks += 1
        self.state = result.state
        self.last_decisions = result.nodes
        if self.spares_on:
            self.last_spares = sum(1 for d in result.nodes.values() if "fy_spare" in d.fy_features)
            self.m["spare_node_ticks"] += self.last_spares
        plan = result.plan
        drains = plan.of_kind("drain")
        self.m["drains"] += len(drains)
        for a in plan.of_kind("requeue"):  # premium reclaim (core/reclaim.py), executed by SimSlurm.apply
            if isinstance(a, RequeueJobs):
                self.m["reclaimed_jobs"] += len(a.jobs)
        for a in drains:
            if isinstance(a, DrainNode) and a.cause == "approved":
                self._approved_drain(a.node)
            if isinstance(a, DrainNode) and a.node in self.broken:
                self._maybe_repair(a.node)
        # the gate's record of open proposals, kept as the live shell keeps it: from the plan's actions
        for a in plan.of_kind("withdraw_proposal"):
            if isinstance(a, WithdrawProposal) and self.open_proposals.get(a.node, ("",))[0] == a.proposal_id:
                del self.open_proposals[a.node]
        for a in plan.of_kind("propose_drain"):
            if isinstance(a, ProposeDrain):
                self.open_proposals[a.node] = (a.proposal_id, a.expires_at)
                if self.policy != "fy_no_drain" and a.node not in self.proposed:
                    self.proposed[a.node] = self.now
                    self.push(self.now + self.cfg.human_delay_h * HOUR, APPROVE, a.node)
        self._want_sched()

    def _skippable(self, why: str, scrape: FleetScrape) -> bool:
        """Event mode: may this grid tick be skipped? Only a periodic tick before the last tick's
        ``wake_at`` (that tick's plan without actions) with nothing the core reads changed since that tick but
        the scrape's time (``core.loop.resample`` then moves the trend ring): no pushed event, approval or
        canary result, every node's readings the very tuple it read (the simulator keeps an unchanged GPU's
        reading), Slurm's node and job views the very objects (``SimSlurm`` keeps an unchanged view).
        Records what a tick reads."""
        readings = scrape.readings
        nodes = self.slurm.read_nodes()
        jobs = tuple(self.slurm.read_jobs())
        seen, self.seen = self.seen, (dict(readings), dict(nodes), jobs)
        if why != "periodic" or self.wake_of is None or seen is None:
            return False
        if self.pending_events or self.pending_decisions or self.slurm.canaries:
            return False
        old_readings, old_nodes, old_jobs = seen
        return (
            _same(readings, old_readings)
            and _same(nodes, old_nodes)
            and len(jobs) == len(old_jobs)
            and all(a is b for a, b in zip(jobs, old_jobs, strict=True))
            and self.now < self._wake()  # read last: at scale something changes at almost every tick
        )

    def _wake(self) -> float:
        """The last tick's ``wake_at``, computed at the first read (its plan had no actions)."""
        last = self.wake_of
        if isinstance(last, TickResult):
            self.wake_of = last = last.wake_at
        assert last is not None
        return last

    def _approve(self, node: str) -> None:
        """The simulated admin decides the node's open proposal; an approval goes into the next tick."""
        self.proposed.pop(node, None)
        pid, expires_at = self.open_proposals.get(node, ("", 0.0))
        d = self.last_decisions.get(node)
        n = self.slurm.nodes[node]
        if not pid or self.now >= expires_at:
            return  # withdrawn or expired meanwhile: nothing to decide
        if d is None or d.tier is not Tier.RED or n.drain or n.down:
            return  # no longer red (or already out): the approver declines a stale proposal
        self.pending_decisions.append(GateDecision(pid, node, "approve", SIM_ADMIN, self.now))
        self._tick("approve")

    def _approved_drain(self, node: str) -> None:
        """The core drained ``node`` for an approval (requeueing what may be requeued): pick the GPUs to
        swap, score the drain (false: no precursor-announced fault ahead on them), swap once it is empty."""
        self.open_proposals.pop(node, None)
        self.m["preemptive_drains"] += 1
        since = self.now - 2 * DAY
        keys = []
        for g in range(self.cfg.gpus_per_node):
            key = (node, g)
            has_ep = any(
                since <= e.start <= self.now and e.start > self.swapped_at.get(key, -1.0)
                for e in self.episodes.get(key, ())
            )
            if has_ep or self.gpu_failed.get(key):
                keys.append(key)
        real = any(
            f.time > self.now and f.fault_id not in self.cancelled
            for k in keys
            for f in self.faults_by_gpu.get(k, ())
            if f.episode is not None
        )
        if not real:
            self.m["false_drains"] += 1
        self.awaiting_swap[node] = tuple(keys)
        if not self.slurm.jobs_on(node):
            self._start_swap(node)

    def _start_swap(self, node: str) -> None:
        """The approved-drained node is empty: powered off for ``swap_h`` while its GPUs are swapped."""
        keys = self.awaiting_swap.pop(node)
        self.swapping.add(node)
        self.swap_down.add(node)
        self.slurm.set_down(node, True)
        self.push(self.now + self.cfg.swap_h * HOUR, SWAPPED, (node, keys))

    # ---- results -----------------------------------------------------------------------------------------

    def _ettr(self) -> float:
        """ETTR of the training gangs (class pretrain)."""
        return _ettr_of((js for js in self.jobs.values() if js.job.workload == "pretrain"), self.horizon)

    def _metrics(self) -> dict[str, Any]:
        m = dict(self.m)
        m["net_goodput_gpu_h"] = m["useful_gpu_h"] - m["wasted_gpu_h"]
        m["queue_delay_h"] = {
            c: (self.wait_sum[c] / self.wait_n[c] / HOUR if self.wait_n[c] else 0.0) for c in traces.CLASSES
        }
        m["repeat_share"] = _repeat_share(self.fault_hist)
        m["ettr"] = self._ettr()
        m["ticks"] = float(self.ticks)
        w = self.gang_waits
        m["gang_restarts"] = float(len(w))
        m["gang_restart_wait_mean_s"] = sum(w) / len(w) if w else 0.0
        m["gang_restart_wait_max_s"] = max(w, default=0.0)
        m["spares_mean"] = m.pop("spare_node_ticks") / self.ticks if self.ticks else 0.0
        return m


def _same(now: Mapping[str, Any], then: Mapping[str, Any]) -> bool:
    """The same keys, each with the very object it had."""
    return len(now) == len(then) and all(then.get(k, _MISSING) is v for k, v in now.items())


_MISSING = object()


def _ettr_of(jobs: Iterable[_JobState], horizon: float) -> float:
    """Effective training time ratio (Meta RSC, arXiv 2410.21680): productive training time over the
    wall-clock time the jobs were in the system, from first start to completion (or the horizon). Productive:
    the work kept (progress lost to a fault, hangs, restarts, re-queue waits and checkpoint writes are not).
    NaN when no training job started."""
    kept = wall = 0.0
    for js in jobs:
        if js.first_start is None:
            continue
        end = js.ended if js.ended is not None else horizon
        wall += end - js.first_start
        kept += js.job.duration if js.finished else min(js.progress(horizon), js.job.duration)
    return kept / wall if wall > 0 else math.nan


def _repeat_share(hist: Sequence[tuple[float, str, int, float | None]]) -> float:
    """Share of counted fatal faults (none while the node was DOWN) on a GPU that failed before in the run
    and came back from repair: per physical GPU, so a swapped-in GPU starts with no history (Titan counts per
    serial number; ``faults.repeat_share`` is the same count on the plan, for a run without swaps)."""
    seen: set[tuple[str, int, float | None]] = set()
    rep = 0
    for _, n, g, gen in hist:
        rep += (n, g, gen) in seen
        seen.add((n, g, gen))
    return rep / len(hist) if hist else 0.0


def run_one(cfg: SimConfig, policy: str, inputs: Inputs | None = None) -> dict[str, Any]:
    sim = Simulation(cfg, policy, inputs or build_inputs(cfg))
    return sim.run()


def run_policies(cfg: SimConfig, policies: Sequence[str] = POLICIES) -> dict[str, dict[str, Any]]:
    """Every policy on the same seed (same jobs, same faults); each policy's metrics carry the seed's
    ``workload`` facts (sim/workload.py: the load that actually ran, warnings)."""
    inputs = build_inputs(cfg)
    w = workload.facts(
        inputs.jobs, inputs.nodes, inputs.premium, cfg.gpus_per_node, cfg.horizon_s,
        frozenset(ADMIN_CONSTRAINT), PREMIUM_TYPE, OTHER_TYPE,
    )  # fmt: skip
    return {p: {**run_one(cfg, p, inputs), "workload": w} for p in policies}


def run_seeds(
    cfg: SimConfig, seeds: Sequence[int], policies: Sequence[str] = POLICIES, workers: int = 1
) -> dict[int, dict[str, dict[str, Any]]]:
    cfgs = [replace(cfg, seed=s) for s in seeds]
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as ex:
            results = list(ex.map(run_policies, cfgs, [tuple(policies)] * len(cfgs)))
    else:
        results = [run_policies(c, policies) for c in cfgs]
    return dict(zip(seeds, results, strict=True))


def main_simulate(
    out_dir: str | Path,
    seeds: int = 10,
    first_seed: int = 0,
    policies: Sequence[str] = POLICIES,
    workers: int = 1,
    plots: bool = True,
    **config: Any,
) -> dict[str, Any]:
    """Entry point of ``fleetyield simulate``: run every policy over ``seeds`` seeds, write
    ``report.json``, ``report.txt`` and (``plots``) PNGs into ``out_dir``; returns the report dict."""
    from slurm_fleetyield.sim import report

    cfg = make_config(**config)
    results = run_seeds(cfg, list(range(first_seed, first_seed + seeds)), policies, workers)
    rep = report.build(cfg, results)
    report.write(rep, Path(out_dir), plots=plots)
    return rep


def main_sweep(
    out_dir: str | Path,
    shares: Sequence[float],
    seeds: int = 10,
    first_seed: int = 0,
    policies: Sequence[str] = POLICIES,
    workers: int = 1,
    plots: bool = True,
    **config: Any,
) -> list[tuple[float, dict[str, Any]]]:
    """Entry point of ``fleetyield simulate sweep``: ``main_simulate`` once per precursor share, each
    report in ``out_dir/precursor_<share>``; returns ``(share, report)`` rows.

    Unmodified Slurm (``BARE``) reads no telemetry, and the world draws its faults the same way at every
    share, so a bare policy's run does not depend on the share: it is simulated at the first share and its
    per-seed results stand in the other shares' reports (tests/sim/test_sim_cli.py checks them against a
    fresh run). That is 2 of the 4 policies of a do-no-harm cell simulated once instead of per share."""
    from slurm_fleetyield.sim import report

    seed_list = list(range(first_seed, first_seed + seeds))
    bare: dict[int, dict[str, dict[str, Any]]] | None = None
    rows: list[tuple[float, dict[str, Any]]] = []
    for share in shares:
        cfg = make_config(precursor_share=share, **config)
        todo = [p for p in policies if bare is None or p not in BARE]
        ran = run_seeds(cfg, seed_list, todo, workers)
        if bare is None:
            bare = {s: {p: m for p, m in ran[s].items() if p in BARE} for s in seed_list}
        results = {s: {p: ran[s][p] if p in ran[s] else bare[s][p] for p in policies} for s in seed_list}
        rep = report.build(cfg, results)
        report.write(rep, Path(out_dir) / f"precursor_{share:g}", plots=plots)
        rows.append((share, rep))
    return rows


def make_config(**kw: Any) -> SimConfig:
    """``SimConfig`` from flat keyword arguments; fault knobs may be given flat (``precursor_share=...``)."""
    fault_names = set(fm.FaultParams.__dataclass_fields__)
    fkw = {k: kw.pop(k) for k in list(kw) if k in fault_names}
    unknown = set(kw) - set(SimConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"unknown simulation option(s): {', '.join(sorted(unknown))}")
    base = kw.pop("faults", fm.FaultParams())
    cfg = SimConfig(**kw, faults=replace(base, **fkw).validate())
    checks = {
        "collective_timeout_s": cfg.collective_timeout_s >= 0,
        "health_check_interval_s": cfg.health_check_interval_s > 0,
        "restart_s": cfg.restart_s >= 0,
    }
    if cfg.tick_mode not in TICK_MODES:
        known = ", ".join(TICK_MODES)
        raise ValueError(f"simulation option tick_mode={cfg.tick_mode!r} is not one of {known}")
    if cfg.service_loss not in SERVICE_LOSS:
        known = ", ".join(SERVICE_LOSS)
        raise ValueError(f"simulation option service_loss={cfg.service_loss!r} is not one of {known}")
    for name, ok in checks.items():
        if not ok or not math.isfinite(getattr(cfg, name)):
            raise ValueError(f"simulation option {name}={getattr(cfg, name)!r} is out of range")
    return cfg
