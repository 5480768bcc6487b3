"""The nvml backend's active check: a known-answer kernel per GPU via the CUDA driver API, plus DCGM diag.

Input: the GPUs (``GpuInfo``: index, UUID, PCI bus id), a seed, optionally a ``dcgmi diag`` level, and
injectable seams (the libcuda object, the ``dcgmi`` runner) for tests. Output: a ``CheckReport`` as the fake
backend's check gives (``node_agent.check``), with ``unavailable`` set when there is no compute path at all
(no ``libcuda.so.1``, or ``cuInit`` fails: exit 3) and ``diag`` holding dcgmi's verdict when it ran.

The kernel (``PTX`` below, JIT-compiled by the driver: no CUDA toolkit on the node) runs 4096 threads; each
takes a seeded 32-bit input and applies ``ROUNDS`` rounds of an LCG step mixed with its thread index and a
shift-xor. Integer arithmetic is exact, so the host recomputes every word and any difference is quiet
corruption (a bad ALU, register file, cache or HBM cell): that GPU fails, with the first wrong word in the
detail. A CUDA error on one GPU (context, load, launch, copy) fails that GPU with CUDA's error text: a GPU
that cannot run a kernel is not healthy. Written on ctypes rather than a CUDA binding (cuda-python, CuPy)
because those need the toolkit or a wheel matched to the driver; the driver's own library is always there
where the nvml backend runs (``node_agent.attest.cuda_scrub`` does the same for the memory scrub).

``dcgmi diag -r LEVEL -j`` (``dcgm_diag_level`` > 0 and ``dcgmi`` on PATH): exit status 0 passes; anything
else, or a timeout, fails the check as a whole (its output's last line in the detail).
"""

from __future__ import annotations

import ctypes
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from node_agent.backends.base import GpuInfo
from node_agent.check import CheckReport, DiagResult, GpuCheck

THREADS = 4096
BLOCK = 256
ROUNDS = 64
LCG_MUL = 1664525
LCG_ADD = 1013904223
MASK = 0xFFFFFFFF
DIAG_TIMEOUT_S = {1: 120, 2: 900, 3: 3600, 4: 10800}
KERNEL = b"fy_known_answer"

PTX = f"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry fy_known_answer(
    .param .u64 p_in,
    .param .u64 p_out,
    .param .u32 p_n,
    .param .u32 p_rounds
)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<14>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [p_in];
    ld.param.u64 %rd2, [p_out];
    ld.param.u32 %r1, [p_n];
    ld.param.u32 %r2, [p_rounds];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.u32 %r6, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r6, %r1;
    @%p1 bra FY_DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r6, 4;
    add.s64 %rd6, %rd3, %rd5;
    ld.global.u32 %r7, [%rd6];
    mov.u32 %r8, 0;
    mov.u32 %r11, {LCG_MUL};
    mov.u32 %r12, {LCG_ADD};
FY_LOOP:
    setp.ge.u32 %p2, %r8, %r2;
    @%p2 bra FY_STORE;
    mad.lo.u32 %r7, %r7, %r11, %r12;
    xor.b32 %r9, %r7, %r6;
    shr.u32 %r10, %r9, 13;
    xor.b32 %r7, %r9, %r10;
    add.u32 %r8, %r8, 1;
    bra FY_LOOP;
FY_STORE:
    add.s64 %rd7, %rd4, %rd5;
    st.global.u32 [%rd7], %r7;
FY_DONE:
    ret;
}}
"""


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and CUDA's error text."""


class NoComputePath(RuntimeError):
    """No CUDA driver to run a kernel with (libcuda missing, or cuInit failing for the whole node)."""


def inputs(seed: int, gpu: int) -> list[int]:
    rng = random.Random(f"fleetyield-cuda-check:{seed}:{gpu}")
    return [rng.getrandbits(32) for _ in range(THREADS)]


def expected(words: Sequence[int], rounds: int = ROUNDS) -> list[int]:
    """What the kernel computes, on the host (the known answer)."""
    out = []
    for i, x in enumerate(words):
        for _ in range(rounds):
            x = (x * LCG_MUL + LCG_ADD) & MASK
            y = x ^ i
            x = y ^ (y >> 13)
        out.append(x)
    return out


