"""prometheus-client Collector that renders backend samples with dcgm-exporter's names and labels.

Input: a ``Backend`` (read at scrape time), the node name, a clock and options (lowercase
``hostname`` label, HPC job-mapping dir, XID count window). Output: fresh metric families
on every ``collect()``: the DCGM_FI_* fields (HELP/TYPE text from dcgm-exporter's
etc/default-counters.csv as of 4.4+: violation times in ns, the clocks-event-reasons name, the five default
profiling fields; units as DCGM reports them), ``DCGM_EXP_XID_ERRORS_COUNT`` (a gauge, as that CSV types it),
``fleetyield_gpu_xid_errors_total`` and the ``fleetyield_agent_*`` gauges. A backend loop gone stale
(``node_agent.supervise.Heartbeat``) fails ``collect()`` with ``BackendStuck``: no stale counter is served as
fresh (the exporter answers 503, the controller reads the node UNKNOWN).

Label order (dcgm-exporter's GPU template): ``gpu, UUID, pci_bus_id, device, modelName,
Hostname`` then label fields (``DCGM_FI_DRIVER_VERSION``) then attributes in key order
(``err_code, err_msg`` on XID_ERRORS, ``window_size_in_ms, xid`` on the XID count, then
``hpc_job`` when a job mapping file names jobs for the GPU; one series per job).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from node_agent.backends.base import Backend, GpuSample
from node_agent.faults import xid_text
from node_agent.supervise import BackendStuck
from node_agent.version import __version__

# (field, prometheus type, help) -- help strings as dcgm-exporter's counters CSV writes them.
DCGM_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Throttling duration due to power constraints (in ns)."),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in ns)."),
    (
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
    ),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."),
    ("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
    ),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink data CRC errors."),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    (
        "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
        "gauge",
        "GPU recovery action the driver requests (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, "
        "4 drain and reset).",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    # Datacenter profiling (DCP) fields of the default list; a GPU without them (no GPM) omits them
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
    ),
)
XID_COUNT_NAME = "DCGM_EXP_XID_ERRORS_COUNT"
XID_COUNT_HELP = "Count of XID Errors within user-specified time window (see xid-count-window-size param)."
XID_TOTAL_NAME = "fleetyield_gpu_xid_errors"
DRIVER_LABEL = "DCGM_FI_DRIVER_VERSION"


def gpu_label_names(lowercase_hostname: bool) -> tuple[str, ...]:
    host = "hostname" if lowercase_hostname else "Hostname"
    return ("gpu", "UUID", "pci_bus_id", "device", "modelName", host, DRIVER_LABEL)


def read_job_mapping(directory: Path | None) -> dict[int, list[str]]:
    """dcgm-exporter's --hpc-job-mapping-dir: files named by GPU index, one job id a line."""
    if directory is None:
        return {}
    out: dict[int, list[str]] = {}
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return {}
    for entry in entries:
        if not entry.name.isdigit() or not entry.is_file():
            continue
        try:
            with open(entry.path, encoding="utf-8") as fh:
                jobs = [line.strip() for line in fh if line.strip()]
        except OSError:
            continue
        if jobs:
            out[int(entry.name)] = jobs
    return out


