"""What a job stream offers the fleet: the load that ran, and warnings for what of the fleet it cannot use."""

from __future__ import annotations

from slurm_fleetyield.sim import workload
from slurm_fleetyield.sim.traces import Job

NODES = tuple(f"n{i}" for i in range(8))
PREMIUM = frozenset(NODES[:4])
DAY = 86_400.0


def _facts(jobs: list[Job], premium: frozenset[str] = PREMIUM) -> dict:
    return workload.facts(jobs, NODES, premium, 8, DAY, {"pretrain"}, "h100", "l40s")


def test_an_all_pretrain_workload_warns_that_the_other_nodes_idle() -> None:
    jobs = [Job(i, 0.0, 3600.0, 2, 8, "pretrain", 3600.0) for i in range(1, 4)]
    f = _facts(jobs)
    assert f["jobs"] == 3
    assert f["offered_load"] == 3 * 16 * 3600.0 / (64 * DAY)
    assert f["warnings"] == [
        "4 of 8 nodes (l40s) fit no job of this workload (pretrain runs on h100 nodes only, the admin "
        "constraint): they stay idle under every policy, and the 4 h100 nodes carry 2x the offered load"
    ]


def test_a_mixed_workload_that_fits_warns_nothing() -> None:
    jobs = [Job(1, 0.0, 3600.0, 2, 8, "pretrain", 3600.0), Job(2, 0.0, 3600.0, 1, 8, "batch", 1800.0)]
    assert _facts(jobs)["warnings"] == []


def test_gangs_larger_than_the_premium_nodes_and_overload_are_warned() -> None:
    jobs = [
        Job(1, 0.0, DAY, 6, 8, "pretrain", 3600.0),  # 6 nodes > 4 h100 nodes; 1.5x their GPU-hours
        Job(2, 0.0, 3600.0, 1, 8, "batch", 1800.0),
    ]
    ws = _facts(jobs)["warnings"]
    assert (
        "pretrain jobs of up to 6 nodes need h100 nodes and the fleet has 4: the larger ones never start"
        in ws
    )
    assert (
        "pretrain alone offers more GPU-hours than the 4 h100 nodes it may use: its queue grows all run" in ws
    )
    assert not any("fit no job" in w for w in ws)  # batch uses the l40s nodes
