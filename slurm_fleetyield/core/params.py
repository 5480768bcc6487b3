"""Controller parameters: one documented, validated pydantic model per stage of the loop.

Input: a mapping (the ``[core]`` part of the config file, loaded by ``slurm_fleetyield/config.py``). Output:
an immutable ``Params`` tree handed to ``tick``. Validation runs in two passes, like node-problem-detector's
config: field defaults and types first, then cross-field rules (thresholds ordered, named units known), each
error quoting the offending value. Nothing is clamped silently: a bad value is a startup error.

Every default states where it comes from. Published rates are from ``shared/data/README.md``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, field_validator, model_validator

from slurm_fleetyield.core.lifecycle import LifecycleParams
from slurm_fleetyield.core.params_base import _FROZEN, _LAX, _workload_classes
from slurm_fleetyield.core.params_detect import (
    DEFAULT_QUARANTINE_XIDS,
    DEFAULT_RISK_ONLY_XIDS,
    GPU_FATAL_PER_DAY,
    LLAMA3_DAYS,
    LLAMA3_GPU_ATTRIBUTABLE,
    LLAMA3_GPUS,
    LLAMA3_INTERRUPTIONS,
    ProfileParams,
    QuarantineParams,
    RiskParams,
    SenseParams,
)
from slurm_fleetyield.core.params_place import (
    ClassStake,
    GangParams,
    KeepOpenParams,
    PremiumParams,
    PriceParams,
    ReclaimParams,
    StakeParams,
)
from slurm_fleetyield.core.params_spares import SpareParams

__all__ = [
    "DEFAULT_QUARANTINE_XIDS",
    "DEFAULT_RISK_ONLY_XIDS",
    "GPU_FATAL_PER_DAY",
    "LLAMA3_DAYS",
    "LLAMA3_GPUS",
    "LLAMA3_GPU_ATTRIBUTABLE",
    "LLAMA3_INTERRUPTIONS",
    "ClassStake",
    "GangParams",
    "GateParams",
    "KeepOpenParams",
    "LearnParams",
    "Params",
    "PremiumParams",
    "PriceParams",
    "ProfileParams",
    "QuarantineParams",
    "ReclaimParams",
    "RiskParams",
    "SenseParams",
    "SettleParams",
    "SpareParams",
    "StakeParams",
]


class GateParams(BaseModel):
    """Drain proposals: when a degrading node is put to a human, and when the question is taken back."""

    model_config = _FROZEN

    propose_on_red: bool = Field(
        True,
        description="Open a drain proposal when a node's risk reaches risk.red_threshold without fatal "
        "evidence. Off: red nodes are only priced last (no proposal, nothing is drained).",
    )
    proposal_ttl_s: float = Field(
        24 * 3600.0,
        gt=0,
        description="A proposal nobody decided expires after this (the shell marks it expired); a node still "
        "red then gets a new one. A day: every shift sees it once.",
    )
    min_risk_to_keep_open: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="An open proposal is withdrawn once the node's risk stays below this for "
        "withdraw_after_s. None: risk.yellow_threshold (hysteresis: proposed at red, withdrawn below "
        "yellow).",
    )
    withdraw_after_s: float = Field(
        3600.0,
        ge=0,
        description="How long risk must stay below min_risk_to_keep_open before the proposal is withdrawn "
        "(an hour: one quiet scrape window must not cancel a question a human may be reading).",
    )
    deny_cooldown_s: float = Field(
        7 * 86_400.0,
        ge=0,
        description="After a denial the node is not proposed again for this long, unless its risk rises by "
        "deny_risk_margin over the risk at the denial (the admin judged that evidence, not worse evidence).",
    )
    deny_risk_margin: float = Field(
        0.2,
        gt=0,
        le=1,
        description="Risk increase (absolute) over the denied proposal that re-proposes early.",
    )


class SettleParams(BaseModel):
    """Ledger accounting of finished jobs (core/settle.py)."""

    model_config = _FROZEN

    premium_needing_classes: Annotated[tuple[str, ...], _LAX] = Field(
        ("pretrain", "finetune"),
        description="Workload classes that need premium GPUs. Other work on premium GPUs while one of these "
        "was pending is premium misuse.",
    )
    fatal_slack_s: float = Field(
        120.0,
        ge=0,
        description="A fatal event on a job's node up to this long after the job's end still explains its "
        "failure (the job dies first, the agent's push arrives seconds later).",
    )
    pending_memory_s: float = Field(
        14 * 86_400.0,
        gt=0,
        description="How far back the record of premium-needing-work-pending intervals reaches (longer than "
        "any job that can still be settled).",
    )
    max_pending_intervals: int = Field(4096, gt=0, description="Bound of that record (oldest dropped).")
    max_settled_ids: int = Field(
        100_000, gt=0, description="Bound of the remembered settled job ids (idempotency)."
    )

    @field_validator("premium_needing_classes")
    @classmethod
    def _classes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _workload_classes(v, "premium_needing_classes")


class LearnParams(BaseModel):
    """Recalibration of the risk model from resolved predictions, and lemon detection (core/learn.py)."""

    model_config = _FROZEN

    enabled: bool = Field(
        True, description="Apply learned multipliers to the risk model (predictions are tracked either way)."
    )
    prior_strength: float = Field(
        5.0,
        gt=0,
        description="Gamma prior of each multiplier, in expected events: multiplier = (prior + observed) / "
        "(prior + expected). Five: a signal needs several events' worth of evidence before it moves far "
        "from 1 (a 1.6%-per-week node base rate takes ~300 node-weeks per expected event).",
    )
    bins: int = Field(10, ge=2, le=100, description="Bins of the reliability table (log-spaced, 1e-4 .. 1).")
    min_multiplier: float = Field(0.1, gt=0, description="Learned multipliers are bounded to this ...")
    max_multiplier: float = Field(20.0, gt=0, description="... and this (one bad week cannot zero a signal).")
    publish_tolerance: float = Field(
        0.02,
        ge=0,
        lt=1,
        description="A bucket's multiplier is republished only when its posterior mean moved by more than "
        "this share of the published value: the mean drifts a little with every resolved prediction, and "
        "each new value re-scores every GPU of its bucket. 2% of a hazard is far inside the posterior's own "
        "spread (prior_strength 5: ~45% relative). 0: publish every change.",
    )
    lemon_failures: int = Field(
        2,
        ge=1,
        description="Fatal failures within lemon_window_s that flag a node as a lemon (Meta RSC: ~1.2% of "
        "nodes; Titan: GPUs returned after a failure fail again x8 as often overall).",
    )
    lemon_window_s: float = Field(30 * 86_400.0, gt=0, description="Window of lemon_failures (seconds).")
    lemon_dedup_s: float = Field(
        3600.0,
        ge=0,
        description="Fatal evidence closer than this to the previous one is the same failure (a push and "
        "the next scrape of the same XID).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> LearnParams:
        if not self.min_multiplier <= 1.0 <= self.max_multiplier:
            raise ValueError(
                f"min_multiplier={self.min_multiplier!r} <= 1 <= "
                f"max_multiplier={self.max_multiplier!r} required"
            )
        return self


class Params(BaseModel):
    """All decision-core parameters, grouped per stage."""

    model_config = _FROZEN

    sense: SenseParams = Field(default_factory=SenseParams, description="Freshness and trend windows.")
    risk: RiskParams = Field(default_factory=RiskParams, description="Risk model and tier thresholds.")
    profile: ProfileParams = Field(default_factory=ProfileParams, description="Envelope features.")
    price: PriceParams = Field(default_factory=PriceParams, description="Node weights.")
    stake: StakeParams = Field(default_factory=StakeParams, description="Expected-loss class features.")
    spares: SpareParams = Field(default_factory=SpareParams, description="Hot spares for gangs.")
    quarantine: QuarantineParams = Field(default_factory=QuarantineParams, description="Drains and caps.")
    lifecycle: LifecycleParams = Field(default_factory=LifecycleParams, description="Rehabilitation.")
    gate: GateParams = Field(default_factory=GateParams, description="Drain proposals.")
    premium: PremiumParams = Field(default_factory=PremiumParams, description="Premium widening.")
    gangs: GangParams = Field(default_factory=GangParams, description="Gang widening.")
    keep_open: KeepOpenParams = Field(
        default_factory=KeepOpenParams, description="Class features never on no node."
    )
    reclaim: ReclaimParams = Field(default_factory=ReclaimParams, description="Premium reclaim.")
    settle: SettleParams = Field(default_factory=SettleParams, description="Job ledger.")
    learn: LearnParams = Field(default_factory=LearnParams, description="Recalibration and lemons.")

    @model_validator(mode="after")
    def _gate_vs_risk(self) -> Params:
        keep = self.gate.min_risk_to_keep_open
        if keep is not None and keep >= self.risk.red_threshold:
            raise ValueError(
                f"gate.min_risk_to_keep_open={keep!r} must be below risk.red_threshold="
                f"{self.risk.red_threshold!r}: a proposal would be withdrawn while the node is still red"
            )
        return self
