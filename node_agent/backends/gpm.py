"""dcgm-exporter's five default profiling fields from NVML's GPU Performance Monitoring (GPM) API.

Input: pynvml (or an injected stand-in) and the device handles. Output: per GPU, on each ``read(index, h)``,
``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``_PIPE_TENSOR_ACTIVE``, ``_DRAM_ACTIVE`` (ratios 0-1, as DCGM reports
them) and ``DCGM_FI_PROF_PCIE_TX_BYTES`` / ``_RX_BYTES`` (bytes per second) over the interval since the
previous read. GPM metrics are differences of two samples, so the first read of a GPU returns nothing and
every later one returns the interval since the last: Prometheus' scrape interval becomes the averaging
window (dcgm-exporter's is DCGM's sampling interval). A GPU whose ``nvmlGpmQueryDeviceSupport`` says no
(pre-Hopper, or a driver without GPM) never has these fields, as dcgm-exporter omits fields DCGM cannot
watch; a metric whose per-metric return code is an error is omitted for that read.

Why hand-written: pynvml exposes GPM as raw structures (sample alloc/get/free, a metrics-get struct); this
module is only the bookkeeping of one held sample per GPU and the unit conversions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)
MIB = 1 << 20

# (DCGM field, pynvml GPM metric constant, factor to DCGM's unit)
GPM_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),  # % -> ratio
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", float(MIB)),  # MiB/s -> B/s
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", float(MIB)),
)


class Gpm:
    def __init__(self, nv: Any) -> None:
        self.nv = nv
        self.supported: set[int] = set()
        self._held: dict[int, Any] = {}  # GPU index -> its previous GPM sample
        self._lock = threading.Lock()

    def probe(self, index: int, h: Any) -> bool:
        """Whether GPU ``index`` has GPM (remembered; a missing API or any NVML error counts as no)."""
        nv = self.nv
        try:
            ok = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        except (AttributeError, nv.NVMLError) as exc:
            log.debug("GPM not available on GPU %d: %s", index, exc)
            ok = False
        if ok:
            self.supported.add(index)
        return ok

    def read(self, index: int, h: Any) -> dict[str, float]:
        if index not in self.supported:
            return {}
        nv = self.nv
        with self._lock:
            try:
                sample = nv.nvmlGpmSampleGet(h, nv.nvmlGpmSampleAlloc())
            except nv.NVMLError as exc:
                log.debug("GPM sample of GPU %d failed: %s", index, exc)
                return {}
            prev = self._held.get(index)
            self._held[index] = sample
            if prev is None:
                return {}
            try:
                return self._metrics(prev, sample)
            finally:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(prev)

    def _metrics(self, prev: Any, cur: Any) -> dict[str, float]:
        nv = self.nv
        wanted = [(name, getattr(nv, const), k) for name, const, k in GPM_FIELDS if hasattr(nv, const)]
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(wanted)
        req.sample1 = prev
        req.sample2 = cur
        for i, (_, mid, _) in enumerate(wanted):
            req.metrics[i].metricId = mid
        try:
            got = nv.nvmlGpmMetricsGet(req)
        except nv.NVMLError as exc:
            log.debug("GPM metrics get failed: %s", exc)
            return {}
        out: dict[str, float] = {}
        for i, (name, _, factor) in enumerate(wanted):
            m = got.metrics[i]
            if m.nvmlReturn != nv.NVML_SUCCESS:
                continue
            value = m.value * factor
            out[name] = round(value, 6) if factor < 1 else int(value)
        return out

    def close(self) -> None:
        nv = self.nv
        with self._lock:
            for sample in self._held.values():
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(sample)
            self._held.clear()
