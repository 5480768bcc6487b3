"""Controller parameters: one documented, validated pydantic model per stage of the loop.

Input: a mapping (the ``[core]`` part of the config file, loaded by ``slurm_fleetyield/config.py``). Output:
an immutable ``Params`` tree handed to ``tick``. Validation runs in two passes, like node-problem-detector's
config: field defaults and types first, then cross-field rules (thresholds ordered, named units known), each
error quoting the offending value. Nothing is clamped silently: a bad value is a startup error.

Every default states where it comes from. Published rates are from ``shared/data/README.md``.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from slurm_fleetyield.core.lifecycle import LifecycleParams
from slurm_fleetyield.core.signals import SIGNAL_NAMES, SIGNALS_BY_NAME

# Strict: a TOML string "0.5", a boolean or 1 is never a float, "yes" never a bool, "9402" never an int; an
# integer is still a float. Finite: inf/nan are refused (max_skew = inf would accept replays forever).
_FROZEN = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
_LAX = Strict(False)
"""On a container only: TOML gives lists where a tuple is kept (its items stay strict)."""

# --- base-rate derivation (kept as named constants so explain/README can quote them) ----------------------
LLAMA3_INTERRUPTIONS = 419  # Llama 3, arXiv 2407.21783, Table 5: unexpected interruptions
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384  # H100
LLAMA3_GPU_ATTRIBUTABLE = 148 + 72 + 19 + 17  # faulty GPU + HBM3 + GPU SRAM + GPU system processor = 256
GPU_FATAL_PER_DAY = LLAMA3_GPU_ATTRIBUTABLE / (LLAMA3_DAYS * LLAMA3_GPUS)
"""≈ 2.89e-4 fatal GPU interruptions per GPU-day (61% of 3.79 per 1,000 node-days, divided by 8 GPUs)."""


class SenseParams(BaseModel):
    """Freshness and trend windows of the sense stage."""

    model_config = _FROZEN

    stale_after_s: float = Field(
        60.0,
        gt=0,
        description="A node sample older than this (or missing, or a failed scrape) makes the node UNKNOWN. "
        "Two missed 30 s scrapes: long enough to ride out one slow scrape, short enough that a dead "
        "exporter is noticed within a minute.",
    )
    trend_windows_s: Annotated[tuple[float, ...], _LAX] = Field(
        (600.0, 3600.0),
        description="Windows (seconds) over which counter growth is turned into a per-hour rate; a signal "
        "uses the largest rate over all windows, so a 10-minute burst and an hour-long trickle are both "
        "seen. History is trimmed to the longest window.",
    )
    history_resolution_s: float = Field(
        60.0,
        gt=0,
        description="Minimum spacing of stored history points per GPU. Bounds the ring to "
        "longest_window / resolution + 1 points however fast the controller ticks.",
    )

    @field_validator("trend_windows_s")
    @classmethod
    def _windows(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v:
            raise ValueError("trend_windows_s must name at least one window, got ()")
        for w in v:
            if not (w > 0 and math.isfinite(w)):
                raise ValueError(f"trend_windows_s entries must be positive seconds, got {w!r}")
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _resolution_fits(self) -> SenseParams:
        if self.history_resolution_s > self.trend_windows_s[0]:
            raise ValueError(
                f"history_resolution_s={self.history_resolution_s!r} is coarser than the shortest trend "
                f"window {self.trend_windows_s[0]!r}: that window could never see two points"
            )
        return self

    @property
    def longest_window_s(self) -> float:
        return self.trend_windows_s[-1]


class RiskParams(BaseModel):
    """The explainable logistic risk model: base rate, horizon, named signals and tier thresholds."""

    model_config = _FROZEN

    horizon_days: float = Field(7.0, gt=0, description="Probabilities are P(fatal GPU failure within this).")
    gpu_fatal_per_day: float = Field(
        GPU_FATAL_PER_DAY,
        gt=0,
        lt=1,
        description="Base hazard of a fatal failure per GPU-day. Default from Llama 3 (arXiv 2407.21783, "
        "Table 5): 419 interruptions in 54 days on 16,384 H100 (3.79 per 1,000 node-days); the "
        "GPU-attributable share (faulty GPU 148 + HBM3 72 + SRAM 19 + GSP 17 = 256, 61%) gives "
        "256 / (54 x 16,384) = 2.89e-4 per GPU-day, i.e. 0.20% per GPU and 1.6% per 8-GPU node over 7 days.",
    )
    signals: Annotated[tuple[str, ...], _LAX] = Field(
        SIGNAL_NAMES,
        description="Enabled risk signals, by name, evaluated in this order (see core/signals.py). "
        "An unknown name is a validation error.",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Per-signal scale of its log-odds steps (default 1.0 each; 0 mutes a signal but keeps "
        "its value in explanations).",
    )
    steps: dict[str, Annotated[tuple[Annotated[tuple[float, float], _LAX], ...], _LAX]] = Field(
        default_factory=dict,
        description="Per-signal override of its (threshold, log-odds) step table; thresholds strictly "
        "increasing (for margin signals: strictly decreasing).",
    )
    yellow_threshold: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Node probability at or above which the node is yellow (GPU: WARN). 0.05 is ~3x the "
        "1.6% base of an 8-GPU node: one clearly elevated GPU, not fleet noise.",
    )
    red_threshold: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Node probability at or above which the node is red (GPU: BAD) and a drain proposal "
        "would be made (the human gate decides; red nodes keep running their jobs).",
    )
    fatal_history_days: float = Field(
        90.0,
        gt=0,
        description="Fatal events younger than this make a GPU/node a repeat offender (Titan, SC'20: "
        "returned GPUs fail again x342 in week 1, x48 in days 30-90, x4 later; Meta RSC: ~1.2% lemons).",
    )
    single_fault_half_life_days: float | None = Field(
        80.0,
        gt=0,
        description="A node whose only fatal failure within fatal_history_days is one isolated fault has its "
        "repeat-offender contributions (gpu_repeat_offender, node_repeat_offender) scaled by "
        "2^(-age / half-life), age counted from the fault; two or more failures keep the full weights. "
        "80 d: Poisson fit of Titan's hazard after a GPU's return to service following its first DBE/OTB "
        "(olcf/TitanGPULife gc_full.csv; sim/calibrate.post_failure_hazard, repeat_stats' definition of a "
        "return: in place or re-inserted), RR(t) = exp(5.78 x 2^(-t / 80 d)), 495 returned GPUs, 342 second "
        "failures in 87,351 GPU-days, 95% profile-likelihood interval 68-94 d. Was 22 d (13-36 d): the same "
        "fit on the 187 re-insertions only (rows without insert dropped). With the default weights one "
        "remediated fault is yellow for ~0.2 half-lives (~16 d), then green with the decayed contribution "
        "still shown. None: the old rule (full weight for fatal_history_days).",
    )
    single_fault_decay_step_hours: float = Field(
        6.0,
        ge=0,
        description="The single-fault decay is evaluated on whole steps of the fault's age, so such a node's "
        "risk moves once a step instead of every tick (at an 80 d half-life one 6 h step is 0.2% of the "
        "contribution). This keeps unchanged nodes unchanged between steps: the explanations, the view rows "
        "and the simulator's per-node reuse (docs/simulator.md, Speed) see no change. 0: continuous.",
    )
    default_slowdown_temp_c: float = Field(
        87.0,
        gt=0,
        description="GPU slowdown temperature used when the reading carries no DCGM_FI_DEV_SLOWDOWN_TEMP. "
        "Conservative for H100/H200 SXM boards; the exporter's per-board value always wins.",
    )

    @field_validator("signals")
    @classmethod
    def _known_signals(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if name not in SIGNALS_BY_NAME:
                raise ValueError(f"unknown risk signal {name!r}; known: {', '.join(SIGNAL_NAMES)}")
        if len(set(v)) != len(v):
            raise ValueError(f"risk signals listed twice in {list(v)!r}")
        return v

    @field_validator("weights")
    @classmethod
    def _known_weights(cls, v: dict[str, float]) -> dict[str, float]:
        for name, w in v.items():
            if name not in SIGNALS_BY_NAME:
                raise ValueError(f"weight for unknown risk signal {name!r}")
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"weight of {name!r} must be a finite number >= 0, got {w!r}")
        return v

    @field_validator("steps")
    @classmethod
    def _known_steps(cls, v: dict[str, tuple[tuple[float, float], ...]]) -> dict[str, tuple]:
        for name, table in v.items():
            spec = SIGNALS_BY_NAME.get(name)
            if spec is None:
                raise ValueError(f"steps for unknown risk signal {name!r}")
            ts = [t for t, _ in table]
            ordered = (
                all(b < a for a, b in pairwise(ts))
                if spec.lower_is_worse
                else all(a < b for a, b in pairwise(ts))
            )
            if not table or not ordered:
                raise ValueError(f"steps of {name!r} must be a non-empty monotone table, got {table!r}")
        return v

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> RiskParams:
        if not self.yellow_threshold < self.red_threshold:
            raise ValueError(
                f"yellow_threshold={self.yellow_threshold!r} must be below "
                f"red_threshold={self.red_threshold!r}"
            )
        return self

    @property
    def base_probability(self) -> float:
        """P(fatal within horizon) of an average GPU: 1 - exp(-hazard x horizon)."""
        return -math.expm1(-self.gpu_fatal_per_day * self.horizon_days)


class ProfileParams(BaseModel):
    """How GPU health becomes envelope features (premium, full NVLink, full HBM)."""

    model_config = _FROZEN

    premium_gpu_models: Annotated[tuple[str, ...], _LAX] = Field(
        ("h100", "h200", "b200", "gb200"),
        description="A node is premium when Slurm's gpu_type or any NVML model name contains one of these "
        "(case-insensitive substring). Premium nodes are priced last so that cheap work fills other "
        "nodes first, and admit decode only when lent by premium widening (see premium).",
    )
    nvlink_gpu_models: Annotated[tuple[str, ...], _LAX] = Field(
        ("sxm", "hbm3", "h200", "b200", "gb200", "nvl"),
        description="NVML model (or Slurm gpu_type) substrings of boards with NVLink (SXM / HGX / NVL). "
        "By model only: exporters publish NVLink counters as zeros on PCIe boards too. 'PCIe' boards "
        "match none by default.",
    )
    nvlink_crc_per_hour_max: float = Field(
        100.0,
        ge=0,
        description="fy_nvlink_full is withheld when any GPU's NVLink CRC (flit + data) error rate reaches "
        "this. CRC errors are retried by the link layer; sustained rates mean a marginal link that "
        "slows every collective of a gang.",
    )
    nvlink_replay_per_hour_max: float = Field(
        10.0,
        ge=0,
        description="fy_nvlink_full is withheld when any GPU's NVLink replay + recovery rate reaches this.",
    )
    uncorrectable_remapped_rows_max: float = Field(
        1.0,
        ge=0,
        description="fy_hbm_full is withheld when any GPU has this many uncorrectable remapped rows (rows "
        "retired after a double-bit error).",
    )
    fb_total_mib: dict[str, float] = Field(
        default_factory=lambda: {
            "h100": 81_559.0,
            "h200": 143_771.0,
            "b200": 182_000.0,
            "a100-sxm4-80gb": 81_920.0,
        },
        description="Nominal framebuffer (MiB) per model substring; a GPU reporting DCGM_FI_DEV_FB_TOTAL "
        "below nominal x fb_total_tolerance has lost capacity (e.g. retired memory) and withholds "
        "fy_hbm_full. First matching substring in insertion order wins.",
    )
    fb_total_tolerance: float = Field(0.98, gt=0, le=1, description="See fb_total_mib.")


# --- XIDs: NVIDIA's Xid catalog decides, the shell hands the result in ------------------------------------
# The catalog is data (node_agent/data/xid_catalog.csv, from docs.nvidia.com/deploy/xid-errors/
# analyzing-xid-catalog.html); node_agent/xid_catalog.py derives each XID's handling from its immediate action
# and slurm_fleetyield/xids.py applies the site's [xids] overrides; config.py fills the two tuples below in.
# These defaults are that derivation for the shipped catalog without overrides, written out so that a Params
# built without a config (simulator, benchmarks, tests) decides as the daemon does; tests/test_xids.py
# fails when they drift from the catalog. The core itself never reads the file.
# Drain: immediate action RESET_GPU (46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158),
# RESTART_BM (79), WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR (74), WORKFLOW_NVLINK5_ERR (144-150),
# CHECK_MECHANICALS (54): the GPU is not usable for new work until someone acts, which is what a drain means.
DEFAULT_QUARANTINE_XIDS = (
    46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143,
    144, 145, 146, 147, 148, 149, 150, 155, 156, 158,
)  # fmt: skip
# Risk only: 13, 31, 43 (usually the application), 63, 92, 94 (contained memory events), 154 (the recovery
# action another XID asked for), 167, 169 (no catalog action yet): they feed risk, never drain by themselves.
DEFAULT_RISK_ONLY_XIDS = (13, 31, 43, 63, 92, 94, 154, 167, 169)


class QuarantineParams(BaseModel):
    """Which fatal events drain a node, and the safety caps that bound how many drains happen."""

    model_config = _FROZEN

    quarantine_xids: Annotated[tuple[int, ...], _LAX] = Field(
        DEFAULT_QUARANTINE_XIDS,
        description="XIDs that drain the node (pushed or seen growing in a fresh scrape). Unset: those "
        "whose NVIDIA Xid catalog immediate action is a reset, a reboot or a hardware check (RESET_GPU, "
        "RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR, CHECK_MECHANICALS), with "
        "[xids] overrides applied; given: exactly these (the overrides still apply). `fleetyield xids` "
        "lists the result.",
    )
    risk_only_xids: Annotated[tuple[int, ...], _LAX] = Field(
        DEFAULT_RISK_ONLY_XIDS,
        description="XIDs counted by the xid_nonfatal risk signal only. Unset: 13, 31, 43 (usually the "
        "application), 63, 92, 94 (contained memory events), 154 (recovery action changed), 167, 169 (no "
        "catalog action yet), with [xids] overrides applied; given: exactly these.",
    )
    drain_cap_fraction: float = Field(
        0.10,
        gt=0,
        le=1,
        description="Never more than this fraction of the fleet (nodes known to Slurm) drained by "
        "FleetYield at once. A storm of fatal events is more likely a bad driver, rack or exporter "
        "than hardware: past the cap we hold and alert instead of emptying the cluster.",
    )
    drain_cap_min_nodes: int = Field(
        1,
        ge=0,
        le=100,
        description="The cap never goes below this many nodes, so a small cluster can still quarantine a "
        "dead GPU (10% of 8 nodes would otherwise be 0). At most 100: a larger floor switches the cap off "
        "for most fleets; a bigger cap is drain_cap_fraction's job.",
    )
    max_new_drains_per_window: int = Field(3, ge=0, description="At most this many new drains per window_s.")
    window_s: float = Field(600.0, gt=0, description="Rate window of max_new_drains_per_window (seconds).")
    gpu_missing_quarantines: bool = Field(
        True,
        description="A fresh, successful scrape seeing fewer GPUs than expected (agent's expected_gpus or "
        "Slurm's Gres count) drains the node: the missing GPU fell off the bus or was never enumerated.",
    )
    max_processed_event_ids: int = Field(
        10_000, gt=0, description="Bound of the remembered processed fatal event ids (idempotency)."
    )
    requeue_whole_node: bool = Field(
        False,
        description="On a fatal drain, requeue every requeueable running job on the node (repair sooner, "
        "their work since the last checkpoint lost). Off: only the jobs holding a faulted GPU (squeue's "
        "GRES IDX; a job whose GPUs are unknown counts as holding them) and, for node-wide evidence (a GPU "
        "missing without an index, an alert, a failed check or attestation), all of them; jobs on healthy "
        "GPUs finish under the drain, and remediation waits for the node to be empty. Slurm's IDX is taken "
        "to be the NVML index the XID names (AutoDetect=nvml; File=/dev/nvidia[0-7] when device minors "
        "follow PCI order, the usual case): set true where they differ (`fleetyield doctor` checks it).",
    )
    held_evidence_max_age_s: float = Field(
        86_400.0,
        gt=0,
        description="Fatal evidence whose drain a safety rule holds is reconsidered every tick for this long "
        "(seconds since the event); older held evidence is dropped (logged) and needs a human.",
    )
    fence_held_agent_evidence: bool = Field(
        True,
        description="A node whose drain a safety rule holds, on evidence its own agent pushed (a fatal "
        "XID, a GPU missing, a failed check: the agent's fatal marker, which makes the FleetYield Prolog "
        "refuse every job there), loses its fy_ok_* class features until the drain happens or the evidence "
        "is dropped: a job sent there would only fail its Prolog, be requeued held (an admin must release "
        "it) and have Slurm drain the node past the cap. Off: the node keeps its features (with the red "
        "weight), for sites without the Prolog. Evidence from a scrape or an alert never fences.",
    )

    @model_validator(mode="after")
    def _disjoint(self) -> QuarantineParams:
        both = sorted(set(self.quarantine_xids) & set(self.risk_only_xids))
        if both:
            raise ValueError(f"XIDs {both!r} are both in quarantine_xids and risk_only_xids")
        for x in (*self.quarantine_xids, *self.risk_only_xids):
            if x <= 0:
                raise ValueError(f"XID numbers are positive, got {x!r}")
        return self


class PriceParams(BaseModel):
    """Node weights (Slurm's shadow prices). The defaults and their rationale live in core/price.py."""

    model_config = _FROZEN

    tier_weights: dict[str, int] = Field(
        default_factory=dict,
        description="Override of the weight per tier name (green, yellow, red, quarantined, canary, "
        "probation, retired). Slurm allocates the LOWEST weight first.",
    )
    premium_offset: int | None = Field(
        None,
        ge=0,
        description="Override of the weight added to premium nodes (default in core/price.py: 1,000 with the "
        "premium reservation or the old tier rule, else 0: no shadow price without a reservation).",
    )

    @field_validator("tier_weights")
    @classmethod
    def _tiers(cls, v: dict[str, int]) -> dict[str, int]:
        from slurm_fleetyield.core.model import Tier

        names = {t.value for t in Tier} - {Tier.UNKNOWN.value}
        for k, w in v.items():
            if k not in names:
                raise ValueError(f"unknown tier {k!r} in tier_weights; known: {sorted(names)}")
            if not 1 <= w < 2**31:
                raise ValueError(f"weight of tier {k!r} must be in 1..2^31-1, got {w!r}")
        return v


class ClassStake(BaseModel):
    """What a fault costs one workload class's work (core/stake.py)."""

    model_config = _FROZEN

    checkpoint_s: float = Field(
        3600.0,
        ge=0,
        description="Checkpoint interval: a fault loses half of it on average. 0: the work cannot "
        "checkpoint and a fault loses half its run (run_s).",
    )
    run_s: float = Field(
        86_400.0, gt=0, description="Typical run length (used only when checkpoint_s is None)."
    )
    checkpoint_signals: Literal["off", "steps", "batch"] = Field(
        "off",
        description="Jobs of this class follow the checkpoint-signal convention: on SIGUSR2 they "
        "checkpoint and keep running, on SIGUSR1 they checkpoint and requeue themselves (scontrol requeue "
        "$SLURM_JOB_ID, as PyTorch Lightning's SLURM auto-requeue does). 'steps': the srun-launched "
        "processes handle them (scancel --signal=SIG JOB; Lightning's way); 'batch': the batch script traps "
        "them (scancel --batch). FleetYield then sends USR2 with a drain proposal and USR1 right after an "
        "approved drain instead of requeueing the job. 'off' by default: a process that does not handle "
        "the signal is killed by it.",
    )
    restart_s: float = Field(
        600.0,
        ge=0,
        description="Restart cost of an interrupted job, per GPU it holds: requeue, scheduling, "
        "initialisation, checkpoint load (assumption, minutes; Meta RSC arXiv 2410.21680 counts it in "
        "the lost time of every interruption).",
    )

    @property
    def lost_s(self) -> float:
        """Seconds each GPU of an interrupted job loses: half a checkpoint interval (half the run when it
        cannot checkpoint) of progress, plus the restart."""
        return (self.checkpoint_s or self.run_s) / 2 + self.restart_s


def _default_stakes() -> dict[str, ClassStake]:
    # Sources: the simulator's trace conventions (sim/traces.py): training checkpoints hourly, batch every
    # 30 min (assumptions, swept there). Decode is an inference service: what it served is served, so a
    # fault costs it the requests in flight (~a minute: a 2-minute "interval", half of it lost) and the
    # restart, not half its run (sim/runner.py, service_loss "inflight").
    return {
        "pretrain": ClassStake(checkpoint_s=3600.0),
        "finetune": ClassStake(checkpoint_s=3600.0),
        "batch": ClassStake(checkpoint_s=1800.0),
        "decode": ClassStake(checkpoint_s=120.0),
    }


class StakeParams(BaseModel):
    """Risk priced by what it puts at stake (core/stake.py): which nodes carry which class features."""

    model_config = _FROZEN

    enabled: bool = Field(
        True,
        description="Class features follow expected loss: a node carries a class's fy_ok_* feature unless "
        "the work that would land there stands to lose more per hour (its fatal hazard x the GPUs a fault "
        "kills x the progress lost + restart) than the GPU-hours it would do there. false: the old "
        "absolute tier rule (fy_ok_train/finetune/decode on green nodes only, fy_ok_batch on green, yellow "
        "and probation).",
    )
    classes: dict[str, ClassStake] = Field(
        default_factory=_default_stakes,
        description="Per workload class: checkpoint interval, run length, restart cost.",
    )
    repair_s: float = Field(
        86_400.0,
        gt=0,
        description="Downtime of a node after a fatal fault (reset, diagnostics, repair; assumption, the "
        "simulator's repair_h). A pre-emptive drain proposal pays only when P(fault) x (the running work's "
        "stake + GPUs x repair_s) exceeds GPUs x drain_s + the progress the requeue loses.",
    )
    drain_s: float = Field(
        86_400.0,
        gt=0,
        description="Downtime of a pre-emptive drain (GPU swap or repair; assumption, the simulator's "
        "swap_h).",
    )
    drain_precision: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The most a pre-emptive drain trusts a telemetry risk: drain_pays weighs the averted "
        "loss at min(risk, drain_precision). A precursor signature (ECC, row remapping, link errors) also "
        "shows on GPUs that do not fail, as often as on those that do by the simulator's default "
        "(--false-alarm-ratio 1, an assumption), and the additive risk model reads several signals of one "
        "episode as independent evidence (p ~0.99 on benign episodes, simulated): a drain is paid for by "
        "what it averts at the precision such evidence can have. Fatal evidence (XIDs) does not go this way: "
        "it quarantines at once.",
    )
    withhold_cap_fraction: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Capacity breaker: FleetYield never withholds a class feature from more than this share "
        "of the in-service GPUs that could serve the class while the class has pending work; past it the "
        "lowest-loss nodes keep the feature, and the breaker is reported (log, metric, status).",
    )

    @field_validator("classes")
    @classmethod
    def _known(cls, v: dict[str, ClassStake]) -> dict[str, ClassStake]:
        _workload_classes(tuple(v), "stake.classes")
        return v


