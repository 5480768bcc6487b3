"""Profile: workload classes, their resource envelopes, and what each node can serve.

Input: sensed nodes (per-GPU readings and rates), the Slurm view (``gpu_type``) and ``ProfileParams``.
Output: one ``Envelope`` per node: premium or not, NVLink present and clean, HBM complete and healthy.

Workload classes and the envelope each needs (``route`` turns these into admission features):
- decode (inference): memory-bandwidth bound, small, latency sensitive. Needs healthy HBM; kept off premium
  GPUs (their NVLink and HBM capacity are wasted on it) unless decode is stuck and no premium-needing work
  waits: then core/premium.py lends it premium nodes (a shadow price, not a wall).
- pretrain (gangs): bound by NVLink collectives and expensive to lose (not checkpoint-cheap). Needs every
  GPU's NVLink clean and a green node.
- finetune: bound by HBM capacity. Needs full HBM (no lost capacity, no pending or failed remaps).
- batch / eval: checkpointable, cheap to retry. May use yellow nodes.
- canary: FleetYield's rehabilitation probes (lifecycle, next issue). Only canary-tier nodes.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    sensed: Sensed, obs: Observations, pp: ProfileParams, names: Iterable[str] | None = None
) -> dict[str, Envelope]:
    """One ``Envelope`` per node of ``names`` (None: every sensed node), a pure function of the node's sensed
    GPUs, its Slurm GPU type and ``pp``: premium when its GPU type or a GPU model names a premium model;
    NVLink present by model, full when no GPU is missing and every GPU's CRC and replay rates are under
    their limits; HBM full when no GPU is missing, none has a pending or failed row remap or too many
    uncorrectable remapped rows, and every exported framebuffer total is nominal. A node that is not fresh
    gets an envelope that can serve nothing, with the reason. (The loop computes only the nodes whose
    inputs changed and carries last tick's envelope for the others: core/carry.py ``profile``.)"""
    premium = tuple(m.lower() for m in pp.premium_gpu_models)
    nvlink_models = tuple(m.lower() for m in pp.nvlink_gpu_models)
    nominal = tuple((k.lower(), v) for k, v in pp.fb_total_mib.items())
    wants: dict[str, float | None] = {}  # GPU model -> nominal framebuffer (first matching substring)
    # Nodes mostly share a handful of (gpu_type, GPU models) combinations: their text is derived once a call.
    texts: dict[tuple[str, tuple[str, ...]], tuple[str, bool, str]] = {}
    nodes = sensed.nodes
    out: dict[str, Envelope] = {}
    for name in nodes if names is None else names:
        node = nodes[name]
        slurm = obs.slurm.get(name)
        gpu_type = (slurm.gpu_type or "") if slurm else ""
        key = (gpu_type, tuple([g.reading.model for g in node.gpus]))
        known = texts.get(key)
        if known is None:
            models = set(key[1])  # built in GPU order, as always: the same set, the same iteration order
            text = " ".join((gpu_type, *models)).lower()
            is_premium = any(m in text for m in premium)
            model = next(iter(sorted(models)), gpu_type)
            known = texts[key] = (text, is_premium, model)
        text, is_premium, model = known
        if not node.fresh:
            out[name] = Envelope(model, is_premium, notes=(f"unknown: {node.reason}",))
            continue
        out[name] = _envelope(node, model, is_premium, text, nvlink_models, nominal, pp, wants)
    return out


def _envelope(
    node: SensedNode,
    model: str,
    is_premium: bool,
    text: str,
    nvlink_models: tuple[str, ...],
    nominal: tuple[tuple[str, float], ...],
    pp: ProfileParams,
    wants: dict[str, float | None],
) -> Envelope:
    """``wants``: the call's GPU model -> nominal framebuffer, filled as models are met."""
    notes: list[str] = []
    # By model only: exporters publish NVLink counters (as zeros) on PCIe boards too.
    has_nvlink = any(m in text for m in nvlink_models)
    missing = node.missing_gpus
    gpus = node.gpus
    nvlink_full = has_nvlink and bool(gpus) and not missing
    hbm_full = bool(gpus) and not missing
    if missing:
        notes.append(f"{missing} GPU(s) missing")
    crc_max, replay_max = pp.nvlink_crc_per_hour_max, pp.nvlink_replay_per_hour_max
    rows_max, tolerance = pp.uncorrectable_remapped_rows_max, pp.fb_total_tolerance
    for g in gpus:
        r = g.reading
        get = r.fields.get
        if has_nvlink and g.rates is not None:
            crc = _rate(g, _CRC)
            replay = _rate(g, _REPLAY)
            if crc >= crc_max:
                nvlink_full = False
                notes.append(f"gpu {r.index}: NVLink CRC {crc:.0f}/h >= {crc_max:g}/h")
            if replay >= replay_max:
                nvlink_full = False
                notes.append(f"gpu {r.index}: NVLink replay+recovery {replay:.0f}/h >= {replay_max:g}/h")
        if get(REMAP_FAILURE):
            hbm_full = False
            notes.append(f"gpu {r.index}: row remap failure")
        if get(REMAP_PENDING):
            hbm_full = False
            notes.append(f"gpu {r.index}: row remap pending")
        rows = get(ROWS_UNCORR) or 0.0
        if rows >= rows_max > 0:
            hbm_full = False
            notes.append(f"gpu {r.index}: {rows:g} uncorrectable remapped rows")
        total = get(FB_TOTAL)  # only the exported total: free + used misses reserved memory
        if total is None:
            continue
        gmodel = r.model
        if gmodel in wants:
            want = wants[gmodel]
        else:
            lower = gmodel.lower()
            want = wants[gmodel] = next((v for k, v in nominal if k in lower), None)
        if want is not None and total < want * tolerance:
            hbm_full = False
            notes.append(f"gpu {r.index}: framebuffer {total:.0f} MiB < nominal {want:.0f} MiB")
    if not has_nvlink:
        notes.append("no NVLink on this model")
    return Envelope(model, is_premium, has_nvlink, nvlink_full, hbm_full, True, tuple(notes))


def _rate(g: SensedGpu, slots: tuple[int, ...]) -> float:
    """The summed per-hour rate of the counter channels at ``slots``."""
    if g.rates is None:
        return 0.0
    return sum(map(g.rates.__getitem__, slots))


_SLOT = {c: i for i, c in enumerate(COUNTER_CHANNELS)}
_CRC = (_SLOT[NVLINK_CRC_FLIT], _SLOT[NVLINK_CRC_DATA])
_REPLAY = (_SLOT[NVLINK_REPLAY], _SLOT[NVLINK_RECOVERY])