class GpuCollector(Collector):
    def __init__(
        self,
        backend: Backend,
        node: str,
        clock: Callable[[], float],
        lowercase_hostname: bool = False,
        job_mapping_dir: Path | None = None,
        xid_window_ms: int = 300000,
        call: Callable[..., Any] | None = None,
    ) -> None:
        self.call = call or (lambda fn, *args: fn(*args))  # the agent's Guard.call: bounded backend calls
        self.backend = backend
        self.node = node
        self.clock = clock
        self.label_names = gpu_label_names(lowercase_hostname)
        self.job_mapping_dir = job_mapping_dir
        self.xid_window_ms = xid_window_ms

    def describe(self) -> list[Metric]:
        return []  # families vary with the GPUs visible; nothing to pre-register

    def _base_labels(self, s: GpuSample, driver: str) -> dict[str, str]:
        i = s.info
        return dict(
            zip(
                self.label_names,
                (str(i.index), i.uuid, i.pci_bus_id, i.device, i.model_name, self.node, driver),
                strict=True,
            )
        )

    def collect(self) -> Iterator[Metric]:
        stale = [why for beat in self.backend.heartbeats() if (why := beat.stale())]
        if stale:
            raise BackendStuck("; ".join(stale))
        now = self.clock()
        samples = self.call(self.backend.sample, now)
        driver = self.call(self.backend.driver_version)
        expected_gpus = self.call(self.backend.expected_gpus)
        jobs = read_job_mapping(self.job_mapping_dir)
        base = {s.info.index: self._base_labels(s, driver) for s in samples}

        def add(
            metric: Metric, name: str, s: GpuSample, value: float, extra: dict[str, str] | None = None
        ) -> None:
            labels = dict(base[s.info.index])
            if extra:
                labels.update(extra)
            gpu_jobs = jobs.get(s.info.index)
            if gpu_jobs:
                for job in gpu_jobs:
                    metric.add_sample(name, {**labels, "hpc_job": job}, value)
            else:
                metric.add_sample(name, labels, value)

        for field, mtype, help_text in DCGM_FIELDS:
            metric = Metric(field, help_text, mtype)
            for s in samples:
                value = s.values.get(field)
                if value is None:
                    continue
                extra = None
                if field == "DCGM_FI_DEV_XID_ERRORS":
                    extra = {"err_code": str(int(value)), "err_msg": xid_text(int(value))}
                add(metric, field, s, value, extra)
            if metric.samples:
                yield metric

        window = Metric(XID_COUNT_NAME, XID_COUNT_HELP, "gauge")
        total = Metric(
            XID_TOTAL_NAME, "XID errors seen on this GPU since the agent state was created.", "counter"
        )
        since = now - self.xid_window_ms / 1000.0
        for s in samples:
            counts: dict[int, int] = {}
            for t, xid in s.xid_log:
                if t > since:
                    counts[xid] = counts.get(xid, 0) + 1
            win = {"window_size_in_ms": str(self.xid_window_ms)}
            if counts:
                for xid in sorted(counts):
                    add(window, XID_COUNT_NAME, s, counts[xid], {**win, "xid": str(xid)})
            else:
                add(window, XID_COUNT_NAME, s, 0, win)
            for xid in sorted(s.xid_totals):
                add(total, XID_TOTAL_NAME + "_total", s, s.xid_totals[xid], {"xid": str(xid)})
        if window.samples:
            yield window
        yield total

        expected = Metric("fleetyield_agent_gpus_expected", "GPUs this node should have.", "gauge")
        expected.add_sample("fleetyield_agent_gpus_expected", {}, expected_gpus)
        yield expected
        visible = Metric("fleetyield_agent_gpus_visible", "GPUs the backend sees now.", "gauge")
        visible.add_sample("fleetyield_agent_gpus_visible", {}, len(samples))
        yield visible
        info = Metric("fleetyield_agent_info", "FleetYield node agent build and backend.", "gauge")
        info.add_sample("fleetyield_agent_info", {"backend": self.backend.name, "version": __version__}, 1)
        yield info


class ThreadCollector(Collector):
    """``fleetyield_agent_thread_up`` and ``fleetyield_agent_thread_restarts_total`` per supervised thread
    of the backend (the NVML XID thread: ``node_agent.supervise.Supervised``), and
    ``fleetyield_agent_loop_round_age_seconds`` per backend loop (``Heartbeat``; served only while no loop
    is stale, as a stale one fails the scrape: an alert can watch it grow)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        up = Metric(
            "fleetyield_agent_thread_up",
            "1 while a supervised agent thread runs and is not failing.",
            "gauge",
        )
        restarts = Metric(
            "fleetyield_agent_thread_restarts",
            "Restarts of a supervised agent thread after an exception.",
            "counter",
        )
        for sup in self.backend.supervised():
            up.add_sample(up.name, {"thread": sup.name}, float(sup.up and not sup.failing))
            restarts.add_sample(restarts.name + "_total", {"thread": sup.name}, sup.restarts)
        age = Metric(
            "fleetyield_agent_loop_round_age_seconds",
            "Seconds since a backend loop last finished a round (stale past 3x its interval).",
            "gauge",
        )
        for beat in self.backend.heartbeats():
            age.add_sample(age.name, {"loop": beat.name}, beat.age())
        yield up
        yield restarts
        yield age