class PremiumParams(BaseModel):
    """Premium widening (core/premium.py): lend fy_ok_decode to idle premium nodes while decode is stuck,
    except the nodes pending premium-needing work can start on now and a reserve. The reservation is a shadow
    price (weights), not a wall."""

    model_config = _FROZEN

    reserve: bool = Field(
        False,
        description="Keep decode off premium nodes (fy_ok_decode on a premium node only when lent by premium "
        "widening). Off by default: in net goodput a reservation can only move work between GPUs, never add "
        "any, and simulated it cost goodput wherever premium-needing work did not fill the premium GPUs "
        "(openb 32x30 at 1 interruption per 1,000 node-days: -0.22% with it, +0.01% without, "
        "docs/results.md 'Stake'). Where premium work must come first, Slurm's own preemption says so "
        "(QOS with PreemptMode=REQUEUE: contrib/slurm-docker-cluster/slurm.conf). true: the reservation, "
        "lent by premium widening (enabled).",
    )
    enabled: bool = Field(
        True,
        description="With reserve: lend fy_ok_decode to idle premium nodes when pending decode fits no "
        "non-premium node, "
        "except nodes that pending premium-needing jobs (settle.premium_needing_classes) can start on now "
        "and a reserve. Off: the old wall (decode never on premium GPUs), which on a decode-heavy fleet "
        "leaves premium GPUs idle while decode queues (simulated: -13% net goodput vs Slurm on the openb "
        "workload, docs/results.md).",
    )
    batch: bool = Field(
        False,
        description="Treat batch like decode on premium nodes: green premium nodes carry fy_ok_batch only "
        "when lent (batch or decode waiting for lend_after_s that fits no other node, outside the claims "
        "and the reserve), instead of always. Batch that starts on an idle H100 before premium work "
        "arrives holds it when a gang comes (live A/B at 7519a79: 80% of FleetYield's premium misuse). Off "
        "by default: simulated, it cut premium misuse (openb 32x30: 28,821 -> 24,155 GPU-h) but lost net "
        "goodput and made every class wait longer, pretrain included (openb -0.15% -> -4.31% vs Slurm; "
        "high-fault fleet +1.20% -> +0.43%; docs/results.md).",
    )
    reserve_nodes: int = Field(
        1,
        ge=0,
        description="Never lend the last this-many eligible premium nodes. Lent decode is not preempted when "
        "premium work arrives (Slurm preemption is out of scope), so the reserve is what a newly submitted "
        "premium job can start on at once.",
    )
    reserve_fraction: float = Field(
        0.10,
        ge=0,
        lt=1,
        description="... nor this fraction of them (rounded up); the larger of the two applies. 10%: one "
        "node in ten stays unlent, enough for a typical finetune without waiting for decode to drain.",
    )
    gang_memory_s: float = Field(
        7 * 86_400.0,
        gt=0,
        description="The reserve also covers the largest premium-needing job (in nodes) seen running or "
        "pending within this window: lent decode is not preempted, so a gang must find its nodes unlent. "
        "A week: longer than the gap between gangs of a training program, short enough to forget a one-off.",
    )
    gang_reserve_max_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="The gang term of the reserve covers at most this fraction of the eligible premium nodes "
        "(rounded down). A gang up to half the premium fleet finds its nodes unlent; a larger one finds half "
        "and waits for lent decode on the rest. 1: a gang as large as the premium fleet reserves all of it, "
        "which is the old wall (nothing is ever lent: simulated openb 16 nodes, +1.2% instead of +3.5% net "
        "goodput vs Slurm on tuning seeds 100-109); 0: no gang term (gangs rely on weights and backfill).",
    )
    lend_after_s: float = Field(
        300.0,
        ge=0,
        description="Decode must have been waiting (not fitting any fy_ok_decode node) for this long, across "
        "consecutive ticks, before a premium node is lent: a burst that the next scheduling passes absorb "
        "never touches premium GPUs. Five minutes: many Slurm scheduling passes, short against decode "
        "service lifetimes.",
    )
    hysteresis_s: float = Field(
        1800.0,
        ge=0,
        description="A lent node is returned only after decode has not been waiting for this long (premium "
        "demand withdraws at once). Half an hour: features do not flap with a queue that drains and "
        "refills between ticks.",
    )
    keep_decode_open: bool = Field(
        True,
        description="When no in-service non-premium node can carry fy_ok_decode (none exists, as on an "
        "all-H100 fleet, or all are yellow/red/drained), lend it to one unclaimed premium node outside the "
        'reserve. Slurm rejects at submission a job whose constraint no node has ("Requested node '
        'configuration is not available"): decode submitted through job_submit.lua would be refused, never '
        "pend, and so never trigger lending (live A/B seed 3: four decode jobs refused).",
    )
    claim_grace_s: float = Field(
        300.0,
        ge=0,
        description="A pending premium-needing job that fits the idle premium GPUs claims them (they are not "
        "lent) for this long; if Slurm has not started it by then it is waiting behind higher-priority work "
        "(or a limit FleetYield does not see), so its claim lapses and the GPUs may be lent instead of "
        "idling. Five minutes: many scheduling and backfill passes.",
    )


