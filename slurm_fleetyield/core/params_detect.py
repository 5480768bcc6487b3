"""Parameters of the stages that detect: sense (freshness, trend windows), risk (model, thresholds, base rate
from Llama 3), profile (envelope features) and quarantine (which fatal events drain, and the safety caps).

core/params.py gathers them into ``Params``; every default states where it comes from.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Annotated

from pydantic import BaseModel, Field, field_validator, model_validator

from slurm_fleetyield.core.params_base import _FROZEN, _LAX
from slurm_fleetyield.core.signals import SIGNAL_NAMES, SIGNALS_BY_NAME

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
    recovery_action_quarantines: bool = Field(
        True,
        description="A fresh scrape in which the driver requests a recovery action for a GPU "
        "(DCGM_FI_DEV_GPU_RECOVERY_ACTION, NVML's nvmlDeviceGpuRecoveryAction_t, R570+ drivers) drains the "
        "node, as NVIDIA's Xid catalog says for XID 154; the ladder starts with what the driver asked for "
        "(lifecycle.ladders recovery_gpu_reset / recovery_node_reboot).",
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
