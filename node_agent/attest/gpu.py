"""Per-GPU attestation reports from whatever the backends already expose (no backend changes needed).

Input: a started backend. Output: one dict per GPU: ``index``, ``uuid``, ``model``, ``vbios``,
``ecc_mode``, ``mig_mode``, ``persistence_mode``, ``driver``. The nvml backend reads VBIOS and the three
modes once at start (``NvmlBackend.static``); the fake backend reports its model's VBIOS and fixed modes
(ECC on, MIG off, persistence on). A field a backend cannot read is reported as ``unknown`` -- measured as
such, so a GPU that stops answering shows up as a differing record rather than passing silently. GPUs
that fell off the bus (fake XID 79) are still listed from the state, so the identity record is stable.
"""

from __future__ import annotations

from typing import Any

from node_agent.backends.base import Backend, GpuInfo

UNKNOWN = "unknown"


def gpu_reports(backend: Backend) -> list[dict[str, Any]]:
    from node_agent.backends.fake import FakeBackend

    driver = backend.driver_version()
    out: list[dict[str, Any]] = []
    if isinstance(backend, FakeBackend):
        state = backend.state
        if state is None:
            return out
        for g in state.gpus:
            out.append(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": backend.model.name,
                    "vbios": backend.model.vbios,
                    "ecc_mode": "1",
                    "mig_mode": "0",
                    "persistence_mode": "1",
                    "driver": driver,
                }
            )
        return out
    infos: list[GpuInfo] = list(getattr(backend, "_infos", []))
    static: dict[int, dict[str, str]] = getattr(backend, "static", {})
    for info in infos:
        s = static.get(info.index, {})
        out.append(
            {
                "index": info.index,
                "uuid": info.uuid,
                "model": info.model_name,
                "vbios": s.get("vbios", UNKNOWN),
                "ecc_mode": s.get("ecc_mode", UNKNOWN),
                "mig_mode": s.get("mig_mode", UNKNOWN),
                "persistence_mode": s.get("persistence_mode", UNKNOWN),
                "driver": driver,
            }
        )
    return out
