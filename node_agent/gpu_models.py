"""Catalog of the GPU models the fake backend can impersonate.

Input: a short key (``h100``, ``h200``, ``a100``, ``l40s``). Output: a frozen ``GpuModel``
with the name NVML reports, framebuffer size (MiB), NVLink count, clocks and power range,
and whether the part uses row remapping (A100 and later HBM parts) or page retirement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str
    fb_total_mib: int
    nvlinks: int
    tier: str
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    power_idle_w: float
    power_max_w: float
    row_remapping: bool
    has_memory_temp: bool
    vbios: str


MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            "h100",
            "NVIDIA H100 80GB HBM3",
            81559,
            18,
            "premium",
            1980,
            2619,
            70.0,
            700.0,
            True,
            True,
            "96.00.99.00.01",
        ),
        GpuModel(
            "h200",
            "NVIDIA H200",
            143771,
            18,
            "premium",
            1980,
            3201,
            75.0,
            700.0,
            True,
            True,
            "96.00.A5.00.01",
        ),
        GpuModel(
            "a100",
            "NVIDIA A100-SXM4-80GB",
            81920,
            12,
            "standard",
            1410,
            1593,
            60.0,
            400.0,
            True,
            True,
            "92.00.45.00.06",
        ),
        GpuModel(
            "l40s",
            "NVIDIA L40S",
            46068,
            0,
            "inference",
            2520,
            9001,
            35.0,
            350.0,
            False,
            False,
            "95.02.66.00.02",
        ),
    )
}


def get_model(key: str) -> GpuModel:
    try:
        return MODELS[key]
    except KeyError:
        raise ValueError(f"unknown GPU model {key!r}; choose one of {', '.join(sorted(MODELS))}") from None
