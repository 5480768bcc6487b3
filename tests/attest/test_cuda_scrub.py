"""``cuda_scrub``: the driver-API calls and their order against an injected libcuda (what a GPU-less box can
check), and the real thing on a GPU machine (skipped without ``libcuda.so.1``)."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from node_agent.attest.cuda_scrub import MIB, ScrubError, load_libcuda, scrub


class FakeCuda:
    """libcuda's calls as ctypes passes them: pointers arrive as ``byref`` objects (``._obj``: the target)."""

    def __init__(self, free: int, total: int, max_alloc: int, dirty: bool = False, fail: str = "") -> None:
        self.free, self.total, self.max_alloc, self.dirty, self.fail = free, total, max_alloc, dirty, fail
        self.calls: list[str] = []
        self.live: dict[int, int] = {}
        self.zeroed: set[int] = set()
        self.next_ptr = 1 << 32

    def _rc(self, fn: str) -> int:
        self.calls.append(fn)
        return 700 if fn == self.fail else 0

    def cuGetErrorString(self, rc: int, out: object) -> int:
        out._obj.value = b"an illegal memory access was encountered"  # type: ignore[attr-defined]
        return 0

    def cuInit(self, _flags: object) -> int:
        return self._rc("cuInit")

    def cuDeviceGet(self, dev: object, ordinal: ctypes.c_int) -> int:
        dev._obj.value = ordinal.value  # type: ignore[attr-defined]
        return self._rc("cuDeviceGet")

    def cuDeviceGetByPCIBusId(self, dev: object, bus: ctypes.c_char_p) -> int:
        dev._obj.value = 0  # type: ignore[attr-defined]
        return self._rc("cuDeviceGetByPCIBusId")

    def cuDeviceGetName(self, buf: ctypes.Array, n: object, dev: object) -> int:
        buf.value = b"NVIDIA H200"
        return self._rc("cuDeviceGetName")

    def cuDevicePrimaryCtxRetain(self, ctx: object, dev: object) -> int:
        ctx._obj.value = 1234  # type: ignore[attr-defined]
        return self._rc("cuDevicePrimaryCtxRetain")

    def cuCtxSetCurrent(self, ctx: object) -> int:
        return self._rc("cuCtxSetCurrent")

    def cuMemGetInfo_v2(self, free: object, total: object) -> int:
        free._obj.value, total._obj.value = self.free, self.total  # type: ignore[attr-defined]
        return self._rc("cuMemGetInfo_v2")

    def cuMemAlloc_v2(self, ptr: object, size: ctypes.c_size_t) -> int:
        self.calls.append("cuMemAlloc_v2")
        if size.value > self.max_alloc:
            return 2  # CUDA_ERROR_OUT_OF_MEMORY
        ptr._obj.value = self.next_ptr  # type: ignore[attr-defined]
        self.live[self.next_ptr] = size.value
        self.next_ptr += size.value
        return 0

    def cuMemsetD8_v2(self, ptr: ctypes.c_uint64, value: ctypes.c_ubyte, size: ctypes.c_size_t) -> int:
        assert value.value == 0 and self.live[ptr.value] == size.value
        self.zeroed.add(ptr.value)
        return self._rc("cuMemsetD8_v2")

    def cuCtxSynchronize(self) -> int:
        return self._rc("cuCtxSynchronize")

    def cuMemcpyDtoH_v2(self, buf: ctypes.Array, src: ctypes.c_uint64, n: ctypes.c_size_t) -> int:
        base = max(p for p in self.live if p <= src.value)
        fill = 0 if base in self.zeroed and not self.dirty else 0xAB
        ctypes.memset(buf, fill, n.value)
        return self._rc("cuMemcpyDtoH_v2")

    def cuMemFree_v2(self, ptr: ctypes.c_uint64) -> int:
        del self.live[ptr.value]
        return self._rc("cuMemFree_v2")

    def cuDevicePrimaryCtxRelease_v2(self, dev: object) -> int:
        return self._rc("cuDevicePrimaryCtxRelease_v2")


def test_zeroes_all_free_memory_less_the_reserve_and_frees_it() -> None:
    lib = FakeCuda(free=10 * 1024 * MIB, total=12 * 1024 * MIB, max_alloc=1 << 62)
    r = scrub(ordinal=0, reserve_mib=512, chunk_mib=1024, lib=lib)
    assert r.scrubbed_bytes == 10 * 1024 * MIB - 512 * MIB
    assert r.chunks == 10 and r.name == "NVIDIA H200" and r.device == "cuda:0"
    assert r.probes == 30 and r.probes_zero == 30 and r.ok
    assert lib.live == {} and lib.calls[-1] == "cuDevicePrimaryCtxRelease_v2"
    last_memset = max(i for i, c in enumerate(lib.calls) if c == "cuMemsetD8_v2")
    assert lib.calls.index("cuCtxSynchronize") > last_memset