class GangParams(BaseModel):
    """Gang widening (core/gangs.py): lend fy_ok_train to yellow nodes while a training job waits for more
    green nodes than are idle."""

    model_config = _FROZEN

    enabled: bool = Field(
        True,
        description="When a pending job of a gangs.classes class needs more whole nodes than there are idle "
        "green trainable nodes (premium ones for a premium-needing class), lend fy_ok_train to that many "
        "yellow nodes (lowest risk first; never red, lemons or nodes in rehabilitation). Off: fy_ok_train on "
        "green nodes only, which in a fleet with many repaired (yellow) nodes keeps gangs waiting for days "
        "(simulated high-fault fleet: -10.5% net goodput vs Slurm off, docs/results.md).",
    )
    classes: Annotated[tuple[str, ...], _LAX] = Field(
        ("pretrain",),
        description="Workload classes whose jobs need fy_ok_train (job_submit.lua: pretrain) and may borrow "
        "yellow nodes.",
    )
    unclassified: bool = Field(
        True,
        description="Count pending jobs without a workload class too: job_submit.lua gives them class "
        "default and fy_ok_train, like pretrain. Their pool is every node (no class is premium-needing).",
    )
    lend_degrading: bool = Field(
        True,
        description="Lend yellow nodes that are degrading now too: a counter grew within the trend "
        "windows (ECC errors, remapped rows, NVLink/PCIe errors, throttling, risk-only XIDs: the precursor "
        "some fatal faults give). false: only yellow nodes without such growth (repaired ones, yellow "
        "through their fatal history, or a stable level) are lent to a training gang. Simulated, false "
        "gains nothing (high-fault fleet +0.09 points) and loses 1-5 points where repaired GPUs fail again "
        "(Titan worlds; docs/results.md, 'Degrading nodes'), so the default lends.",
    )

    @field_validator("classes")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _workload_classes(v, "gangs.classes")


