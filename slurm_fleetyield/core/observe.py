"""What the controller observes: GPU readings, Slurm's nodes and jobs, pushed fatal events, the shell's
feedback (canaries, gate decisions, job outcomes, actions that failed or were confirmed), one tick's
``Observations``, and the per-tick index of its jobs (``Observations.job_index``).

Input: nothing (types only). Output: the immutable input types of a tick, built by the daemon's adapters and
by the simulator. GPU readings keep dcgm-exporter's field names (``DCGM_FI_DEV_*``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

FY_PREFIX = "fy_"
"""Every Slurm node feature FleetYield owns starts with this prefix; all others belong to the admin."""

UNSAID_GPUS = 8
"""The GPUs of a node whose Gres Slurm does not say (or that Slurm does not list): the common 8-GPU board."""

OUR_REASON_PREFIX = "fleetyield:"
"""Drain reasons FleetYield writes start with this. A drain with any other reason is someone else's."""

_DRAIN_STATES = frozenset({"DRAIN", "DRAINED", "DRAINING"})  # Slurm state flags of a drained node
OUT_OF_SERVICE_STATES = frozenset(
    {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN"}
)
"""Slurm state flags of a node that takes no new work (drained, down, failing, unreachable, powered down)."""
RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
"""Job states in which a job uses its GPUs now (idle counts and premium's running work)."""


class WorkloadClass(StrEnum):
    """Workload classes with distinct resource envelopes (see core/profile.py)."""

    DECODE = "decode"  # inference decode: memory-bandwidth bound, small, latency sensitive
    PRETRAIN = "pretrain"  # gangs: NVLink bound, expensive to lose
    FINETUNE = "finetune"  # HBM-capacity bound
    BATCH = "batch"  # batch / eval: checkpointable, cheap to retry
    CANARY = "canary"  # FleetYield's own rehabilitation probes


# --------------------------------------------------------------------------------------------------------
# Observations (input of a tick)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as one scrape saw it. ``fields`` maps DCGM field names to values (counters are cumulative).

    ``xid_totals`` holds cumulative per-XID counts (our agent's monotonic counter); from a plain dcgm-exporter
    it is derived from the windowed ``DCGM_EXP_XID_ERRORS_COUNT`` and is then a lower bound.
    """

    index: int
    uuid: str
    model: str
    pci_bus_id: str = ""
    fields: Mapping[str, float] = field(default_factory=dict)
    xid_totals: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One scrape of one node. ``error`` set means the scrape failed and nothing here is evidence."""

    node: str
    time: float
    gpus: tuple[GpuReading, ...] = ()
    expected_gpus: int | None = None  # what the agent believes the node should have (None: not exported)
    error: str | None = None
    source: str = "agent"  # agent | dcgm-exporter | prometheus


class FleetScrape(Mapping[str, NodeSample]):
    """Every node of a fleet scraped at one ``time``, each successfully, each agent expecting
    ``expected_gpus``: ``readings`` per node. Reads as ``node -> NodeSample`` (built on demand), the
    ``Observations.samples`` of a shell that samples the whole fleet at once (the simulator); the sense stage
    reads the readings directly, and a readings tuple that is the very one of the last scrape tells it the
    node brought nothing new."""

    __slots__ = ("expected_gpus", "readings", "source", "time")

    def __init__(
        self,
        time: float,
        readings: Mapping[str, tuple[GpuReading, ...]],
        expected_gpus: int | None = None,
        source: str = "agent",
    ) -> None:
        self.time = time
        self.readings = readings
        self.expected_gpus = expected_gpus
        self.source = source

    def __getitem__(self, node: str) -> NodeSample:
        return NodeSample(node, self.time, self.readings[node], self.expected_gpus, None, self.source)

    def __iter__(self) -> Iterator[str]:
        return iter(self.readings)

    def __len__(self) -> int:
        return len(self.readings)

    def __contains__(self, node: object) -> bool:
        return node in self.readings


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """A node as Slurm reports it (``scontrol show node`` / ``sinfo``)."""

    name: str
    states: frozenset[str]  # e.g. {"IDLE"}, {"MIXED", "DRAIN"}, {"DOWN", "NOT_RESPONDING"}
    reason: str = ""
    available_features: tuple[str, ...] = ()
    active_features: tuple[str, ...] = ()
    weight: int = 1
    gpu_type: str | None = None  # from Gres=gpu:<type>:N
    gpu_count: int = 0
    partitions: tuple[str, ...] = ()
    boot_time: float | None = None  # BootTime (epoch seconds): when the node last booted; None unknown

    @property
    def drained(self) -> bool:
        return not self.states.isdisjoint(_DRAIN_STATES)

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(OUR_REASON_PREFIX)

    @property
    def drained_by_other(self) -> bool:
        return self.drained and not self.reason.startswith(OUR_REASON_PREFIX)

    @property
    def admin_features(self) -> tuple[str, ...]:
        return tuple(f for f in self.available_features if not f.startswith(FY_PREFIX))


@dataclass(frozen=True, slots=True)
class JobView:
    """A running or pending job, as far as the decisions need it."""

    job_id: int
    state: str  # RUNNING, PENDING, ...
    nodes: tuple[str, ...] = ()
    requeue: bool = True  # Slurm's Requeue flag: may this job be requeued?
    workload: WorkloadClass | None = None
    gpus: int = 0
    # (node, GPU indices the job holds there) from squeue's gres_detail "gpu:h100:2(IDX:0-1)"; a node not
    # listed: unknown (the text fallback, or no File= in gres.conf), treated as holding every GPU
    gpu_index: tuple[tuple[str, tuple[int, ...]], ...] = ()
    qos: str = ""  # Slurm's QOS ("" unknown); the preemptible one's jobs may be evicted (core/spares.py)
    # Slurm's restart count (squeue --json ``restart_cnt``; 0 where unknown, the squeue -o fallback): a
    # pending gang that ran before is about to restart and keeps its hot spares (core/spares.py)
    restarts: int = 0

    def holds_gpu(self, node: str, gpus: frozenset[int]) -> bool:
        """Does the job hold any of ``gpus`` on ``node``? True when its indices there are unknown."""
        for n, idx in self.gpu_index:
            if n == node:
                return not gpus.isdisjoint(idx)
        return True


@dataclass(frozen=True, slots=True)
class FatalEvent:
    """A fatal hardware event: pushed by an agent, seen in a scrape, or fired by Alertmanager."""

    event_id: str
    node: str
    time: float
    kind: str  # xid | gpu_missing | alert | check_failed | attestation_failed (message: the records)
    gpu: int | None = None
    uuid: str | None = None
    xid: int | None = None
    message: str = ""
    source: str = "agent-push"


# --------------------------------------------------------------------------------------------------------
# Feedback from the shell (inputs of gate, lifecycle, settle): all optional fields of ``Observations``
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CanaryResult:
    """A canary job (named ``fy_canary_<token>``) as sacct/squeue report it.

    ``state``: COMPLETED, FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, CANCELLED, PENDING or RUNNING. Only the
    result of the node's current round (``token``) counts; COMPLETED with exit code 0 (or None) is a pass,
    FAILED/TIMEOUT/NODE_FAIL/OUT_OF_MEMORY a failure; CANCELLED, PENDING and RUNNING are ignored.
    """

    node: str
    job_id: int
    token: str
    state: str
    exit_code: int | None = None
    end_time: float | None = None


@dataclass(frozen=True, slots=True)
class GateDecision:
    """An admin decision on a drain proposal, verified by the shell (Gatekeeper signature check).

    ``action``: ``approve`` or ``deny``. Approvals are re-sent every tick until Slurm shows the node drained
    by us for that proposal (the core treats a repeat as a no-op); denials are sent once.
    """

    proposal_id: str
    node: str
    action: str  # approve | deny
    admin: str
    time: float


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A finished (or requeued) job, delivered once by the shell; the core ignores a job id it settled."""

    job_id: int
    node_list: tuple[str, ...]
    gpus: int  # GPUs of the whole job
    workload: WorkloadClass | None
    start: float
    end: float
    state: str  # COMPLETED, FAILED, NODE_FAIL, TIMEOUT, CANCELLED, OUT_OF_MEMORY, REQUEUED, PREEMPTED
    exit_code: int | None = None
    last_checkpoint: float | None = None  # time of the job's last checkpoint (None: never checkpointed)
    user: str = ""
    premium: bool | None = None  # ran on premium GPUs (None: the core derives it from the node's envelope)


@dataclass(frozen=True, slots=True)
class FailedAction:
    """An action of the previous plan that failed to apply. ``kind``: the action's ``kind`` (reboot, ...)."""

    kind: str
    node: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ConfirmedAction:
    """A remediation that runs off the tick (a BMC power cycle) and has finished successfully since the last
    tick. ``kind``: the action's ``kind`` (power_cycle). The lifecycle takes it as REMEDIATION_STARTED: the
    node's boot starts now, so the attempt's clock (deadline, settle window) restarts from this tick."""

    kind: str
    node: str
    detail: str = ""


@dataclass(frozen=True)
class Observations:
    """Everything one tick sees. Built by adapters (live) or by the simulator; the core never does I/O.

    One per tick: a shell may update its mappings in place between ticks (the simulator's Slurm view is
    one such mapping) but not while a tick reads them; stages copy what they keep (``state.slurm_view``).
    Read once per tick, for every stage that needs them: ``job_index``, its queue split (``JobIndex``),
    ``gpus``, each Slurm node's GPU count, and ``idle``, each in-service node's idle GPUs."""

    time: float
    slurm: Mapping[str, SlurmNode]
    samples: Mapping[str, NodeSample]
    fatal_events: tuple[FatalEvent, ...] = ()
    jobs: tuple[JobView, ...] = ()
    slurm_ok: bool = True  # False: Slurm could not be read; the tick must not act on Slurm state
    canary_results: tuple[CanaryResult, ...] = ()
    gate_decisions: tuple[GateDecision, ...] = ()
    outcomes: tuple[JobOutcome, ...] = ()
    failed_actions: tuple[FailedAction, ...] = ()  # earlier actions that failed (off-tick ones: when done)
    confirmed_actions: tuple[ConfirmedAction, ...] = ()
    in_flight: frozenset[str] = frozenset()  # nodes whose remediation still runs off the tick: not judged yet

    @cached_property
    def job_index(self) -> JobIndex:
        """The queue split once (a frozen view of a tuple of frozen jobs cannot change under it)."""
        return JobIndex(self.jobs)

    @cached_property
    def gpus(self) -> Mapping[str, int]:
        """Each Slurm node's GPUs from its Gres, ``UNSAID_GPUS`` where Slurm does not say."""
        return {name: s.gpu_count or UNSAID_GPUS for name, s in self.slurm.items()}

    @cached_property
    def idle(self) -> Mapping[str, int]:
        """Idle GPUs per in-service node, in Slurm's order: IDLE -> all, ALLOCATED -> none, else its Gres
        minus the running jobs' share (``JobView.gpus`` is a job's total: a multi-node job uses gpus /
        len(nodes) on each of its nodes; the jobs are read only when some node is neither)."""
        out: dict[str, int] = {}
        partly: list[str] = []
        for name, s in self.slurm.items():
            if out_of_service(s):
                continue
            out[name] = s.gpu_count if "IDLE" in s.states else 0
            if "IDLE" not in s.states and "ALLOCATED" not in s.states:
                partly.append(name)
        if partly:
            used: dict[str, float] = {}
            for j in self.job_index.holding:
                if j.state in RUNNING_STATES and j.nodes and j.gpus > 0:
                    share = j.gpus / len(j.nodes)
                    for n in j.nodes:
                        used[n] = used.get(n, 0.0) + share
            for name in partly:
                out[name] = max(0, self.slurm[name].gpu_count - math.ceil(used.get(name, 0.0) - 1e-9))
        return out


def out_of_service(s: SlurmNode) -> bool:
    """A node that takes no new work: no state known, or a state flag of ``OUT_OF_SERVICE_STATES``."""
    return not s.states or not OUT_OF_SERVICE_STATES.isdisjoint(s.states)


# Job states in which a job holds its nodes (squeue): every stage's notion of "running" is one of these.
HOLDING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"})


class JobIndex:
    """One tick's queue (``Observations.jobs``) split once, in queue order, for the stages that each looked
    for a few jobs in all of it (a backlogged simulated fleet holds thousands of pending jobs and a few
    hundred running ones). Every list keeps the queue's order; a stage still applies its own test to them.

    ``pending``: state PENDING; ``pending_by``: those by workload class (None: unclassified); ``holding``:
    a state of ``HOLDING_STATES``, ``holding_by`` by class; ``placed``: jobs with nodes, any state; ``by``:
    every job by class."""

    __slots__ = ("by", "holding", "holding_by", "jobs", "pending", "pending_by", "placed")

    def __init__(self, jobs: tuple[JobView, ...]) -> None:
        pending: list[JobView] = []
        holding: list[JobView] = []
        placed: list[JobView] = []
        pending_by: dict[WorkloadClass | None, list[JobView]] = {}
        holding_by: dict[WorkloadClass | None, list[JobView]] = {}
        by: dict[WorkloadClass | None, list[JobView]] = {}
        for j in jobs:
            w = j.workload
            if j.state == "PENDING":
                pending.append(j)
                pending_by.setdefault(w, []).append(j)
            elif j.state in HOLDING_STATES:
                holding.append(j)
                holding_by.setdefault(w, []).append(j)
            if j.nodes:
                placed.append(j)
            by.setdefault(w, []).append(j)
        self.jobs = jobs
        self.pending: tuple[JobView, ...] = tuple(pending)
        self.holding: tuple[JobView, ...] = tuple(holding)
        self.placed: tuple[JobView, ...] = tuple(placed)
        self.pending_by: Mapping[WorkloadClass | None, tuple[JobView, ...]] = {
            w: tuple(js) for w, js in pending_by.items()
        }
        self.holding_by: Mapping[WorkloadClass | None, tuple[JobView, ...]] = {
            w: tuple(js) for w, js in holding_by.items()
        }
        self.by: Mapping[WorkloadClass | None, tuple[JobView, ...]] = {w: tuple(js) for w, js in by.items()}
