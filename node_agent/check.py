"""Active GPU check: a deterministic known-answer compute per GPU (what a Slurm canary runs).

Input: a started backend (fake: the persisted state) and optional GPU index. Output: a
``CheckReport`` (pydantic) with one result per GPU: ``pass``, ``fail`` (wrong answer: quiet
corruption) or ``missing`` (GPU not visible). Exit codes used by the CLI: 0 all pass, 1 any
fail/missing (or dcgmi diag failed), 2 usage or backend error, 3 no compute path (nvml backend without
libcuda, or cuInit failing). The nvml backend's check is ``node_agent.cuda_check`` (a PTX kernel per GPU
through the CUDA driver API, and ``dcgmi diag`` when DCGM is installed).

On the fake backend the "GPU" computes a 24x24 integer matrix product of seeded inputs and
hashes it; a GPU with a ``corrupt`` fault flips one bit of one product element, so its hash
differs from the reference the host computes. No metric changes: only this check sees it.
"""

from __future__ import annotations

import hashlib
import random
from typing import Literal

from pydantic import BaseModel

from node_agent.backends.fake import FakeBackend

N = 24


class GpuCheck(BaseModel):
    gpu: int
    uuid: str
    status: Literal["pass", "fail", "missing"]
    detail: str


class DiagResult(BaseModel):
    """``dcgmi diag -r LEVEL`` (nvml backend, where DCGM is installed): a node-level verdict."""

    level: int
    ok: bool
    rc: int | None
    detail: str


class CheckReport(BaseModel):
    node: str
    ok: bool
    time: float
    results: list[GpuCheck]
    unavailable: str | None = None
    """Set when no check could run at all (nvml: no libcuda / cuInit failed): exit 3, not a GPU verdict."""
    diag: DiagResult | None = None


def _matrices(seed: int, gpu: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(f"fleetyield-check:{seed}:{gpu}")
    a = [[rng.randrange(-128, 128) for _ in range(N)] for _ in range(N)]
    b = [[rng.randrange(-128, 128) for _ in range(N)] for _ in range(N)]
    return a, b


def _product_digest(a: list[list[int]], b: list[list[int]], flip: bool) -> str:
    cols = list(zip(*b, strict=True))
    h = hashlib.sha256()
    for i, row in enumerate(a):
        for j, col in enumerate(cols):
            v = sum(x * y for x, y in zip(row, col, strict=True))
            if flip and i == 7 and j == 11:
                v ^= 1 << 9  # one flipped bit, as a bad SRAM/HBM cell would do
            h.update(v.to_bytes(8, "big", signed=True))
    return h.hexdigest()


def run_fake_check(backend: FakeBackend, now: float, gpu: int | None = None) -> CheckReport:
    state = backend.state
    assert state is not None
    results: list[GpuCheck] = []
    for g in state.gpus:
        if gpu is not None and g.index != gpu:
            continue
        if backend.is_missing(g):
            results.append(
                GpuCheck(gpu=g.index, uuid=g.uuid, status="missing", detail="GPU not visible (XID 79)")
            )
            continue
        a, b = _matrices(state.seed, g.index)
        expected = _product_digest(a, b, flip=False)
        got = _product_digest(a, b, flip=backend.is_corrupt(g))
        if got == expected:
            results.append(
                GpuCheck(gpu=g.index, uuid=g.uuid, status="pass", detail=f"matmul {N}x{N} sha256 ok")
            )
        else:
            results.append(
                GpuCheck(
                    gpu=g.index,
                    uuid=g.uuid,
                    status="fail",
                    detail=f"matmul {N}x{N} sha256 {got[:12]} != expected {expected[:12]}",
                )
            )
    if gpu is not None and not results:
        raise ValueError(f"no GPU {gpu} on this node")
    return CheckReport(
        node=backend.node, ok=all(r.status == "pass" for r in results), time=now, results=results
    )
