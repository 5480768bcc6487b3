"""What a run's job stream offers the fleet, and the parts of the fleet it cannot use.

Input: one seed's jobs (after ``traces.fill`` or the generator), the fleet (node names, the premium ones, GPUs
per node), the horizon, and the classes an admin constraint keeps on premium nodes (the simulator's
``ADMIN_CONSTRAINT``: pretrain gangs need NVLink boards under every policy). Output: ``facts``: the offered
load that actually ran (``traces.offered_load``), the number of jobs, and warnings in words.

Why: a run's header says the load it was asked for; what it replays can differ (a thinned replica, work
clipped at the horizon), and a workload can leave part of the fleet idle whatever the policy: an
all-pretrain trace at ``--premium-share 0.5`` never uses the other half, so every policy's goodput is that
of half a fleet at twice the load. The numbers are still right; without the warning they read wrong.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from slurm_fleetyield.sim.traces import CLASSES, Job, offered_load


def facts(
    jobs: Sequence[Job],
    nodes: Sequence[str],
    premium: Collection[str],
    gpus_per_node: int,
    horizon_s: float,
    premium_only: Collection[str],
    premium_name: str = "premium",
    other_name: str = "other",
) -> dict[str, Any]:
    """``{"offered_load", "jobs", "warnings"}`` of one seed's job stream on this fleet. The warnings' words
    depend on the fleet and the classes only, not on the seed's draws, so a report can count the seeds that
    gave each."""
    fleet_gpus = len(nodes) * gpus_per_node
    n_prem = sum(1 for n in nodes if n in premium)
    n_other = len(nodes) - n_prem
    gpu_s: dict[str, float] = {}
    largest: dict[str, int] = {}
    for j in jobs:
        gpu_s[j.workload] = gpu_s.get(j.workload, 0.0) + min(j.duration, horizon_s) * j.gpus
        largest[j.workload] = max(largest.get(j.workload, 0), j.nodes)
    warnings: list[str] = []
    present = [c for c in CLASSES if c in gpu_s]
    confined = [c for c in present if c in premium_only]
    if n_other and present and len(confined) == len(present):
        runs = "runs" if len(confined) == 1 else "run"
        there = f"{len(nodes) / n_prem:.3g}x the offered load" if n_prem else "all of it, and none can start"
        warnings.append(
            f"{n_other} of {len(nodes)} nodes ({other_name}) fit no job of this workload "
            f"({', '.join(confined)} {runs} on {premium_name} nodes only, the admin constraint): they stay "
            f"idle under every policy, and the {n_prem} {premium_name} nodes carry {there}"
        )
    for c in confined:
        if largest[c] > n_prem:
            warnings.append(
                f"{c} jobs of up to {largest[c]} nodes need {premium_name} nodes and the fleet has {n_prem}: "
                "the larger ones never start"
            )
    for c in present:
        cap = (n_prem if c in premium_only else len(nodes)) * gpus_per_node * horizon_s
        if cap and gpu_s[c] > cap:
            where = f"{n_prem} {premium_name}" if c in premium_only else f"{len(nodes)}"
            warnings.append(
                f"{c} alone offers more GPU-hours than the {where} nodes it may use: its queue grows all run"
            )
    return {
        "offered_load": offered_load(jobs, horizon_s, fleet_gpus),
        "jobs": len(jobs),
        "warnings": warnings,
    }