def test_a_chunk_that_does_not_fit_is_halved() -> None:
    lib = FakeCuda(free=3 * 1024 * MIB, total=4 * 1024 * MIB, max_alloc=300 * MIB)
    r = scrub(pci_bus_id="00000000:18:00.0", reserve_mib=0, chunk_mib=1024, lib=lib)
    assert r.scrubbed_bytes == 3 * 1024 * MIB and r.device == "00000000:18:00.0"
    assert r.chunks == 3 * 1024 // 256 and r.ok


def test_a_sample_that_is_not_zero_fails_the_scrub() -> None:
    r = scrub(reserve_mib=0, chunk_mib=64, lib=FakeCuda(128 * MIB, 256 * MIB, 1 << 62, dirty=True))
    assert r.probes == 6 and r.probes_zero == 0 and not r.ok


def test_nothing_free_is_not_ok() -> None:
    r = scrub(reserve_mib=256, lib=FakeCuda(100 * MIB, 256 * MIB, 1 << 62))
    assert r.scrubbed_bytes == 0 and r.probes == 0 and not r.ok


def test_a_failed_call_names_it_and_cleans_up() -> None:
    lib = FakeCuda(64 * MIB, 128 * MIB, 1 << 62, fail="cuCtxSynchronize")
    with pytest.raises(ScrubError, match=r"cuCtxSynchronize failed: CUDA error 700 \(an illegal memory"):
        scrub(reserve_mib=0, chunk_mib=32, lib=lib)
    assert lib.live == {} and lib.calls[-1] == "cuDevicePrimaryCtxRelease_v2"


def test_missing_driver_is_a_clear_error() -> None:
    with pytest.raises(ScrubError, match=r"cannot load libcuda-does-not-exist\.so"):
        load_libcuda("libcuda-does-not-exist.so")


def _libcuda() -> bool:
    try:
        load_libcuda()
    except ScrubError:
        return False
    return True


@pytest.mark.skipif(not _libcuda(), reason="no NVIDIA driver (libcuda.so.1) on this machine")
def test_real_gpu_scrub_through_the_cli() -> None:  # pragma: no cover - GPU machines only
    proc = subprocess.run(
        [sys.executable, "-c", "from node_agent.cli import main; main()", "attest", "scrub-gpu"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] and out["scrubbed_bytes"] > out["free_bytes"] // 2
    assert out["probes"] == out["probes_zero"] > 0


def test_scrub_command_gets_the_gpus_bus_id_and_sees_only_that_gpu(tmp_path: object) -> None:
    """The hand-over's scrub on the nvml backend: placeholders filled from NVML's identity of the GPU, and
    CUDA_VISIBLE_DEVICES set to its UUID (CUDA's own numbering need not match NVML's)."""
    from pathlib import Path
    from types import SimpleNamespace

    from node_agent.attest.config import AttestConfig
    from node_agent.attest.service import Attestor
    from node_agent.backends.base import GpuInfo
    from node_agent.backends.nvml import NvmlBackend

    backend = NvmlBackend("n1")
    backend._infos = [
        GpuInfo(0, "GPU-aaaa", "00000000:18:00.0", "nvidia0", "NVIDIA H200"),
        GpuInfo(1, "GPU-bbbb", "00000000:2A:00.0", "nvidia1", "NVIDIA H200"),
    ]
    log = Path(str(tmp_path)) / "calls"
    script = (
        "import os, sys; open(sys.argv[1], 'a').write(' '.join(sys.argv[2:]) + ' ' "
        "+ os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + os.environ['CUDA_DEVICE_ORDER'] + '\\n'); "
        "sys.exit(3 if sys.argv[3] == 'GPU-bbbb' else 0)"
    )
    cmd = [sys.executable, "-c", script, str(log), "{pci}", "{uuid}", "{gpu}"]
    agent = SimpleNamespace(backend=backend, state_dir=Path(str(tmp_path)), node="n1", clock=lambda: 5.0)
    done = Attestor(agent, AttestConfig(scrub_command=cmd)).scrub([1, 0])
    assert log.read_text().splitlines() == [
        "00000000:18:00.0 GPU-aaaa 0 GPU-aaaa PCI_BUS_ID",
        "00000000:2A:00.0 GPU-bbbb 1 GPU-bbbb PCI_BUS_ID",
    ]
    assert done["method"] == "command" and not done["scrubbed"] and list(done["failed"]) == [1]
