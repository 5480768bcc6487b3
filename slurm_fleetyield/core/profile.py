"""Profile: workload classes, their resource envelopes, and what each node can serve.

Input: sensed nodes (per-GPU readings and rates), the Slurm view (``gpu_type``) and ``ProfileParams``.
Output: one ``Envelope`` per node: premium or not, NVLink present and clean, HBM complete and healthy.

Workload classes and the envelope each needs (``route`` turns these into admission features):
- decode (inference): memory-bandwidth bound, small, latency sensitive. Needs healthy HBM; must not use
  premium GPUs (their NVLink and HBM capacity are wasted on it).
- pretrain (gangs): bound by NVLink collectives and expensive to lose (not checkpoint-cheap). Needs every
  GPU's NVLink clean and a green node.
- finetune: bound by HBM capacity. Needs full HBM (no lost capacity, no pending or failed remaps).
- batch / eval: checkpointable, cheap to retry. May use yellow nodes.
- canary: FleetYield's rehabilitation probes (lifecycle, next issue). Only canary-tier nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_fleetyield.core.model import Envelope, Observations, WorkloadClass
from slurm_fleetyield.core.params import ProfileParams
from slurm_fleetyield.core.sense import Sensed, SensedGpu, SensedNode
from slurm_fleetyield.core.signals import (
    COUNTER_CHANNELS,
    FB_TOTAL,
    NVLINK_CRC_DATA,
    NVLINK_CRC_FLIT,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    REMAP_FAILURE,
    REMAP_PENDING,
    ROWS_UNCORR,
)
from slurm_fleetyield.core.state import ControllerState


@dataclass(frozen=True, slots=True)
class ClassEnvelope:
    workload: WorkloadClass
    bound_by: str
    needs: tuple[str, ...]  # envelope capabilities required
    yellow_ok: bool
    premium_ok: bool


CLASSES: tuple[ClassEnvelope, ...] = (
    ClassEnvelope(WorkloadClass.DECODE, "memory bandwidth, latency", ("hbm_full",), False, False),
    ClassEnvelope(WorkloadClass.PRETRAIN, "NVLink collectives", ("nvlink_full",), False, True),
    ClassEnvelope(WorkloadClass.FINETUNE, "HBM capacity", ("hbm_full",), False, True),
    ClassEnvelope(WorkloadClass.BATCH, "checkpointable throughput", (), True, True),
    ClassEnvelope(WorkloadClass.CANARY, "rehabilitation probe", (), False, True),
)


def profile(
    sensed: Sensed, obs: Observations, state: ControllerState, pp: ProfileParams
) -> Mapping[str, Envelope]:
    premium = tuple(m.lower() for m in pp.premium_gpu_models)
    nvlink_models = tuple(m.lower() for m in pp.nvlink_gpu_models)
    nominal = tuple((k.lower(), v) for k, v in pp.fb_total_mib.items())
    out: dict[str, Envelope] = {}
    for name, node in sensed.nodes.items():
        slurm = obs.slurm.get(name)
        gpu_type = (slurm.gpu_type or "") if slurm else ""
        models = {g.reading.model for g in node.gpus}
        text = " ".join((gpu_type, *models)).lower()
        is_premium = any(m in text for m in premium)
        model = next(iter(sorted(models)), gpu_type)
        if not node.fresh:
            out[name] = Envelope(model, is_premium, notes=(f"unknown: {node.reason}",))
            continue
        out[name] = _envelope(node, model, is_premium, text, nvlink_models, nominal, pp)
    return out


def _envelope(
    node: SensedNode,
    model: str,
    is_premium: bool,
    text: str,
    nvlink_models: tuple[str, ...],
    nominal: tuple[tuple[str, float], ...],
    pp: ProfileParams,
) -> Envelope:
    notes: list[str] = []
    # By model only: exporters publish NVLink counters (as zeros) on PCIe boards too.
    has_nvlink = any(m in text for m in nvlink_models)
    nvlink_full = has_nvlink and bool(node.gpus) and not node.missing_gpus
    hbm_full = bool(node.gpus) and not node.missing_gpus
    if node.missing_gpus:
        notes.append(f"{node.missing_gpus} GPU(s) missing")
    for g in node.gpus:
        f = g.reading.fields
        if has_nvlink and g.rates is not None:
            crc = _rate(g, (NVLINK_CRC_FLIT, NVLINK_CRC_DATA))
            replay = _rate(g, (NVLINK_REPLAY, NVLINK_RECOVERY))
            if crc >= pp.nvlink_crc_per_hour_max:
                nvlink_full = False
                notes.append(
                    f"gpu {g.reading.index}: NVLink CRC {crc:.0f}/h >= {pp.nvlink_crc_per_hour_max:g}/h"
                )
            if replay >= pp.nvlink_replay_per_hour_max:
                nvlink_full = False
                notes.append(
                    f"gpu {g.reading.index}: NVLink replay+recovery {replay:.0f}/h "
                    f">= {pp.nvlink_replay_per_hour_max:g}/h"
                )
        if f.get(REMAP_FAILURE):
            hbm_full = False
            notes.append(f"gpu {g.reading.index}: row remap failure")
        if f.get(REMAP_PENDING):
            hbm_full = False
            notes.append(f"gpu {g.reading.index}: row remap pending")
        rows = f.get(ROWS_UNCORR) or 0.0
        if rows >= pp.uncorrectable_remapped_rows_max > 0:
            hbm_full = False
            notes.append(f"gpu {g.reading.index}: {rows:g} uncorrectable remapped rows")
        total = f.get(FB_TOTAL)  # only the exported total: free + used misses reserved memory
        want = next((v for k, v in nominal if k in g.reading.model.lower()), None)
        if total is not None and want is not None and total < want * pp.fb_total_tolerance:
            hbm_full = False
            notes.append(f"gpu {g.reading.index}: framebuffer {total:.0f} MiB < nominal {want:.0f} MiB")
    if not has_nvlink:
        notes.append("no NVLink on this model")
    return Envelope(model, is_premium, has_nvlink, nvlink_full, hbm_full, True, tuple(notes))


def _rate(g: SensedGpu, channels: tuple[str, ...]) -> float:
    if g.rates is None:
        return 0.0
    return sum(g.rates[_SLOT[c]] for c in channels)


_SLOT = {c: i for i, c in enumerate(COUNTER_CHANNELS)}
