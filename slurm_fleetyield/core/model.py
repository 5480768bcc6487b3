"""Vocabulary of the decision core: health, tiers, risk, envelopes, decisions, the ledger and calibration.

What the controller observes lives in core/observe.py (re-exported here). Input: nothing (types only).
Output: immutable value types shared by every stage of the loop, by the daemon and by the simulator.
Hot-path types are frozen dataclasses with ``slots`` because a 100k-GPU tick builds hundreds of thousands
of them; pydantic models live at the boundaries instead (config, wire formats, API).

GPU readings keep dcgm-exporter's field names (``DCGM_FI_DEV_*``, core/observe.py) so that the direct agent
path, a real dcgm-exporter fleet and the Prometheus path all feed the same decision code unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from slurm_fleetyield.core.observe import (
    FY_PREFIX,
    HOLDING_STATES,
    OUR_REASON_PREFIX,
    RUNNING_STATES,
    UNSAID_GPUS,
    CanaryResult,
    ConfirmedAction,
    FailedAction,
    FatalEvent,
    FleetScrape,
    GateDecision,
    GpuReading,
    JobIndex,
    JobOutcome,
    JobView,
    NodeSample,
    Observations,
    SlurmNode,
    WorkloadClass,
)

__all__ = [
    "FY_PREFIX",
    "HOLDING_STATES",
    "OUR_REASON_PREFIX",
    "RUNNING_STATES",
    "UNSAID_GPUS",
    "CanaryResult",
    "ConfirmedAction",
    "FailedAction",
    "FatalEvent",
    "FleetScrape",
    "GateDecision",
    "GpuReading",
    "JobIndex",
    "JobOutcome",
    "JobView",
    "NodeSample",
    "Observations",
    "SlurmNode",
    "WorkloadClass",
]


class Health(StrEnum):
    """Sensed health of a GPU or node. UNKNOWN is never healthy and never bad (no data is not evidence)."""

    OK = "ok"
    WARN = "warn"
    BAD = "bad"
    UNKNOWN = "unknown"


class Tier(StrEnum):
    """Where a node stands for placement. Mapped to ``fy_tier_*`` features and to node weights."""

    GREEN = "green"  # full service
    YELLOW = "yellow"  # marginal: checkpointable / retry-cheap work only
    RED = "red"  # risk past the drain threshold: a drain is proposed, still runs what it has
    QUARANTINED = "quarantined"  # drained by us after a fatal fault (or an approved proposal)
    CANARY = "canary"  # rehabilitation: only canary jobs
    PROBATION = "probation"  # rehabilitation: back in service as yellow until it proves itself
    RETIRED = "retired"  # repeated failures: stays drained, needs RMA
    UNKNOWN = "unknown"  # no fresh data: nothing destructive happens, placement keeps the last known tier


# --------------------------------------------------------------------------------------------------------
# Explanations (every decision carries its reason and evidence)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Contribution:
    """One signal's share in a risk score: its observed value and how much it moved the score."""

    signal: str
    value: float
    weight: float  # contribution to the log-odds
    detail: str = ""


@dataclass(slots=True)
class GpuRisk:
    """One GPU's risk. A value, never changed once built; not frozen only for speed
    (tests/core/test_values_stay_unassigned.py)."""

    node: str
    index: int
    uuid: str
    model: str
    health: Health
    probability: float  # P(fatal failure within the configured horizon)
    contributions: tuple[Contribution, ...] = ()  # the signals that moved the score (non-zero)
    fatal_xids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeRisk:
    node: str
    health: Health
    probability: float  # P(at least one GPU of the node fails fatally within the horizon)
    gpus: tuple[GpuRisk, ...] = ()
    reason: str = ""
    stale_s: float | None = None  # age of the newest usable sample, None: never seen


# --------------------------------------------------------------------------------------------------------
# Decisions (output of a tick, besides the plan)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a node can serve, derived from its GPUs' health (core/profile.py).

    ``known`` False means no fresh telemetry: the booleans are then the last known ones (or False).
    """

    gpu_model: str = ""
    premium: bool = False
    nvlink: bool = False  # the board has NVLink at all
    nvlink_full: bool = False  # every GPU's links are clean
    hbm_full: bool = False  # no remap failure/pending, no lost capacity, few uncorrectable rows
    known: bool = False
    notes: tuple[str, ...] = ()  # why a capability is withheld


@dataclass(frozen=True, slots=True)
class NodeDecision:
    """Everything decided about one node this tick, with its reason and evidence (what ``explain`` prints)."""

    node: str
    tier: Tier
    health: Health
    risk: float
    fy_features: tuple[str, ...]  # sorted fy_ features wanted on the node
    features: tuple[str, ...]  # full wanted list: admin features in their order, then fy_features
    weight: int
    slurm_state: str  # Slurm states joined with '+', e.g. "MIXED+DRAIN"; "" when Slurm does not know it
    reason: str
    evidence: tuple[str, ...] = ()
    envelope: Envelope = field(default_factory=Envelope)
    managed: bool = True  # False: drained by someone else or unknown to Slurm; FleetYield leaves it alone


@dataclass(frozen=True, slots=True)
class LogEvent:
    """Something worth a log line or an alert. ``kind``: tier_change, drain, hold, drain_proposal, ..."""

    time: float
    node: str
    kind: str
    message: str
    data: Mapping[str, object] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------------
# Settle and learn (outputs of a tick besides the plan)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One settled job (core/settle.py). Net goodput = useful - wasted; the shell aggregates."""

    job_id: int
    workload: WorkloadClass | None
    nodes: tuple[str, ...]
    gpus: int
    start: float
    end: float
    state: str
    useful_gpu_s: float  # completed work, or progress up to the last checkpoint
    wasted_gpu_s: float  # progress lost to hardware (since the last checkpoint; whole run without one)
    premium_misuse_gpu_s: float  # non-premium-needing work on premium GPUs while premium-needing work waited
    failure: bool
    tier_at_start: str  # tier of the job's first node when it started ("unknown" if not known)
    cause: str  # completed | hardware | node_fail | drain | job | timeout | cancelled


@dataclass(frozen=True, slots=True)
class ReliabilityBin:
    """One bin of the reliability table: predictions whose probability fell in [lower, upper)."""

    lower: float
    upper: float
    predicted_mean: float  # nan when empty
    observed_frequency: float  # nan when empty
    count: int


@dataclass(frozen=True, slots=True)
class Calibration:
    """How well the risk model's predictions came true (core/learn.py)."""

    bins: tuple[ReliabilityBin, ...] = ()
    brier: float = float("nan")  # mean squared error of resolved predictions (nan: none resolved)
    resolved: int = 0
    multipliers: Mapping[str, float] = field(
        default_factory=dict
    )  # signal bucket ("base", signal) -> hazard x
    open_predictions: int = 0
