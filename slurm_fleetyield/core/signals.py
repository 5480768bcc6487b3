"""Risk signals: the named, ordered units the risk model adds up.

Input: nothing at import (data only). Output: ``SIGNALS``, an ordered tuple of ``SignalSpec`` (name, what it
reads, its step table of log-odds contributions, rationale and source), and ``CHANNELS``, the cumulative
counters whose growth the sense stage tracks per GPU. ``core/risk.py`` compiles the enabled specs into fast
evaluators once per tick; nothing registers itself on import.

Why step tables: a contribution reads as "value 14/h >= 10/h -> +1.5 log-odds", which an operator can check
against the raw metric. The steps are deliberately coarse: no public study gives the fraction of fatal GPU
failures preceded by an observable precursor (shared/data/README.md), so the weights are priors to be tuned
by the learn stage, not fitted constants. What is calibrated is the base rate (core/params.py) and the
thresholds' order of magnitude, from the sources quoted per signal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# DCGM field names (dcgm-exporter spelling), so agent, dcgm-exporter and Prometheus paths read the same keys.
SBE_VOL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
ROWS_CORR = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
ROWS_UNCORR = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
RETIRED_PENDING = "DCGM_FI_DEV_RETIRED_PENDING"
NVLINK_CRC_FLIT = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
NVLINK_CRC_DATA = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
NVLINK_REPLAY = "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"
NVLINK_RECOVERY = "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
THERMAL_VIOLATION = "DCGM_FI_DEV_THERMAL_VIOLATION"  # cumulative nanoseconds throttled
POWER_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION"  # cumulative nanoseconds throttled
THROTTLE_REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"  # bitmask (newer DCGM: CLOCKS_EVENT_REASONS)
CLOCKS_EVENT_REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
SLOWDOWN_TEMP = "DCGM_FI_DEV_SLOWDOWN_TEMP"
RECOVERY_ACTION = "DCGM_FI_DEV_GPU_RECOVERY_ACTION"  # nvmlDeviceGpuRecoveryAction_t: 0 none, 1.. an action
FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"  # MiB (field 250); only the exported total counts, never free + used

COUNTER_CHANNELS: tuple[str, ...] = (
    SBE_VOL,
    ROWS_CORR,
    ROWS_UNCORR,
    NVLINK_CRC_FLIT,
    NVLINK_CRC_DATA,
    NVLINK_REPLAY,
    NVLINK_RECOVERY,
    PCIE_REPLAY,
    THERMAL_VIOLATION,
    POWER_VIOLATION,
)
"""Cumulative counters tracked per GPU (then one channel per XID of interest: ``channel_layout``)."""

NS_PER_HOUR = 3.6e12
"""The violation counters are in ns: NVML's violationTime and DCGM's field carry ns (dcgm-exporter's HELP
said "in us" until 4.4, the values never were), so a rate in ns/h over this is the fraction of time."""

# Throttle-reason bits that mean the hardware itself pulled the clocks down (nvml.h clocksEventReasons):
# HW_SLOWDOWN 0x8, HW_THERMAL_SLOWDOWN 0x40, HW_POWER_BRAKE_SLOWDOWN 0x80. SW power capping (0x4) is routine
# under load and is deliberately ignored.
HW_SLOWDOWN_BITS = (0x8, 0x40, 0x80)


def xid_channel(xid: int) -> str:
    """A risk-only XID's channel: its total, kept in the trend ring (the ``xid`` signal reads its growth over
    the longest window)."""
    return f"xid:{xid}"


FATAL_XID_PREFIX = "xid_new:"


def fatal_xid_channel(xid: int) -> str:
    """A quarantine XID's channel: its total, compared with the last sample only. A fatal XID acts on its
    first occurrence and no rule reads its window growth, so it stays out of the trend ring."""
    return f"{FATAL_XID_PREFIX}{xid}"


def channel_layout(risk_only_xids: Iterable[int], quarantine_xids: Iterable[int] = ()) -> tuple[str, ...]:
    """The channels of a GPU's counters as sense keeps them: first those kept in the trend ring (the
    counters, then the risk-only XIDs, sorted), then the quarantine XIDs (sorted), read as growth since the
    last sample only."""
    windowed = sorted(set(risk_only_xids))
    fatal = sorted(set(quarantine_xids) - set(windowed))
    return (
        COUNTER_CHANNELS
        + tuple(xid_channel(x) for x in windowed)
        + tuple(fatal_xid_channel(x) for x in fatal)
    )


def trended(layout: tuple[str, ...]) -> int:
    """How many leading channels of ``layout`` the trend ring keeps: all but the quarantine XIDs."""
    return next((i for i, c in enumerate(layout) if c.startswith(FATAL_XID_PREFIX)), len(layout))


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """One risk signal.

    ``kind`` says how its value is read:
    - ``level``: the current value of ``fields`` (summed);
    - ``state``: read as ``level``, but a condition rather than a counter: after a remediation it is new
      evidence whenever present (core/aftercare.py), not only when it grew;
    - ``rate``: per-hour growth of the ``fields`` counters, largest over the trend windows, times ``scale``;
    - ``growth``: growth of the ``fields`` counters over the longest window (a count);
    - ``xid``: growth of the risk-only XID channels over the longest window (a count);
    - ``margin``: slowdown temperature minus GPU temperature (degrees C, lower is worse);
    - ``hw_throttle``: how many hardware-slowdown throttle bits are set;
    - ``gpu_history`` / ``node_history``: past fatal events of this GPU / of this node's other GPUs.
    ``steps``: (threshold, log-odds) pairs; the contribution is the log-odds of the last threshold reached.
    """

    name: str
    kind: str
    fields: tuple[str, ...]
    steps: tuple[tuple[float, float], ...]
    unit: str
    rationale: str
    source: str
    lower_is_worse: bool = False
    scale: float = 1.0


SIGNALS: tuple[SignalSpec, ...] = (
    SignalSpec(
        "remap_failure",
        "level",
        (REMAP_FAILURE,),
        ((1.0, 7.0),),
        "flag",
        "The row remapper ran out of spare rows: further HBM faults cannot be contained. Alone it pushes "
        "the GPU past red (a drain proposal); XID 64 accompanies it and quarantines.",
        "NVIDIA GPU Memory Error Management (row remapping failure -> RMA); Xid catalog XID 64",
    ),
    SignalSpec(
        "recovery_action",
        "state",
        (RECOVERY_ACTION,),
        ((1.0, 7.0),),
        "action",
        "The driver asks for a recovery action (1 GPU reset, 2 node reboot, 3 drain peer-to-peer, 4 drain "
        "and reset, 6 bus reset, 7 system reboot): until it is done the GPU is not fit for work. It "
        "quarantines the node (quarantine.recovery_action_quarantines; the ladder starts with the action "
        "asked for); as risk it is red, so a remediation that left it set fails the canary. Drivers before "
        "R570 do not report it (absent: no contribution). XID 154 announces a change of it.",
        "NVIDIA Xid catalog XID 154 (GPU Recovery Action Changed: follow the recovery action); NVML "
        "nvmlDeviceGpuRecoveryAction_t; DCGM field DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    ),
    SignalSpec(
        "remap_pending",
        "level",
        (REMAP_PENDING,),
        ((1.0, 3.5),),
        "flag",
        "A row remap waits for a GPU reset; until then the faulty row stays mapped. Yellow on its own.",
        "NVIDIA GPU Memory Error Management (remapping pending -> reset the GPU)",
    ),
    SignalSpec(
        "uncorrectable_remapped_rows",
        "level",
        (ROWS_UNCORR,),
        ((1.0, 2.0), (4.0, 3.5), (8.0, 5.0)),
        "rows",
        "Each row remapped after an uncorrectable error is a past double-bit fault in HBM; HBM3 was 72 of "
        "419 Llama 3 interruptions.",
        "Llama 3 (arXiv 2407.21783) Table 5; NVIDIA GPU Memory Error Management",
    ),
    SignalSpec(
        "correctable_remapped_rows",
        "level",
        (ROWS_CORR,),
        ((1.0, 1.0), (11.0, 3.5)),
        "rows",
        "Nodes with >10 remapped rows regressed 83% of the time vs 5.6% with 1-10: the step at 11 is the "
        "SuperBench boundary.",
        "SuperBench (Microsoft, ATC '24)",
    ),
    SignalSpec(
        "remap_growth",
        "growth",
        (ROWS_CORR, ROWS_UNCORR),
        ((1.0, 1.5), (3.0, 2.5)),
        "rows/window",
        "Rows being remapped now: HBM is actively degrading, not carrying an old scar.",
        "NVIDIA GPU Memory Error Management; SuperBench (ATC '24)",
    ),
    SignalSpec(
        "retired_pages_pending",
        "level",
        (RETIRED_PENDING,),
        ((1.0, 3.0),),
        "flag",
        "Pre-Ampere page retirement waiting for a reset (the Volta-era twin of remap_pending).",
        "NVIDIA Dynamic Page Retirement documentation",
    ),
    SignalSpec(
        "sbe_rate",
        "rate",
        (SBE_VOL,),
        ((1.0, 0.5), (10.0, 1.5), (100.0, 3.0)),
        "errors/h",
        "Correctable ECC errors are absorbed, but a growing rate precedes row remaps and XID 92 (high "
        "single-bit ECC rate).",
        "NVIDIA Xid catalog XID 92; Titan GPU lifetimes (SC '20) for DBE as the dominant fatal class",
    ),
    SignalSpec(
        "nvlink_crc_rate",
        "rate",
        (NVLINK_CRC_FLIT, NVLINK_CRC_DATA),
        ((1.0, 0.3), (100.0, 1.0), (1000.0, 2.0)),
        "errors/h",
        "CRC errors are retried by the link layer; a sustained rate marks a marginal link (seating, cable, "
        "NVSwitch port) that precedes XID 74.",
        "NVIDIA Xid catalog XID 74; DCGM NVLink error fields",
    ),
    SignalSpec(
        "nvlink_replay_rate",
        "rate",
        (NVLINK_REPLAY, NVLINK_RECOVERY),
        ((1.0, 0.5), (10.0, 1.5), (100.0, 2.5)),
        "events/h",
        "Replays and link recoveries cost bandwidth and are the step before a link going down (XID 74).",
        "NVIDIA Xid catalog XID 74; DCGM NVLink error fields",
    ),
    SignalSpec(
        "pcie_replay_rate",
        "rate",
        (PCIE_REPLAY,),
        ((10.0, 0.5), (100.0, 1.5), (1000.0, 2.5)),
        "replays/h",
        "PCIe replays mean a noisy link to the host; the fatal form is the GPU falling off the bus (XID "
        "79, part of Llama 3's 148 'faulty GPU' interruptions).",
        "NVIDIA Xid catalog XID 79; Llama 3 (arXiv 2407.21783) Table 5",
    ),
    SignalSpec(
        "thermal_violation",
        "rate",
        (THERMAL_VIOLATION,),
        ((0.05, 0.5), (0.25, 1.0)),
        "fraction of time",
        "Time clocked down for thermal reasons: failing cooling (fan, cold plate, TIM) ages the board; "
        "Llama 3 lists thermal interruptions separately (6 of 419).",
        "DCGM_FI_DEV_THERMAL_VIOLATION; Llama 3 (arXiv 2407.21783) Table 5",
        scale=1.0 / NS_PER_HOUR,
    ),
    SignalSpec(
        "power_violation",
        "rate",
        (POWER_VIOLATION,),
        ((0.5, 0.2),),
        "fraction of time",
        "Power capping is routine under load, so only throttling most of the time counts, and weakly.",
        "DCGM_FI_DEV_POWER_VIOLATION",
        scale=1.0 / NS_PER_HOUR,
    ),
    SignalSpec(
        "hw_throttle",
        "hw_throttle",
        (THROTTLE_REASONS, CLOCKS_EVENT_REASONS),
        ((1.0, 1.0), (2.0, 1.5)),
        "bits",
        "Hardware slowdown, HW thermal slowdown or power-brake bits: the board protecting itself.",
        "NVML clocksEventReasons (nvml.h)",
    ),
    SignalSpec(
        "temp_margin",
        "margin",
        (GPU_TEMP, SLOWDOWN_TEMP),
        ((10.0, 0.3), (5.0, 0.8), (0.0, 1.5)),
        "degC to slowdown",
        "Running within a few degrees of the board's slowdown temperature.",
        "NVML temperature thresholds (DCGM_FI_DEV_SLOWDOWN_TEMP)",
        lower_is_worse=True,
    ),
    SignalSpec(
        "xid_nonfatal",
        "xid",
        (),
        ((1.0, 0.7), (3.0, 1.5), (10.0, 2.5)),
        "events/window",
        "Risk-only XIDs (13, 31, 43 usually the application; 63, 92, 94 contained memory events) that keep "
        "recurring across jobs point at the GPU, not the code.",
        "NVIDIA Xid catalog (RESTART_APP / contained ECC resolution buckets)",
    ),
    SignalSpec(
        "gpu_repeat_offender",
        "gpu_history",
        (),
        ((1.0, 2.5), (2.0, 3.5)),
        "past fatal events",
        "A GPU that failed before fails again far more often: Titan GPUs returned to service after a DBE/"
        "off-the-bus failure failed again x342 as often in their first week, x106 in days 7-30, x48 in "
        "days 30-90.",
        "Ostrouchov et al., GPU Lifetimes on Titan (SC '20)",
    ),
    SignalSpec(
        "node_repeat_offender",
        "node_history",
        (),
        ((1.0, 1.0), (3.0, 2.0)),
        "past fatal events",
        "Lemon nodes: ~1.2% of Meta RSC nodes; removing them cut 512+-GPU job failures from 14% to 4%. "
        "Added to every GPU of the node (the cause is often the board, not the GPU).",
        "Meta RSC (arXiv 2410.21680)",
    ),
)

SIGNALS_BY_NAME: dict[str, SignalSpec] = {s.name: s for s in SIGNALS}
SIGNAL_NAMES: tuple[str, ...] = tuple(s.name for s in SIGNALS)
