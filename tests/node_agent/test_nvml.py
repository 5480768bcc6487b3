from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from node_agent.backends import nvml as nvml_mod
from node_agent.backends.base import BackendError
from node_agent.backends.nvml import NvmlBackend


class _NVMLError(Exception):
    pass


class _NotSupported(_NVMLError):
    pass


_CONSTANTS: dict[str, object] = {  # the pynvml constants NvmlBackend._read uses
    "NVMLError": _NVMLError,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
    "NVML_PERF_POLICY_POWER": 0,
    "NVML_PERF_POLICY_THERMAL": 1,
}


def test_start_without_driver_gives_clear_error() -> None:
    b = NvmlBackend("n1")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pytest.skip("an NVIDIA driver is present")
    with pytest.raises(BackendError, match="no NVIDIA driver / libnvidia-ml found"):
        b.start()


def test_start_error_with_injected_nvml() -> None:
    def init() -> None:
        raise _NVMLError("Driver Not Loaded")

    fake = SimpleNamespace(NVMLError=_NVMLError, nvmlInit=init)
    with pytest.raises(BackendError, match="no NVIDIA driver / libnvidia-ml found: Driver Not Loaded"):
        NvmlBackend("n1", nvml=fake).start()


def test_start_labels_gpus_with_dcgms_pci_bus_id_form() -> None:
    """NVML's busId (8-digit domain) is what dcgm-exporter's pci_bus_id label carries; busIdLegacy is not."""
    handles = ["h0", "h1"]

    def fail(*_a: object) -> None:
        raise _NVMLError("Not Supported")

    fake = SimpleNamespace(
        NVMLError=_NVMLError,
        nvmlInit=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"580.159.04",
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(
            busId=f"00000000:{53 + handles.index(h)}:00.0".encode(),
            busIdLegacy=f"0000:{53 + handles.index(h)}:00.0".encode(),
        ),
        nvmlDeviceGetMinorNumber=lambda h: handles.index(h),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetVbiosVersion=fail,
        nvmlDeviceGetEccMode=fail,
        nvmlDeviceGetMigMode=fail,
        nvmlDeviceGetPersistenceMode=fail,
        nvmlEventSetCreate=fail,
    )
    b = NvmlBackend("n1", nvml=fake)
    b.start()
    assert [(i.index, i.pci_bus_id, i.device, i.uuid) for i in b.infos()] == [
        (0, "00000000:53:00.0", "nvidia0", "GPU-h0"),
        (1, "00000000:54:00.0", "nvidia1", "GPU-h1"),
    ]
    assert b.driver_version() == "580.159.04" and b._xid is None  # no event sets: no XID thread


def test_not_supported_fields_are_omitted() -> None:
    def unsupported(*_a: object) -> None:
        raise _NotSupported("Not Supported")

    fake = SimpleNamespace(
        **_CONSTANTS,
        nvmlDeviceGetTemperature=lambda h, t: 61,
        nvmlDeviceGetClockInfo=lambda h, c: 1980 if c == 1 else 2619,
        nvmlDeviceGetPowerUsage=lambda h: 123456,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 999,
        nvmlDeviceGetPcieReplayCounter=unsupported,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=50, memory=20),
        nvmlDeviceGetEncoderUtilization=unsupported,
        nvmlDeviceGetDecoderUtilization=unsupported,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(free=2 << 20, used=3 << 20, total=5 << 20),
        nvmlDeviceGetTotalEccErrors=unsupported,
        nvmlDeviceGetRetiredPages=unsupported,
        nvmlDeviceGetRetiredPagesPendingStatus=unsupported,
        nvmlDeviceGetRemappedRows=lambda h: (1, 0, 0, 0),
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 4,
        nvmlDeviceGetViolationStatus=lambda h, p: SimpleNamespace(violationTime=5000),
        nvmlDeviceGetFieldValues=unsupported,
    )
    b = NvmlBackend("n1", nvml=fake)
    v = b._read(object())
    assert v is not None
    assert "DCGM_FI_DEV_POWER_VIOLATION" not in v  # a slow counter: read by _read_slow
    b._read_slow(object(), v)
    assert v["DCGM_FI_DEV_POWER_USAGE"] == 123.456
    assert v["DCGM_FI_DEV_FB_USED"] == 3
    assert v["DCGM_FI_DEV_POWER_VIOLATION"] == 5000  # ns, as NVML reports it
    assert v["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 1
    for missing in (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_MEMORY_TEMP",
    ):
        assert missing not in v


def test_xid_events_are_recorded() -> None:
    b = NvmlBackend("n1")
    events = b.record_xid(None, 79, 10.0)
    assert events[0].fatal and events[0].xid == 79 and events[0].kind == "xid"


def test_reset_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod.shutil, "which", lambda _n: None)
    with pytest.raises(BackendError, match="nvidia-smi not found"):
        NvmlBackend("n1").reset_gpu(0, 1.0)


