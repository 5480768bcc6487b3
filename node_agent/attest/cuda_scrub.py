"""Scrub one GPU's free memory with the CUDA driver API (``libcuda.so.1`` through ctypes, no toolkit needed).

Input: a GPU (PCI bus id, or a CUDA ordinal among the visible devices), a reserve left unallocated, a chunk
size. Output: a ``ScrubResult``: bytes zeroed, seconds, GB/s, and how many sampled bytes were read back
as zero. Raises ``ScrubError`` with the CUDA error text when the driver is absent or a call fails.

What it does: retain the device's primary context, take ``free - reserve`` bytes in chunks (a chunk that
does not fit is halved until 1 MiB: other tenants' or the driver's allocations fragment the heap),
``cuMemsetD8`` each to 0, synchronise, read back 4 KiB at the start, middle and end of every chunk and
check they are zero, free everything. This is the ``attest.scrub_command`` a real node runs between
tenants (``fleetyield-agent attest scrub-gpu --pci-bus-id {pci}``): NVML has no scrub call, and the
driver's clear-on-allocate is a property of the driver, not something the node can show it did.
Memory held by a running process is not touched (it is not free); the hand-over runs after the job's
processes are gone.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1 << 20
PROBE = 4096


class ScrubError(RuntimeError):
    """The scrub could not run or a CUDA call failed; the message names the call and CUDA's error."""


@dataclass(frozen=True)
class ScrubResult:
    device: str
    name: str
    total_bytes: int
    free_bytes: int
    scrubbed_bytes: int
    chunks: int
    seconds: float
    gb_per_s: float
    probes: int
    probes_zero: int

    @property
    def ok(self) -> bool:
        return self.probes > 0 and self.probes == self.probes_zero

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


class _Cuda:
    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def __call__(self, fn: str, *args: Any) -> None:
        rc = getattr(self.lib, fn)(*args)
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else "unknown error"
            raise ScrubError(f"{fn} failed: CUDA error {rc} ({text})")


def load_libcuda(name: str = "libcuda.so.1") -> Any:
    try:
        return ctypes.CDLL(name)
    except OSError as exc:
        raise ScrubError(f"cannot load {name} (the NVIDIA driver's CUDA library): {exc}") from None


def scrub(
    pci_bus_id: str | None = None,
    ordinal: int = 0,
    reserve_mib: int = 256,
    chunk_mib: int = 1024,
    lib: Any = None,
) -> ScrubResult:
    cu = _Cuda(lib if lib is not None else load_libcuda())
    cu("cuInit", ctypes.c_uint(0))
    dev = ctypes.c_int()
    if pci_bus_id:
        cu("cuDeviceGetByPCIBusId", ctypes.byref(dev), ctypes.c_char_p(pci_bus_id.encode()))
        where = pci_bus_id
    else:
        cu("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(ordinal))
        where = f"cuda:{ordinal}"
    name_buf = ctypes.create_string_buffer(256)
    cu("cuDeviceGetName", name_buf, ctypes.c_int(256), dev)
    ctx = ctypes.c_void_p()
    cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    ptrs: list[tuple[int, int]] = []
    try:
        cu("cuCtxSetCurrent", ctx)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cu("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        want = max(0, free.value - reserve_mib * MIB)
        chunk = max(MIB, chunk_mib * MIB)
        got = 0
        while got < want:
            size = min(chunk, want - got)
            p = ctypes.c_uint64()
            rc = lib_call(cu, "cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(size))
            if rc != 0:
                if chunk <= MIB:
                    break  # what is left is fragments smaller than 1 MiB, or someone else's
                chunk //= 2
                continue
            ptrs.append((p.value, size))
            got += size
        t0 = time.perf_counter()
        for ptr, size in ptrs:
            cu("cuMemsetD8_v2", ctypes.c_uint64(ptr), ctypes.c_ubyte(0), ctypes.c_size_t(size))
        cu("cuCtxSynchronize")
        seconds = time.perf_counter() - t0
        probes = zero = 0
        buf = (ctypes.c_ubyte * PROBE)()
        for ptr, size in ptrs:
            for off in sorted({0, max(0, size // 2 - PROBE // 2), max(0, size - PROBE)}):
                n = min(PROBE, size - off)
                cu("cuMemcpyDtoH_v2", buf, ctypes.c_uint64(ptr + off), ctypes.c_size_t(n))
                probes += 1
                zero += not any(buf[:n])
    finally:
        for ptr, _ in ptrs:
            lib_call(cu, "cuMemFree_v2", ctypes.c_uint64(ptr))
        lib_call(cu, "cuDevicePrimaryCtxRelease_v2", dev)
    return ScrubResult(
        device=where,
        name=name_buf.value.decode(errors="replace"),
        total_bytes=total.value,
        free_bytes=free.value,
        scrubbed_bytes=got,
        chunks=len(ptrs),
        seconds=seconds,
        gb_per_s=(got / seconds / 1e9) if seconds > 0 else 0.0,
        probes=probes,
        probes_zero=zero,
    )


def lib_call(cu: _Cuda, fn: str, *args: Any) -> int:
    """A call whose failure is handled by the caller (allocation retries, cleanup): returns CUDA's code."""
    return int(getattr(cu.lib, fn)(*args))
