"""Real GPUs through NVML (``pynvml`` from nvidia-ml-py), mapped to DCGM field names and units.

Input: the NVIDIA driver's libnvidia-ml (loaded at ``start()``, not at import). Output:
``GpuSample``s per scrape: temperature (C), power (W), energy (mJ), clocks (MHz),
utilisation (%), framebuffer (MiB), ECC SBE/DBE volatile+aggregate, retired pages,
row-remap counters, NVLink CRC flit/data, replay and recovery totals, PCIe replays,
clock event reasons (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``), power/thermal violation time (ns, as NVML and
DCGM report it), reserved framebuffer (NVML's v2 memory info), and the five default profiling fields from
the GPM API where the GPU has it (``node_agent.backends.gpm``; absent otherwise). A field NVML reports as
NotSupported (or any per-field NVML error) is omitted for that GPU, as dcgm-exporter
omits blank values. XIDs arrive through an NVML event set (``nvmlEventTypeXidCriticalError``)
waited on in a supervised thread (``node_agent.supervise``: restarted with backoff after any exception, the
events it failed to deliver delivered first); each becomes an ``AgentEvent`` passed to the event callback.
VBIOS, ECC/MIG/persistence modes and driver version are read once at start (``static``).

Slow counters. Measured on an H200 (driver 580.159.04, bench/bench_nvml_calls.py): one ``sample()`` of
one GPU took 5.7 ms, 5.3 of them in four reads: total energy (3.9-4.5 ms), the power and thermal
violation times (0.6-0.9 ms each) and the PCIe replay counter (0.15-0.35 ms); the field-value API reads
them no faster. With ``slow_interval_s`` > 0 (the agent's default: 10 s) a background thread refreshes
these four counters every ``slow_interval_s`` and ``sample()`` serves the last values with the live
ones (dcgm-exporter itself serves what DCGM sampled at its collect interval, 30 s by default). The
controller turns these counters into rates over minutes, so a value up to 10 s old moves a rate by a
few percent at most. ``slow_interval_s`` = 0 reads everything on every ``sample()``.

Stale loops. The refresher and the XID thread call NVML outside the agent's guard; each records a
``Heartbeat`` (``node_agent.supervise``, on the injectable ``monotonic`` clock) when it finishes a round:
the refresher after each full refresh (stale after 3 x ``slow_interval_s``), the XID thread after each
return of its 1 s event wait and the delivery of what it brought (a round: that wait plus the agent lock,
which a scrape holds at most ``CALL_TIMEOUT_S``; stale after 3 x 6 s). A stale loop fails the scrape (503:
the controller reads the node UNKNOWN) and /healthz says which; ``heartbeats()`` lists them.

GPU reset: ``nvmlDeviceResetGpuLockedClocks`` only unlocks clocks and is NOT a reset. A
real reset needs ``nvidia-smi --gpu-reset -i N`` (root, no processes on the GPU, and on
NVLink systems often all GPUs of the baseboard); ``reset_gpu`` runs exactly that with a
timeout and reports a clear error when nvidia-smi is absent or fails.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

from node_agent.backends.base import Backend, BackendError, GpuInfo, GpuSample
from node_agent.backends.gpm import Gpm
from node_agent.protocol import AgentEvent
from node_agent.supervise import CALL_TIMEOUT_S, Heartbeat, Supervised
from node_agent.xid_catalog import fatal_xids, xid_text

log = logging.getLogger(__name__)
RESET_TIMEOUT_S = 120
XID_LOG_MAX = 1000
XID_WAIT_MS = 1000
XID_ROUND_S = XID_WAIT_MS / 1000 + CALL_TIMEOUT_S
"""The XID thread's longest healthy round: one event wait, then delivery behind a bounded scrape's lock."""


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend(Backend):
    name = "nvml"

    def __init__(
        self,
        node: str,
        clock: Callable[[], float] = time.time,
        nvml: Any = None,
        slow_interval_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.node = node
        self.clock = clock
        self._nvml = nvml  # injectable for tests; pynvml imported lazily otherwise
        self.slow_interval_s = slow_interval_s
        self.monotonic = monotonic  # the loops' heartbeats (injectable for tests)
        self._slow_beat: Heartbeat | None = None
        self._xid_beat: Heartbeat | None = None
        self._slow: dict[int, dict[str, float]] = {}  # GPU index -> last slow counters (refresher thread)
        self._slow_lock = threading.Lock()
        self._slow_thread: threading.Thread | None = None
        self._handles: list[Any] = []
        self._infos: list[GpuInfo] = []
        self._driver = ""
        self.static: dict[int, dict[str, str]] = {}
        self._xid_lock = threading.Lock()
        self._xid_log: dict[int, list[tuple[float, int]]] = {}
        self._xid_totals: dict[int, dict[int, int]] = {}
        self._last_xid: dict[int, int] = {}
        self._stop = threading.Event()
        self._xid: Supervised | None = None
        self._undelivered: list[AgentEvent] = []  # events the callback failed on: delivered first on restart
        self._event_set: Any = None
        self._gpm: Gpm | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - dependency is declared
                raise BackendError(f"nvidia-ml-py is not installed: {exc}") from None
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise BackendError(
                f"no NVIDIA driver / libnvidia-ml found: {exc} "
                "(install the NVIDIA driver, or run with --backend fake)"
            ) from None
        try:
            self._driver = _s(nv.nvmlSystemGetDriverVersion())
            count = nv.nvmlDeviceGetCount()
            for i in range(count):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                self._handles.append(h)
                pci = nv.nvmlDeviceGetPciInfo(h)
                # busId is DCGM's and nvidia-smi's form (00000000:53:00.0); busIdLegacy has a 4-digit domain
                bus = _s(pci.busId or getattr(pci, "busIdLegacy", b""))
                try:
                    minor = nv.nvmlDeviceGetMinorNumber(h)
                except nv.NVMLError:
                    minor = i
                self._infos.append(
                    GpuInfo(
                        i, _s(nv.nvmlDeviceGetUUID(h)), bus, f"nvidia{minor}", _s(nv.nvmlDeviceGetName(h))
                    )
                )
                self.static[i] = self._static(h)
            self._gpm = Gpm(nv)
            for i, h in enumerate(self._handles):
                self._gpm.probe(i, h)
        except nv.NVMLError as exc:
            raise BackendError(f"NVML failed while enumerating GPUs: {exc}") from None
        self._start_xid_thread()
        if self.slow_interval_s > 0:
            self.refresh_slow()  # the first scrape already has them
            self._slow_beat = Heartbeat(
                "fleetyield-nvml-slow",
                "energy, power/thermal violation and PCIe replay counters",
                self.slow_interval_s,
                self.monotonic,
            )
            self._slow_thread = threading.Thread(
                target=self._slow_loop, name="fleetyield-nvml-slow", daemon=True
            )
            self._slow_thread.start()

    def refresh_slow(self) -> None:
        """Read the slow counters of every GPU now (the refresher thread calls this every interval)."""
        for info, h in zip(self._infos, self._handles, strict=True):
            values: dict[str, float] = {}
            self._read_slow(h, values)
            with self._slow_lock:
                self._slow[info.index] = values

    def _slow_loop(self) -> None:
        while not self._stop.wait(self.slow_interval_s):
            try:
                self.refresh_slow()
            except Exception:  # never let the refresher die silently; the next pass tries again
                log.exception("refreshing the slow NVML counters failed")  # no beat: stale if it persists
            else:
                assert self._slow_beat is not None
                self._slow_beat.beat()

    def _static(self, h: Any) -> dict[str, str]:
        nv = self._nvml
        out: dict[str, str] = {}
        for key, fn in (
            ("vbios", lambda: _s(nv.nvmlDeviceGetVbiosVersion(h))),
            ("ecc_mode", lambda: str(nv.nvmlDeviceGetEccMode(h)[0])),
            ("mig_mode", lambda: str(nv.nvmlDeviceGetMigMode(h)[0])),
            ("persistence_mode", lambda: str(nv.nvmlDeviceGetPersistenceMode(h))),
        ):
            with contextlib.suppress(nv.NVMLError):
                out[key] = fn()
        return out

    def _start_xid_thread(self) -> None:
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
            for h in self._handles:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._event_set)
                except nv.NVMLError as exc:
                    log.warning("cannot register XID events on a GPU: %s", exc)
        except nv.NVMLError as exc:
            log.warning("NVML event sets unavailable, XIDs will not be seen: %s", exc)
            return
        # supervised: an exception (the callback's EMFILE or ENOSPC writing fatal.json or the spool, or
        # anything NVML raises) restarts the loop with backoff; the events it was delivering go first
        self._xid_beat = Heartbeat("fleetyield-nvml-xid", "XID events", XID_ROUND_S, self.monotonic)
        self._xid = Supervised("fleetyield-nvml-xid", self._xid_loop, heartbeat=self._xid_beat)
        self._xid.start()

    def supervised(self) -> list[Supervised]:
        return [self._xid] if self._xid is not None else []

    def heartbeats(self) -> list[Heartbeat]:
        return [b for b in (self._slow_beat, self._xid_beat) if b is not None]

    def _deliver(self, events: list[AgentEvent]) -> None:
        """Hand events to the callback; on failure they stay undelivered and the exception propagates."""
        self._undelivered.extend(events)
        batch = list(self._undelivered)
        self._emit(batch)
        del self._undelivered[: len(batch)]

    def _xid_loop(self, stop: threading.Event) -> None:
        nv = self._nvml
        sup, beat = self._xid, self._xid_beat
        assert sup is not None and beat is not None  # set before the thread starts
        uuid_to_index = {info.uuid: info.index for info in self._infos}
        if self._undelivered:
            self._deliver([])
        while not (stop.is_set() or self._stop.is_set()):
            try:
                data = nv.nvmlEventSetWait(self._event_set, XID_WAIT_MS)
            except nv.NVMLError as exc:
                if not isinstance(exc, getattr(nv, "NVMLError_Timeout", ())):
                    raise
                data = None  # no event within the wait: a round all the same
            if data is not None and data.eventType == nv.nvmlEventTypeXidCriticalError:
                xid = int(data.eventData)
                try:
                    index = uuid_to_index.get(_s(nv.nvmlDeviceGetUUID(data.device)))
                except nv.NVMLError:
                    index = None
                self._deliver(self.record_xid(index, xid, self.clock()))
            sup.ok()
            beat.beat()

    def record_xid(self, index: int | None, xid: int, now: float) -> list[AgentEvent]:
        """Book an XID (from the event thread) and return the events to publish."""
        info = self._infos[index] if index is not None and index < len(self._infos) else None
        if index is not None:
            with self._xid_lock:
                log_ = self._xid_log.setdefault(index, [])
                log_.append((now, xid))
                del log_[:-XID_LOG_MAX]
                totals = self._xid_totals.setdefault(index, {})
                totals[xid] = totals.get(xid, 0) + 1
                self._last_xid[index] = xid
        return [
            AgentEvent(
                event_id=str(uuidlib.uuid4()),
                time=now,
                node=self.node,
                gpu=index,
                uuid=info.uuid if info else None,
                kind="xid",
                xid=xid,
                fatal=xid in fatal_xids(),
                message=f"XID {xid}: {xid_text(xid)}",
            )
        ]

    def stop(self) -> None:
        self._stop.set()
        if self._xid is not None:
            self._xid.stop()
        if self._slow_thread is not None:
            self._slow_thread.join(2)
        nv = self._nvml
        if self._gpm is not None:
            self._gpm.close()
        if nv is not None and self._handles:
            try:
                if self._event_set is not None:
                    nv.nvmlEventSetFree(self._event_set)
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass

    def infos(self) -> list[GpuInfo]:
        return list(self._infos)

    def driver_version(self) -> str:
        return self._driver

    def expected_gpus(self) -> int:
        return len(self._infos)

    # ------------------------------------------------------------ sampling
    def sample(self, now: float) -> list[GpuSample]:
        out = []
        for info, h in zip(self._infos, self._handles, strict=True):
            values = self._read(h)
            if values is None:  # GPU lost (fell off the bus): gone from the metrics, as in NVML
                continue
            if self.slow_interval_s > 0:
                with self._slow_lock:
                    values.update(self._slow.get(info.index, {}))
            else:
                self._read_slow(h, values)
            if self._gpm is not None:
                values.update(self._gpm.read(info.index, h))
            with self._xid_lock:
                values["DCGM_FI_DEV_XID_ERRORS"] = self._last_xid.get(info.index, 0)
                out.append(
                    GpuSample(
                        info,
                        values,
                        self._last_xid.get(info.index, 0),
                        list(self._xid_log.get(info.index, [])),
                        dict(self._xid_totals.get(info.index, {})),
                    )
                )
        return out

    def _read(self, h: Any) -> dict[str, float] | None:
        nv = self._nvml
        v: dict[str, float] = {}

        def put(name: str, fn: Callable[[], float]) -> None:
            # NotSupported or any per-field failure: omit, as dcgm-exporter does for blanks.
            with contextlib.suppress(nv.NVMLError):
                v[name] = fn()

        try:
            nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        except getattr(nv, "NVMLError_GpuIsLost", ()):  # type: ignore[misc]
            return None
        except nv.NVMLError:
            pass
        put("DCGM_FI_DEV_GPU_TEMP", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        put("DCGM_FI_DEV_SM_CLOCK", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        put("DCGM_FI_DEV_MEM_CLOCK", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        put("DCGM_FI_DEV_POWER_USAGE", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)  # mW -> W
        try:
            util = nv.nvmlDeviceGetUtilizationRates(h)
            v["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            v["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        except nv.NVMLError:
            pass
        put("DCGM_FI_DEV_ENC_UTIL", lambda: nv.nvmlDeviceGetEncoderUtilization(h)[0])
        put("DCGM_FI_DEV_DEC_UTIL", lambda: nv.nvmlDeviceGetDecoderUtilization(h)[0])
        try:
            mem = self._memory_info(h)
            v["DCGM_FI_DEV_FB_FREE"] = mem.free // (1024 * 1024)
            v["DCGM_FI_DEV_FB_USED"] = mem.used // (1024 * 1024)
            v["DCGM_FI_DEV_FB_TOTAL"] = mem.total // (1024 * 1024)
            if hasattr(mem, "reserved"):
                v["DCGM_FI_DEV_FB_RESERVED"] = mem.reserved // (1024 * 1024)
        except nv.NVMLError:
            pass
        for name, err, counter in (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
        ):
            put(name, lambda e=err, c=counter: nv.nvmlDeviceGetTotalEccErrors(h, e, c))
        put(
            "DCGM_FI_DEV_RETIRED_SBE",
            lambda: len(
                nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
            ),
        )
        put(
            "DCGM_FI_DEV_RETIRED_DBE",
            lambda: len(nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
        )
        put("DCGM_FI_DEV_RETIRED_PENDING", lambda: int(nv.nvmlDeviceGetRetiredPagesPendingStatus(h)))
        try:
            cor, unc, pending, failure = nv.nvmlDeviceGetRemappedRows(h)
            v["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = cor
            v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = unc
            v["DCGM_FI_DEV_ROW_REMAP_PENDING"] = int(bool(pending))
            v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = int(bool(failure))
        except nv.NVMLError:
            pass
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if reasons is None:  # pynvml before the rename (driver 535): the same bitmask
            reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        put("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", lambda: reasons(h))
        self._field_values(h, v)
        return v

    def _memory_info(self, h: Any) -> Any:
        """NVML's v2 memory info (it has ``reserved``) where pynvml and the driver have it, else v1."""
        nv = self._nvml
        if hasattr(nv, "nvmlMemory_v2"):
            with contextlib.suppress(nv.NVMLError):
                return nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        return nv.nvmlDeviceGetMemoryInfo(h)

    def _read_slow(self, h: Any, v: dict[str, float]) -> None:
        """The four counters that cost milliseconds per read (module docstring), added to ``v``."""
        nv = self._nvml
        for name, fn in (
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),  # mJ
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
            (  # ns, as NVML and DCGM report it (dcgm-exporter's HELP says "in ns" since 4.4)
                "DCGM_FI_DEV_POWER_VIOLATION",
                lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER).violationTime,
            ),
            (
                "DCGM_FI_DEV_THERMAL_VIOLATION",
                lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_THERMAL).violationTime,
            ),
        ):
            with contextlib.suppress(nv.NVMLError):
                v[name] = fn()

    def _field_values(self, h: Any, v: dict[str, float]) -> None:
        nv = self._nvml
        fields = (
            ("DCGM_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_MEMORY_TEMP"),
            (
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            ),
            (
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
                "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
            ),
            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
            (
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            ),
            # the driver's requested recovery (nvmlDeviceGpuRecoveryAction_t), R570+; NotSupported: omitted
            ("DCGM_FI_DEV_GPU_RECOVERY_ACTION", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),
        )
        wanted = [(name, getattr(nv, fid)) for name, fid in fields if hasattr(nv, fid)]
        try:
            values = nv.nvmlDeviceGetFieldValues(h, [fid for _, fid in wanted])
        except nv.NVMLError:
            return
        for (name, _), fv in zip(wanted, values, strict=False):
            if fv.nvmlReturn != nv.NVML_SUCCESS:
                continue  # NotSupported for this GPU (e.g. no NVLink): omitted
            vt = fv.valueType
            if vt == nv.NVML_VALUE_TYPE_DOUBLE:
                v[name] = fv.value.dVal
            elif vt == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
                v[name] = fv.value.uiVal
            elif vt == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
                v[name] = fv.value.ulVal
            elif vt == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
                v[name] = fv.value.sllVal
            else:
                v[name] = fv.value.ullVal

    # ------------------------------------------------------------ reset
    def reset_gpu(
        self, index: int, now: float, runner: Callable[..., Any] = subprocess.run
    ) -> list[AgentEvent]:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            raise BackendError(
                "cannot reset GPU: nvidia-smi not found on PATH (a real reset needs "
                "`nvidia-smi --gpu-reset -i N` as root with no processes on the GPU)"
            )
        try:
            proc = runner(
                [smi, "--gpu-reset", "-i", str(index)],
                capture_output=True,
                text=True,
                timeout=RESET_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"nvidia-smi --gpu-reset -i {index} timed out after {RESET_TIMEOUT_S}s"
            ) from None
        if proc.returncode != 0:
            detail = (proc.stdout + proc.stderr).strip().splitlines()
            raise BackendError(
                f"nvidia-smi --gpu-reset -i {index} failed (rc {proc.returncode}): "
                f"{detail[-1] if detail else 'no output'}"
            )
        with self._xid_lock:
            self._last_xid[index] = 0
        info = self._infos[index] if index < len(self._infos) else None
        return [
            AgentEvent(
                event_id=str(uuidlib.uuid4()),
                time=now,
                node=self.node,
                gpu=index,
                uuid=info.uuid if info else None,
                kind="gpu_reset",
                xid=None,
                fatal=False,
                message="GPU reset with nvidia-smi --gpu-reset",
            )
        ]