def test_reset_runs_nvidia_smi_gpu_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod.shutil, "which", lambda _n: "/usr/bin/nvidia-smi")
    calls = []

    def runner(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
        calls.append((cmd, kw["timeout"]))
        return subprocess.CompletedProcess(cmd, 1, "", "GPU 00000000:18:00.0 is in use by processes")

    with pytest.raises(BackendError, match=r"failed \(rc 1\): GPU 00000000:18:00\.0 is in use"):
        NvmlBackend("n1").reset_gpu(3, 1.0, runner=runner)
    assert calls == [(["/usr/bin/nvidia-smi", "--gpu-reset", "-i", "3"], nvml_mod.RESET_TIMEOUT_S)]


def _full_fake(energy: list[int]) -> SimpleNamespace:
    """Enough of pynvml for start() and sample() of one GPU; each energy read returns the next value."""

    def unsupported(*_a: object) -> None:
        raise _NotSupported("Not Supported")

    def read_energy(_h: object) -> int:
        energy.append(energy[-1] + 1000)
        return energy[-1]

    return SimpleNamespace(
        **_CONSTANTS,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:53:00.0"),
        nvmlDeviceGetMinorNumber=lambda h: 0,
        nvmlDeviceGetUUID=lambda h: "GPU-h0",
        nvmlDeviceGetName=lambda h: "NVIDIA H200",
        nvmlDeviceGetVbiosVersion=unsupported,
        nvmlDeviceGetEccMode=unsupported,
        nvmlDeviceGetMigMode=unsupported,
        nvmlDeviceGetPersistenceMode=unsupported,
        nvmlEventSetCreate=unsupported,
        nvmlDeviceGetTemperature=lambda h, t: 40,
        nvmlDeviceGetClockInfo=lambda h, c: 1980,
        nvmlDeviceGetPowerUsage=lambda h: 500000,
        nvmlDeviceGetTotalEnergyConsumption=read_energy,
        nvmlDeviceGetPcieReplayCounter=lambda h: 7,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=100, memory=30),
        nvmlDeviceGetEncoderUtilization=unsupported,
        nvmlDeviceGetDecoderUtilization=unsupported,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(free=1 << 30, used=1 << 30, total=2 << 30),
        nvmlDeviceGetTotalEccErrors=lambda h, e, c: 0,
        nvmlDeviceGetRetiredPages=unsupported,
        nvmlDeviceGetRetiredPagesPendingStatus=unsupported,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0,
        nvmlDeviceGetViolationStatus=lambda h, p: SimpleNamespace(violationTime=(p + 1) * 2_000_000),
        nvmlDeviceGetFieldValues=unsupported,
    )


def test_slow_counters_are_served_from_the_refresher() -> None:
    energy = [0]
    b = NvmlBackend("n1", nvml=_full_fake(energy), slow_interval_s=3600)
    b.start()
    try:
        assert energy == [0, 1000]  # start() read them once: the first scrape has them
        for _ in range(3):
            (s,) = b.sample(1.0)
            assert s.values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 1000
        assert len(energy) == 2  # scrapes did not read the slow counters again
        assert s.values["DCGM_FI_DEV_POWER_VIOLATION"] == 2_000_000  # ns, unchanged
        assert s.values["DCGM_FI_DEV_THERMAL_VIOLATION"] == 4_000_000
        assert s.values["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 7 and s.values["DCGM_FI_DEV_GPU_UTIL"] == 100
        b.refresh_slow()  # what the thread does every interval
        assert b.sample(2.0)[0].values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 2000
        assert b._slow_thread is not None and b._slow_thread.is_alive()
    finally:
        b.stop()
    assert b._slow_thread is not None and not b._slow_thread.is_alive()


def test_interval_zero_reads_every_counter_on_every_sample() -> None:
    energy = [0]
    b = NvmlBackend("n1", nvml=_full_fake(energy), slow_interval_s=0)
    b.start()
    values = [b.sample(float(t))[0].values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] for t in range(3)]
    assert values == [1000, 2000, 3000] and b._slow_thread is None
    b.stop()


def _gpm_fake(
    supported: bool, values: dict[int, float], fail: frozenset[int] = frozenset()
) -> SimpleNamespace:
    """pynvml's GPM calls over its real structures (c_nvmlGpmMetricsGet_t); samples are counters."""
    import pynvml

    taken: list[int] = []
    freed: list[int] = []

    def metrics_get(req: object) -> object:
        assert req.version == pynvml.NVML_GPM_METRICS_GET_VERSION  # type: ignore[attr-defined]
        for i in range(req.numMetrics):  # type: ignore[attr-defined]
            m = req.metrics[i]  # type: ignore[attr-defined]
            m.nvmlReturn = 3 if m.metricId in fail else 0
            m.value = values.get(m.metricId, 0.0)
        return req

    def sample_get(h: object, sample: int) -> int:
        taken.append(sample)
        return sample

    return SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_SUCCESS=0,
        c_nvmlGpmMetricsGet_t=pynvml.c_nvmlGpmMetricsGet_t,
        NVML_GPM_METRICS_GET_VERSION=pynvml.NVML_GPM_METRICS_GET_VERSION,
        **{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith("NVML_GPM_METRIC_")},
        nvmlGpmQueryDeviceSupport=lambda h: SimpleNamespace(isSupportedDevice=int(supported)),
        nvmlGpmSampleAlloc=lambda: None,
        nvmlGpmSampleGet=sample_get,
        nvmlGpmSampleFree=freed.append,
        nvmlGpmMetricsGet=metrics_get,
        taken=taken,
        freed=freed,
    )