class KeepOpenParams(BaseModel):
    """Keep open (core/keep_open.py): no class feature job_submit.lua adds is left on no node."""

    model_config = _FROZEN

    enabled: bool = Field(
        True,
        description="When no node carries fy_ok_train, fy_ok_finetune or fy_ok_decode after routing (every "
        "green node that could is gone), one in-service yellow node with the envelope the feature needs "
        "carries it too (largest GPU count, then the node kept last tick, then the lowest risk). Slurm "
        "refuses at submission a job whose constraint no node has, so the class's jobs would be refused, "
        "never pend, and never trigger gang or premium widening. Off: such jobs are refused.",
    )


class ReclaimParams(BaseModel):
    """Premium reclaim (core/reclaim.py): batch requeued off premium GPUs a pending premium job needs."""

    model_config = _FROZEN

    enabled: bool = Field(
        False,
        description="Off by default: in net goodput a requeue for premium work only loses the requeued "
        "jobs' progress (simulated openb 32x30: ~49 GPU-h wasted per run, no less premium misuse); Slurm's "
        "own preemption (QOS PreemptMode=REQUEUE) is the shipped way to put premium work first. On: "
        "requeue checkpointable batch jobs (Slurm Requeue flag set, one node) off eligible "
        "premium nodes when a pending premium-needing job fits no idle premium GPUs but would once they "
        "leave, and keep fy_ok_batch (and any decode loan) off those nodes until that job is no longer "
        "pending. Batch that started on an idle H100 before premium work arrived otherwise holds it for "
        "its whole run (live A/B at 7519a79: 80% of FleetYield's premium misuse). Off: premium work waits "
        "for the batch to end.",
    )
    after_s: float = Field(
        600.0,
        ge=0,
        description="The premium job must have been pending, fitting no idle premium GPUs yet fitting with "
        "the batch gone, for this long (ticks in between) before anything is requeued: a queue that "
        "resolves itself (batch ending, another node freeing) costs no requeue.",
    )
    max_jobs_per_tick: int = Field(
        4, ge=1, description="At most this many batch jobs requeued per tick, fleet-wide (a storm cap)."
    )
    job_cooldown_s: float = Field(
        3600.0,
        ge=0,
        description="A batch job requeued by reclaim is not requeued by reclaim again for this long (no job "
        "is bounced from H100 to H100 while premium jobs keep arriving).",
    )
    queue_depth: int = Field(
        100,
        ge=1,
        description="Reclaim only for a premium job among the first this-many pending jobs (by job id): "
        "Slurm tests only the head of its queue per pass (default_queue_depth 100, bf_max_job_test), so "
        "GPUs freed for a job further back go to someone else. Set it to the site's bf_max_job_test.",
    )
    wall_s: float = Field(
        1800.0,
        gt=0,
        description="A reclaimed node keeps fy_ok_batch (and decode loans) off for at most this long, even "
        "if the premium job it was reclaimed for is still pending (something else holds it back).",
    )
    classes: Annotated[tuple[str, ...], _LAX] = Field(
        ("batch",),
        description="Workload classes that may be requeued (checkpointable by the site's convention; the job "
        "must also carry Slurm's Requeue flag).",
    )


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


def _workload_classes(v: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``v`` if every name is a ``WorkloadClass`` value, else a clear error naming ``where``."""
    from slurm_fleetyield.core.model import WorkloadClass

    known = {c.value for c in WorkloadClass}
    for c in v:
        if c not in known:
            raise ValueError(f"unknown workload class {c!r} in {where}; known: {sorted(known)}")
    return v


class Params(BaseModel):
    """All decision-core parameters, grouped per stage."""

    model_config = _FROZEN

    sense: SenseParams = Field(default_factory=SenseParams, description="Freshness and trend windows.")
    risk: RiskParams = Field(default_factory=RiskParams, description="Risk model and tier thresholds.")
    profile: ProfileParams = Field(default_factory=ProfileParams, description="Envelope features.")
    price: PriceParams = Field(default_factory=PriceParams, description="Node weights.")
    stake: StakeParams = Field(default_factory=StakeParams, description="Expected-loss class features.")
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
