"""Scheduler rules of the simulated Slurm: scenario tables of nodes, jobs and expected placements."""

from __future__ import annotations

from slurm_fleetyield.core.plan import DrainNode, Plan, UpdateNodes
from slurm_fleetyield.sim.cluster import SimSlurm


def cluster(n: int = 4, requeued: list[int] | None = None) -> SimSlurm:
    sink = requeued if requeued is not None else []
    return SimSlurm([(f"n{i}", 8, "h100", ("h100",)) for i in range(n)], sink.append)


def test_constraint_filter_is_an_and_of_features() -> None:
    s = cluster()
    s.apply(
        Plan(
            (
                UpdateNodes(("n1",), ("h100", "fy_ok_train", "fy_ok_batch"), 1),
                UpdateNodes(("n2",), ("h100", "fy_ok_batch"), 1),
            )
        )
    )
    placed = s.schedule(0.0, [(1, frozenset({"fy_ok_train", "fy_ok_batch"}), 1, 8, 10.0)])
    assert placed == [(1, ("n1",))]
    assert s.schedule(0.0, [(2, frozenset({"fy_ok_decode"}), 1, 1, 10.0)]) == []


def test_lowest_weight_first_ties_by_name() -> None:
    s = cluster()
    s.apply(
        Plan(
            (
                UpdateNodes(("n0", "n1"), ("h100",), 100),
                UpdateNodes(("n3",), ("h100",), 10),
                UpdateNodes(("n2",), ("h100",), 10),
            )
        )
    )
    placed = s.schedule(0.0, [(1, frozenset(), 2, 8, 10.0), (2, frozenset(), 1, 8, 10.0)])
    assert placed == [(1, ("n2", "n3")), (2, ("n0",))]


def test_gang_is_all_or_nothing() -> None:
    s = cluster(3)
    s.start(99, ("n0",), 8, 100.0, "batch")
    placed = s.schedule(0.0, [(1, frozenset(), 3, 8, 10.0)])
    assert placed == []
    assert all(s.nodes[n].free == 8 for n in ("n1", "n2"))


def test_drained_and_down_nodes_get_nothing() -> None:
    s = cluster(3)
    s.set_drain("n0", "fleetyield: XID 79")
    s.set_down("n1", True)
    assert s.schedule(0.0, [(1, frozenset(), 1, 8, 10.0)]) == [(1, ("n2",))]
    assert s.read_nodes()["n0"].drained_by_us
    assert "DOWN" in s.read_nodes()["n1"].states


def test_drain_requeues_listed_jobs_and_backfill_respects_reservation() -> None:
    requeued: list[int] = []
    s = cluster(2, requeued)
    s.start(7, ("n0",), 8, 100.0, "pretrain")
    s.apply(Plan((DrainNode("n0", "fleetyield: approved", (7,), "approved"),)))
    assert requeued == [7]
    s2 = cluster(2)
    s2.start(5, ("n0",), 8, 50.0, "batch")
    # head gang needs both nodes: reserved from t=50; a long 1-node job may not take n1, a short one may
    q = [(1, frozenset(), 2, 8, 10.0), (2, frozenset(), 1, 8, 100.0), (3, frozenset(), 1, 8, 40.0)]
    assert s2.schedule(0.0, q) == [(3, ("n1",))]
