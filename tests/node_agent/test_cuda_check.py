"""``cuda_check``: the driver-API sequence and the verdicts against an injected libcuda that runs the kernel's
arithmetic in Python (what a GPU-less box can check), the dcgmi verdicts, the no-compute-path exit, and the
real kernel on a GPU machine (skipped without ``libcuda.so.1``)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from node_agent import cuda_check as cc
from node_agent.agent import Agent
from node_agent.backends.base import GpuInfo
from node_agent.backends.nvml import NvmlBackend

GPUS = [
    GpuInfo(i, f"GPU-{i}", f"00000000:{0x18 + i:02X}:00.0", f"nvidia{i}", "NVIDIA H200") for i in range(3)
]


class FakeCuda:
    """libcuda as ctypes calls it; ``cuLaunchKernel`` runs the kernel's arithmetic (``cc.expected``) on
    the device buffers, flipping one bit on the GPUs in ``corrupt``; ``fail`` maps a call to the GPU it
    fails on."""

    def __init__(self, corrupt: frozenset[int] = frozenset(), fail: dict[str, int] | None = None) -> None:
        self.corrupt, self.fail = corrupt, fail or {}
        self.calls: list[str] = []
        self.mem: dict[int, list[int]] = {}
        self.next_ptr = 1 << 32
        self.dev = -1
        self.ptx = b""
        self.launch: tuple[int, ...] = ()

    def _rc(self, fn: str) -> int:
        self.calls.append(fn)
        return 999 if self.fail.get(fn) == self.dev else 0

    def cuGetErrorString(self, rc: int, out: Any) -> int:
        out._obj.value = b"unknown error (an XID on the GPU)"
        return 0

    def cuInit(self, flags: Any) -> int:
        self.dev = -2
        return self._rc("cuInit")

    def cuDeviceGetByPCIBusId(self, dev: Any, bus: ctypes.c_char_p) -> int:
        assert bus.value is not None
        self.dev = int(bus.value.decode().split(":")[1], 16) - 0x18
        dev._obj.value = self.dev
        return self._rc("cuDeviceGetByPCIBusId")

    def cuCtxCreate_v2(self, ctx: Any, flags: Any, dev: Any) -> int:
        assert dev.value == self.dev
        ctx._obj.value = 100 + self.dev
        return self._rc("cuCtxCreate_v2")

    def cuModuleLoadData(self, mod: Any, image: ctypes.c_char_p) -> int:
        assert image.value is not None
        self.ptx = image.value
        mod._obj.value = 7
        return self._rc("cuModuleLoadData")

    def cuModuleGetFunction(self, fn: Any, mod: Any, name: ctypes.c_char_p) -> int:
        assert name.value == cc.KERNEL and name.value in self.ptx
        fn._obj.value = 8
        return self._rc("cuModuleGetFunction")

    def cuMemAlloc_v2(self, ptr: Any, size: ctypes.c_size_t) -> int:
        ptr._obj.value = self.next_ptr
        self.mem[self.next_ptr] = [0] * (size.value // 4)
        self.next_ptr += size.value
        return self._rc("cuMemAlloc_v2")

    def cuMemcpyHtoD_v2(self, dst: ctypes.c_uint64, src: Any, n: ctypes.c_size_t) -> int:
        self.mem[dst.value] = list(src)[: n.value // 4]
        return self._rc("cuMemcpyHtoD_v2")

    def cuLaunchKernel(
        self, fn: Any, gx: Any, gy: Any, gz: Any, bx: Any, by: Any, bz: Any, *rest: Any
    ) -> int:
        _shared, _stream, args, _extra = rest
        d_in, d_out = (ctypes.cast(args[i], ctypes.POINTER(ctypes.c_uint64)).contents.value for i in (0, 1))
        n, rounds = (ctypes.cast(args[i], ctypes.POINTER(ctypes.c_uint32)).contents.value for i in (2, 3))
        self.launch = (gx.value, bx.value, n, rounds)
        out = cc.expected(self.mem[d_in][:n], rounds)
        if self.dev in self.corrupt:
            out[123] ^= 1 << 9
        self.mem[d_out] = out
        return self._rc("cuLaunchKernel")

    def cuCtxSynchronize(self) -> int:
        return self._rc("cuCtxSynchronize")

    def cuMemcpyDtoH_v2(self, dst: Any, src: ctypes.c_uint64, n: ctypes.c_size_t) -> int:
        for i, w in enumerate(self.mem[src.value][: n.value // 4]):
            dst[i] = w
        return self._rc("cuMemcpyDtoH_v2")

    def cuMemFree_v2(self, ptr: ctypes.c_uint64) -> int:
        del self.mem[ptr.value]
        return self._rc("cuMemFree_v2")

    def cuModuleUnload(self, mod: Any) -> int:
        return self._rc("cuModuleUnload")

    def cuCtxDestroy_v2(self, ctx: Any) -> int:
        return self._rc("cuCtxDestroy_v2")


def _no_diag(level: int) -> None:
    return None


def test_every_gpu_passes_with_the_known_answer() -> None:
    lib = FakeCuda()
    r = cc.run_cuda_check("n1", GPUS, 5.0, lib=lib, diag=_no_diag)
    assert r.ok and r.unavailable is None and [x.status for x in r.results] == ["pass"] * 3
    assert lib.launch == (cc.THREADS // cc.BLOCK, cc.BLOCK, cc.THREADS, cc.ROUNDS)
    assert lib.calls.count("cuLaunchKernel") == 3 and lib.mem == {}  # all device memory freed
    per_gpu = lib.calls[1 : 1 + lib.calls[1:].index("cuDeviceGetByPCIBusId", 1)]
    assert per_gpu == [
        "cuDeviceGetByPCIBusId", "cuCtxCreate_v2", "cuModuleLoadData", "cuModuleGetFunction",
        "cuMemAlloc_v2", "cuMemAlloc_v2", "cuMemcpyHtoD_v2", "cuLaunchKernel", "cuCtxSynchronize",
        "cuMemcpyDtoH_v2", "cuMemFree_v2", "cuMemFree_v2", "cuModuleUnload", "cuCtxDestroy_v2",
    ]  # fmt: skip


def test_one_flipped_bit_fails_that_gpu_only() -> None:
    r = cc.run_cuda_check("n1", GPUS, 5.0, lib=FakeCuda(corrupt=frozenset({1})), diag=_no_diag)
    assert not r.ok and [x.status for x in r.results] == ["pass", "fail", "pass"]
    assert "1 of 4096 words wrong (first: word 123" in r.results[1].detail


def test_a_cuda_error_fails_that_gpu_and_cleans_up() -> None:
    lib = FakeCuda(fail={"cuLaunchKernel": 2})
    r = cc.run_cuda_check("n1", GPUS, 5.0, lib=lib, diag=_no_diag)
    assert [x.status for x in r.results] == ["pass", "pass", "fail"]
    assert r.results[2].detail == "cuLaunchKernel failed: CUDA error 999 (unknown error (an XID on the GPU))"
    assert lib.mem == {} and lib.calls[-1] == "cuCtxDestroy_v2"


def test_one_gpu_by_index_and_an_unknown_index() -> None:
    r = cc.run_cuda_check("n1", GPUS, 5.0, gpu=1, lib=FakeCuda(), diag=_no_diag)
    assert [x.gpu for x in r.results] == [1] and r.ok
    with pytest.raises(ValueError, match="no GPU 7 on this node"):
        cc.run_cuda_check("n1", GPUS, 5.0, gpu=7, lib=FakeCuda(), diag=_no_diag)


def test_no_libcuda_or_no_cuinit_is_no_compute_path() -> None:
    with pytest.raises(cc.NoComputePath, match=r"no compute path: cannot load libcuda-nope\.so"):
        cc.load_libcuda("libcuda-nope.so")
    r = cc.run_cuda_check("n1", GPUS, 5.0, lib=FakeCuda(fail={"cuInit": -2}), diag=_no_diag)
    assert not r.ok and r.results == [] and r.unavailable is not None
    assert r.unavailable.startswith("no compute path: cuInit failed: CUDA error 999")


def test_expected_is_the_kernels_arithmetic() -> None:
    """Pinned words (worked by hand from the PTX: x = x*1664525 + 1013904223; y = x ^ i; x = y ^ y >> 13):
    a change to the host reference cannot silently agree with itself."""
    assert cc.expected([0, 1, 0xFFFFFFFF], rounds=1) == [1013911592, 1015659823, 1012166652]
    assert cc.expected([0, 0, 0, 0, 0, 7], rounds=2)[5] == 3842733238
    assert cc.compare([1, 2], [1, 2]) is None and cc.compare([1], [1, 2]) == "1 words back, 2 expected"


def _runner(rc: int, out: str = "", timeout: bool = False) -> Any:
    seen: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> Any:
        seen.append(cmd)
        if timeout:
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        return SimpleNamespace(returncode=rc, stdout=out, stderr="")

    run.seen = seen  # type: ignore[attr-defined]
    return run


def test_dcgmi_diag_verdicts() -> None:
    which = {"dcgmi": "/usr/bin/dcgmi"}.get
    run = _runner(0, '{"DCGM GPU Diagnostic": {}}')
    assert cc.run_diag(2, which=which, runner=run) == cc.DiagResult(
        level=2, ok=True, rc=0, detail="dcgmi diag -r 2 passed"
    )
    assert run.seen == [["/usr/bin/dcgmi", "diag", "-r", "2", "-j"]]
    bad = cc.run_diag(1, which=which, runner=_runner(226, "header\nError: GPU 3 memory test failed"))
    assert (
        bad is not None and not bad.ok and bad.rc == 226 and bad.detail.endswith("GPU 3 memory test failed")
    )
    slow = cc.run_diag(3, which=which, runner=_runner(0, timeout=True))
    assert slow is not None and not slow.ok and "timed out after 3600s" in slow.detail
    assert cc.run_diag(1, which=lambda _n: None, runner=_runner(0)) is None  # DCGM not installed
    assert cc.run_diag(0, which=which, runner=_runner(0)) is None  # switched off


def test_a_failed_diag_fails_the_check_even_when_every_kernel_passes() -> None:
    verdict = cc.DiagResult(level=1, ok=False, rc=226, detail="dcgmi diag -r 1 failed: x")
    r = cc.run_cuda_check("n1", GPUS, 5.0, lib=FakeCuda(), diag=lambda level: verdict)
    assert all(x.status == "pass" for x in r.results) and not r.ok and r.diag == verdict


def test_agent_on_a_node_without_nvidia_driver_reports_no_compute_path(tmp_path: Any) -> None:
    class _Err(Exception):
        pass

    def init() -> None:
        raise _Err("Driver Not Loaded")

    backend = NvmlBackend("n1", nvml=SimpleNamespace(NVMLError=_Err, nvmlInit=init))
    report = Agent(backend, tmp_path, "n1", lambda: 5.0).check()
    assert report.unavailable is not None and "no compute path: no NVIDIA driver" in report.unavailable
    assert not (tmp_path / "fatal.json").exists()  # nothing was checked: no GPU is blamed


@pytest.mark.parametrize(
    ("report", "code"),
    [
        ({"ok": True, "results": [], "unavailable": None, "diag": None}, 0),
        ({"ok": False, "results": [], "unavailable": None, "diag": None}, 1),
        (
            {
                "ok": False,
                "results": [],
                "unavailable": "no compute path: cannot load libcuda.so.1",
                "diag": None,
            },
            3,
        ),
    ],
)
def test_check_exit_codes(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, report: dict, code: int) -> None:
    from node_agent import cli

    monkeypatch.setattr(cli, "_run", lambda *a, **k: report)
    res = CliRunner().invoke(cli.main, ["check", "--state-dir", str(tmp_path)])
    assert res.exit_code == code, res.output


def _libcuda() -> bool:
    try:
        cc.load_libcuda()
    except cc.NoComputePath:
        return False
    return True


@pytest.mark.skipif(not _libcuda(), reason="no NVIDIA driver (libcuda.so.1) on this machine")
def test_the_real_kernel_on_gpu_0() -> None:  # pragma: no cover - only on a GPU machine
    info = GpuInfo(0, "GPU-0", "", "nvidia0", "")
    r = cc.run_cuda_check("real", [info], 0.0, diag=_no_diag)
    assert r.ok, r


def test_agent_books_failed_gpus_and_a_failed_diag_as_fatal(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong answer or a failed diag is evidence the controller quarantines on (fatal.json); the check runs
    outside the agent lock (scrapes are not held for the kernel or dcgmi)."""
    backend = NvmlBackend("n1", nvml=SimpleNamespace())
    backend._infos = list(GPUS)
    agent = Agent(backend, tmp_path, "n1", lambda: 5.0)
    verdict = cc.DiagResult(level=1, ok=False, rc=226, detail="dcgmi diag -r 1 failed: x")
    lib = FakeCuda(corrupt=frozenset({2}))

    def run(*a: Any, **kw: Any) -> Any:
        free: list[bool] = []

        def probe() -> None:  # another thread (a scrape) can take the agent lock while the kernel runs
            got = agent.lock.acquire(timeout=2)
            free.append(got)
            if got:
                agent.lock.release()

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        assert free == [True]
        return real(*a, **kw, lib=lib, diag=lambda level: verdict)

    real = cc.run_cuda_check
    monkeypatch.setattr(cc, "run_cuda_check", run)
    report = agent.check(diag_level=1)
    assert not report.ok and [r.status for r in report.results] == ["pass", "pass", "fail"]
    text = (tmp_path / "fatal.json").read_text()
    assert "active check fail: 1 of 4096 words wrong" in text and "dcgmi diag -r 1 failed" in text


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="no CUDA toolkit (ptxas) on this machine")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_ptx_assembles_for_a100_and_h100(tmp_path: Any, arch: str) -> None:
    """What the driver's JIT does at cuModuleLoadData, done by the toolkit's assembler where there is one."""
    src = tmp_path / "check.ptx"
    src.write_text(cc.PTX)
    out = subprocess.run(
        ["ptxas", f"-arch={arch}", str(src), "-o", str(tmp_path / "check.cubin")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "check.cubin").stat().st_size > 0


def test_check_waits_for_the_running_agent_as_long_as_dcgmi_may_take(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Through the control socket the CLI used to wait 10 s: dcgmi diag -r 2 alone may take minutes."""
    from node_agent import cli

    seen: list[tuple[dict, float]] = []

    def run(state_dir: Any, request: dict, backend: Any = None, timeout_s: float = 10.0) -> dict:
        seen.append((request, timeout_s))
        return {"ok": True, "results": [], "unavailable": None, "diag": None}

    monkeypatch.setattr(cli, "_run", run)
    for level in ("0", "2"):
        res = CliRunner().invoke(
            cli.main, ["check", "--state-dir", str(tmp_path), "--dcgm-diag-level", level]
        )
        assert res.exit_code == 0, res.output
    assert [(r["diag_level"], t) for r, t in seen] == [(0, 60.0), (2, 60.0 + cc.DIAG_TIMEOUT_S[2])]
