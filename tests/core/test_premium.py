"""Premium widening (core/premium.py) through ``tick``: decode borrows premium nodes only when stuck."""

from __future__ import annotations

from core.builders import H100, L40S, Fleet, Runner
from slurm_fleetyield.core.model import JobView, WorkloadClass
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.premium import _fit
from slurm_fleetyield.core.state import ControllerState

D, P = WorkloadClass.DECODE, WorkloadClass.PRETRAIN


def fleet(h: int = 4, l: int = 1) -> Fleet:  # noqa: E741
    f = Fleet(0)
    for i in range(h):
        f.add(f"h{i}", H100)
    for i in range(l):
        f.add(f"l{i}", L40S)
    return f


def busy(f: Fleet, node: str, job: int, gpus: int = 8, wl: WorkloadClass = D) -> None:
    f.jobs.append(JobView(job, "RUNNING", (node,), True, wl, gpus))
    f.slurm_update(node, states=frozenset({"ALLOCATED" if gpus >= 8 else "MIXED"}))


def pend(f: Fleet, job: int, gpus: int, wl: WorkloadClass = D) -> None:
    f.jobs.append(JobView(job, "PENDING", (), True, wl, gpus))


def lent(r: Runner) -> set[str]:
    assert r.last is not None
    return {n for n, d in r.last.nodes.items() if "fy_ok_decode" in d.fy_features and d.envelope.premium}


def run(f: Fleet, ticks: int, step: float = 120.0, params: Params | None = None) -> Runner:
    r = Runner(f, params, step=step)
    r.ticks(ticks)
    return r


def test_no_lending_while_decode_fits_on_nonpremium():
    f = fleet()
    pend(f, 1, 4)  # l0 is idle: fits, the next scheduling pass places it
    assert lent(run(f, 10)) == set()


def test_stuck_decode_borrows_one_premium_node_after_lend_after_s_and_keeps_a_reserve():
    f = fleet(h=4)
    busy(f, "l0", 100)
    for j in range(1, 30):
        pend(f, j, 8)  # far more than the premium nodes could hold
    r = Runner(f, step=120.0)
    r.tick()
    assert lent(r) == set()  # not yet: decode must wait lend_after_s (300 s)
    r.ticks(3)
    assert len(lent(r)) == 3  # 4 eligible, reserve max(1, ceil(0.4)) = 1
    assert "lent" in r.last.nodes[sorted(lent(r))[0]].reason
    assert any(e.kind == "premium_lend" for e in r.last.events) or r.state.premium.lent


def test_pending_premium_work_withdraws_at_once_and_lending_is_sticky():
    f = fleet(h=4)
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5)
    first = lent(r)
    assert len(first) == 1
    r.ticks(5)
    assert lent(r) == first  # sticky: same node tick after tick
    pend(f, 2, 16, P)
    r.tick()
    assert lent(r) == set()
    assert any(e.kind == "premium_return" for e in r.last.events)


def test_return_after_hysteresis_when_decode_stops_waiting():
    f = fleet(h=4)
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5)
    assert len(lent(r)) == 1
    f.jobs = [j for j in f.jobs if j.state != "PENDING"]
    r.tick()
    assert len(lent(r)) == 1  # within hysteresis_s (1800 s)
    r.ticks(16)
    assert lent(r) == set()


def test_reserve_covers_largest_gang_seen():
    f = fleet(h=4)
    busy(f, "l0", 100)
    f.jobs.append(JobView(50, "RUNNING", ("h0", "h1", "h2"), True, P, 24))
    for n in ("h0", "h1", "h2"):
        f.slurm_update(n, states=frozenset({"ALLOCATED"}))
    for j in range(1, 10):
        pend(f, j, 8)
    r = run(f, 5)
    assert lent(r) == {"h3"}  # 4 eligible - reserve 3 (the running 3-node gang) = 1
    f.jobs = [j for j in f.jobs if j.job_id != 50]
    for n in ("h0", "h1", "h2"):
        f.slurm_update(n, states=frozenset({"IDLE"}))
    r.ticks(3)
    assert lent(r) == {"h3"}  # the gang is remembered (gang_memory_s): three nodes stay unlent
    assert r.state.premium.gang_nodes == 3


def test_disabled_is_the_old_wall():
    f = fleet()
    busy(f, "l0", 100)
    pend(f, 1, 8)
    assert lent(run(f, 10, params=Params(premium={"enabled": False}))) == set()


def test_state_round_trip_and_old_states_load():
    f = fleet()
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5)
    d = r.state.to_dict()
    assert ControllerState.from_dict(d) == r.state
    d.pop("premium")
    assert ControllerState.from_dict(d).premium.lent == ()


def test_best_fit():
    assert _fit([8, 4, 4], [8, 4]) == [4]
    assert _fit([2, 2, 2], [3, 3]) == [2]
    assert _fit([1], []) == [1]