def compare(got: Sequence[int], want: Sequence[int]) -> str | None:
    """None when equal, else what differs (count and the first wrong word), for the check's detail."""
    if len(got) != len(want):
        return f"{len(got)} words back, {len(want)} expected"
    bad = [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
    if not bad:
        return None
    i = bad[0]
    return (
        f"{len(bad)} of {len(want)} words wrong (first: word {i} = {got[i]:#010x}, expected {want[i]:#010x})"
    )


def load_libcuda(name: str = "libcuda.so.1") -> Any:
    try:
        return ctypes.CDLL(name)
    except OSError as exc:
        raise NoComputePath(
            f"no compute path: cannot load {name} (the NVIDIA driver's CUDA library): {exc}"
        ) from None


class _Cuda:
    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def __call__(self, fn: str, *args: Any) -> None:
        rc = int(getattr(self.lib, fn)(*args))
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise CudaError(f"{fn} failed: CUDA error {rc} ({text})")

    def quiet(self, fn: str, *args: Any) -> None:
        """Cleanup: a failure here must not hide the result or the first error."""
        getattr(self.lib, fn)(*args)


def run_kernel(cu: _Cuda, info: GpuInfo, words: Sequence[int]) -> list[int]:
    """One GPU: own context, load the PTX, copy in, launch, copy back, tear down."""
    dev = ctypes.c_int()
    if info.pci_bus_id:
        cu("cuDeviceGetByPCIBusId", ctypes.byref(dev), ctypes.c_char_p(info.pci_bus_id.encode()))
    else:
        cu("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(info.index))
    ctx = ctypes.c_void_p()
    cu("cuCtxCreate_v2", ctypes.byref(ctx), ctypes.c_uint(0), dev)
    mod = ctypes.c_void_p()
    d_in, d_out = ctypes.c_uint64(), ctypes.c_uint64()
    n = len(words)
    nbytes = ctypes.c_size_t(4 * n)
    try:
        cu("cuModuleLoadData", ctypes.byref(mod), ctypes.c_char_p(PTX.encode()))
        fn = ctypes.c_void_p()
        cu("cuModuleGetFunction", ctypes.byref(fn), mod, ctypes.c_char_p(KERNEL))
        cu("cuMemAlloc_v2", ctypes.byref(d_in), nbytes)
        cu("cuMemAlloc_v2", ctypes.byref(d_out), nbytes)
        host_in = (ctypes.c_uint32 * n)(*words)
        cu("cuMemcpyHtoD_v2", d_in, host_in, nbytes)
        c_n, c_rounds = ctypes.c_uint32(n), ctypes.c_uint32(ROUNDS)
        args = (ctypes.c_void_p * 4)(
            *(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in (d_in, d_out, c_n, c_rounds))
        )
        grid = (n + BLOCK - 1) // BLOCK
        u = ctypes.c_uint
        cu("cuLaunchKernel", fn, u(grid), u(1), u(1), u(BLOCK), u(1), u(1), u(0), None, args, None)
        cu("cuCtxSynchronize")
        host_out = (ctypes.c_uint32 * n)()
        cu("cuMemcpyDtoH_v2", host_out, d_out, nbytes)
        return list(host_out)
    finally:
        for ptr in (d_in, d_out):
            if ptr.value:
                cu.quiet("cuMemFree_v2", ptr)
        if mod.value:
            cu.quiet("cuModuleUnload", mod)
        cu.quiet("cuCtxDestroy_v2", ctx)


def run_diag(
    level: int, which: Callable[[str], str | None] = shutil.which, runner: Callable[..., Any] = subprocess.run
) -> DiagResult | None:
    """``dcgmi diag -r LEVEL -j`` when dcgmi is installed; None when it is not or ``level`` is 0."""
    if level <= 0:
        return None
    dcgmi = which("dcgmi")
    if dcgmi is None:
        return None
    timeout = DIAG_TIMEOUT_S.get(level, DIAG_TIMEOUT_S[4])
    try:
        proc = runner(
            [dcgmi, "diag", "-r", str(level), "-j"], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return DiagResult(
            level=level, ok=False, rc=None, detail=f"dcgmi diag -r {level} timed out after {timeout}s"
        )
    lines = ((proc.stdout or "") + (proc.stderr or "")).strip().splitlines()
    last = lines[-1][:200] if lines else "no output"
    if proc.returncode == 0:
        return DiagResult(level=level, ok=True, rc=0, detail=f"dcgmi diag -r {level} passed")
    return DiagResult(
        level=level, ok=False, rc=proc.returncode, detail=f"dcgmi diag -r {level} failed: {last}"
    )


def run_cuda_check(
    node: str,
    infos: Sequence[GpuInfo],
    now: float,
    gpu: int | None = None,
    seed: int = 0,
    diag_level: int = 0,
    lib: Any = None,
    diag: Callable[[int], DiagResult | None] = run_diag,
) -> CheckReport:
    chosen = [i for i in infos if gpu is None or i.index == gpu]
    if gpu is not None and not chosen:
        raise ValueError(f"no GPU {gpu} on this node")
    try:
        cu = _Cuda(lib if lib is not None else load_libcuda())
        cu("cuInit", ctypes.c_uint(0))
    except (NoComputePath, CudaError) as exc:
        msg = str(exc) if isinstance(exc, NoComputePath) else f"no compute path: {exc}"
        return CheckReport(node=node, ok=False, time=now, results=[], unavailable=msg)
    results: list[GpuCheck] = []
    for info in chosen:
        words = inputs(seed, info.index)
        t0 = time.perf_counter()
        try:
            got = run_kernel(cu, info, words)
        except CudaError as exc:
            results.append(GpuCheck(gpu=info.index, uuid=info.uuid, status="fail", detail=str(exc)))
            continue
        ms = (time.perf_counter() - t0) * 1000
        wrong = compare(got, expected(words))
        if wrong is None:
            detail = f"known-answer kernel {THREADS}x{ROUNDS} ok ({ms:.0f} ms)"
            results.append(GpuCheck(gpu=info.index, uuid=info.uuid, status="pass", detail=detail))
        else:
            results.append(GpuCheck(gpu=info.index, uuid=info.uuid, status="fail", detail=wrong))
    diag_result = diag(diag_level)
    ok = all(r.status == "pass" for r in results) and (diag_result is None or diag_result.ok)
    return CheckReport(node=node, ok=ok and bool(results), time=now, results=results, diag=diag_result)
