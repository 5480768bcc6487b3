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


def test_not_supported_fields_are_omitted() -> None:
    def unsupported(*_a: object) -> None:
        raise _NotSupported("Not Supported")

    fake = SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        NVML_AGGREGATE_ECC=1,
        NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS=0,
        NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR=1,
        NVML_PERF_POLICY_POWER=0,
        NVML_PERF_POLICY_THERMAL=1,
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
    v = NvmlBackend("n1", nvml=fake)._read(object())
    assert v is not None
    assert v["DCGM_FI_DEV_POWER_USAGE"] == 123.456
    assert v["DCGM_FI_DEV_FB_USED"] == 3
    assert v["DCGM_FI_DEV_POWER_VIOLATION"] == 5
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