def test_gpm_gives_the_five_profiling_fields_in_dcgm_units() -> None:
    import ctypes

    import pynvml

    from node_agent.backends.gpm import Gpm

    values = {
        pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 87.5,
        pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 40.0,
        pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 25.0,
        pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0,  # MiB/s
        pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 2.5,
    }
    nv = _gpm_fake(True, values)
    gpm = Gpm(nv)
    assert gpm.probe(0, "h0")
    sample = ctypes.cast(ctypes.c_void_p(1), pynvml.c_nvmlGpmSample_t)
    nv.nvmlGpmSampleAlloc = lambda: sample
    assert gpm.read(0, "h0") == {}  # one sample: no interval yet
    got = gpm.read(0, "h0")
    assert got == {
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.875,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.4,
        "DCGM_FI_PROF_DRAM_ACTIVE": 0.25,
        "DCGM_FI_PROF_PCIE_TX_BYTES": 100 * 1048576,
        "DCGM_FI_PROF_PCIE_RX_BYTES": int(2.5 * 1048576),
    }
    assert len(nv.taken) == 2 and len(nv.freed) == 1  # the older sample is freed, the newer held
    gpm.close()
    assert len(nv.freed) == 2


def test_gpm_absent_where_unsupported_or_failing() -> None:
    import ctypes

    import pynvml

    from node_agent.backends.gpm import Gpm

    nv = _gpm_fake(False, {})
    gpm = Gpm(nv)
    assert not gpm.probe(0, "h0") and gpm.read(0, "h0") == {} and gpm.read(0, "h0") == {}
    assert nv.taken == []  # an unsupported GPU is never sampled
    assert not Gpm(SimpleNamespace(NVMLError=_NVMLError)).probe(0, "h0")  # pynvml without GPM
    tensor = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    nv = _gpm_fake(True, {pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 50.0}, fail=frozenset({tensor}))
    nv.nvmlGpmSampleAlloc = lambda: ctypes.cast(ctypes.c_void_p(1), pynvml.c_nvmlGpmSample_t)
    gpm = Gpm(nv)
    gpm.probe(0, "h0")
    gpm.read(0, "h0")
    got = gpm.read(0, "h0")
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" not in got and got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.5


def test_clocks_event_reasons_and_fb_reserved_names() -> None:
    """dcgm-exporter main's field name for the bitmask; NVML v2 memory info gives the reserved framebuffer."""

    def unsupported(*_a: object) -> None:
        raise _NotSupported("Not Supported")

    def memory(h: object, version: int | None = None) -> SimpleNamespace:
        assert version == 0x02000028
        return SimpleNamespace(free=2 << 20, used=3 << 20, reserved=1 << 20, total=6 << 20)

    fake = SimpleNamespace(
        **_CONSTANTS,
        nvmlMemory_v2=0x02000028,
        nvmlDeviceGetTemperature=lambda h, t: 61,
        nvmlDeviceGetClockInfo=unsupported,
        nvmlDeviceGetPowerUsage=unsupported,
        nvmlDeviceGetUtilizationRates=unsupported,
        nvmlDeviceGetEncoderUtilization=unsupported,
        nvmlDeviceGetDecoderUtilization=unsupported,
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetTotalEccErrors=unsupported,
        nvmlDeviceGetRetiredPages=unsupported,
        nvmlDeviceGetRetiredPagesPendingStatus=unsupported,
        nvmlDeviceGetRemappedRows=unsupported,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x48,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0xFFFF,  # the deprecated name: not used
        nvmlDeviceGetFieldValues=unsupported,
    )
    v = NvmlBackend("n1", nvml=fake)._read(object())
    assert v is not None
    assert v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x48 and "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in v
    assert (v["DCGM_FI_DEV_FB_RESERVED"], v["DCGM_FI_DEV_FB_USED"], v["DCGM_FI_DEV_FB_TOTAL"]) == (1, 3, 6)


def test_sample_carries_gpm_fields_from_the_second_scrape_on() -> None:
    """Through NvmlBackend: probed at start, absent on the first scrape (no interval yet), then present."""
    import ctypes

    import pynvml

    nv = _full_fake([0])
    gpm = _gpm_fake(True, {pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 99.0})
    for k, v in vars(gpm).items():
        setattr(nv, k, v)
    nv.nvmlGpmSampleAlloc = lambda: ctypes.cast(ctypes.c_void_p(1), pynvml.c_nvmlGpmSample_t)
    b = NvmlBackend("n1", nvml=nv, slow_interval_s=0)
    b.start()
    try:
        first = b.sample(1.0)[0].values
        second = b.sample(2.0)[0].values
    finally:
        b.stop()
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in first
    assert second["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.99
    assert len(gpm.freed) == 2  # the held sample is freed at stop
