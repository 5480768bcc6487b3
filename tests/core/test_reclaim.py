"""Premium reclaim (core/reclaim.py) through ``tick``: batch leaves the H100 a pending premium job needs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.builders import Fleet, Runner, mixed_fleet
from core.builders import tier_params as Params  # the tier rule's mechanisms (builders.TIER_RULE)
from slurm_fleetyield.core.model import JobView, WorkloadClass
from slurm_fleetyield.core.plan import RequeueJobs
from slurm_fleetyield.core.reclaim import _fewest
from slurm_fleetyield.core.state import ControllerState

B, D, P, F = WorkloadClass.BATCH, WorkloadClass.DECODE, WorkloadClass.PRETRAIN, WorkloadClass.FINETUNE
FAST = {"reclaim": {"after_s": 75.0}}  # ticks every 30 s: the 4th tick (90 s) acts


pytestmark = pytest.mark.usefixtures("tier_rule")  # Runner() runs builders.TIER_RULE


def fleet(h: int = 2, l: int = 1) -> Fleet:  # noqa: E741
    return mixed_fleet(h, l)


def run_on(f: Fleet, node: str, job: int, gpus: int, wl: WorkloadClass = B, requeue: bool = True) -> None:
    f.jobs.append(JobView(job, "RUNNING", (node,), requeue, wl, gpus))
    used = sum(j.gpus for j in f.jobs if j.state == "RUNNING" and node in j.nodes)
    f.slurm_update(node, states=frozenset({"ALLOCATED" if used >= 8 else "MIXED"}))


def pend(f: Fleet, job: int, gpus: int, wl: WorkloadClass = P) -> None:
    f.jobs.append(JobView(job, "PENDING", (), True, wl, gpus))


def requeues(r: Runner) -> list[RequeueJobs]:
    assert r.last is not None
    return [a for a in r.last.plan.actions if isinstance(a, RequeueJobs)]


def runner(f: Fleet, **over: object) -> Runner:
    return Runner(f, Params(reclaim={**FAST["reclaim"], **over}), step=30.0)


def test_batch_on_the_h100_is_requeued_for_a_blocked_premium_job_after_the_wait_and_the_node_walled():
    f = fleet()
    run_on(f, "h0", 11, 4)
    run_on(f, "h0", 12, 4)
    run_on(f, "h1", 13, 8, D, requeue=False)  # decode: never requeued
    pend(f, 20, 8)
    r = runner(f)
    r.ticks(2)  # 30 s blocked: within after_s
    assert requeues(r) == []
    assert r.state.reclaim.blocked == ((20, r.now - 30.0),)
    r.ticks(2)  # 90 s blocked
    (a,) = requeues(r)
    assert (a.node, a.jobs, a.for_job) == ("h0", (11, 12), 20)
    assert "pretrain job 20" in a.reason and "batch job(s) 11, 12" in a.reason
    d = r.last.nodes["h0"]
    assert "fy_ok_batch" not in d.fy_features and "fy_ok_train" in d.fy_features
    assert "reclaimed for pending premium job 20" in d.reason
    assert "fy_ok_batch" in r.last.nodes["h1"].fy_features  # only the reclaimed node is walled
    kinds = [a.kind for a in r.last.plan.actions]
    assert kinds.index("update") < kinds.index("requeue")  # the wall is in Slurm before the job leaves
    (ev,) = [e for e in r.last.events if e.kind == "reclaim"]
    assert ev.node == "h0" and ev.data == {"jobs": [11, 12], "for_job": 20}  # what the A/B ledger reads
    # Slurm requeued them: pending, the premium job starts on h0; the wall lifts
    f.jobs = [replace(j, state="PENDING", nodes=()) if j.job_id in (11, 12) else j for j in f.jobs]
    f.slurm_update("h0", states=frozenset({"IDLE"}))
    r.tick()
    assert requeues(r) == [] and "fy_ok_batch" not in r.last.nodes["h0"].fy_features  # job 20 still pends
    f.jobs = [replace(j, state="RUNNING", nodes=("h0",)) if j.job_id == 20 else j for j in f.jobs]
    f.slurm_update("h0", states=frozenset({"ALLOCATED"}))
    r.tick()
    assert "fy_ok_batch" in r.last.nodes["h0"].fy_features
    assert any(e.kind == "reclaim_wall_lifted" and e.node == "h0" for e in r.last.events)
    assert r.state.reclaim.walls == () and [j for j, _ in r.state.reclaim.requeued] == [11, 12]


def test_the_fewest_gpus_are_requeued_then_the_fewest_and_youngest_jobs():
    f = fleet(h=1)
    run_on(f, "h0", 1, 4)
    run_on(f, "h0", 2, 2)
    run_on(f, "h0", 3, 1)  # 1 GPU idle; a 4-GPU job needs 3 more: {2, 3} frees 3, {1} frees 4
    pend(f, 9, 4, F)
    r = runner(f)
    r.ticks(4)
    (a,) = requeues(r)
    assert a.jobs == (2, 3)
    jobs = [JobView(i, "RUNNING", ("h0",), True, B, g) for i, g in ((1, 2), (2, 2), (3, 4))]
    assert [j.job_id for j in _fewest(2, jobs) or ()] == [2]  # equal GPUs and count: the youngest
    assert _fewest(0, jobs) == () and _fewest(9, jobs) is None


def test_nothing_is_requeued_that_must_not_be_or_would_not_help():
    f = fleet(h=1)
    run_on(f, "h0", 1, 4, requeue=False)  # batch submitted --no-requeue
    run_on(f, "h0", 2, 4, D, requeue=False)
    f.jobs.append(JobView(3, "RUNNING", ("h0", "l0"), True, B, 8))  # multi-node batch: left alone
    pend(f, 9, 8)
    r = runner(f)
    r.ticks(6)
    assert requeues(r) == [] and r.state.reclaim.blocked == ()
    g = fleet(h=1)
    run_on(g, "h0", 1, 4)
    pend(g, 9, 4)  # fits the 4 idle H100 GPUs: Slurm's next pass starts it
    r = runner(g)
    r.ticks(6)
    assert requeues(r) == [] and r.state.reclaim.blocked == ()
    h = fleet(h=1, l=1)
    run_on(h, "l0", 1, 8)  # batch on the L40S is no premium GPU: nothing to reclaim
    run_on(h, "h0", 2, 8, P)
    pend(h, 9, 8)
    r = runner(h)
    r.ticks(6)
    assert requeues(r) == []


def test_the_storm_cap_and_the_job_cooldown():
    f = fleet(h=1)
    run_on(f, "h0", 1, 4)
    run_on(f, "h0", 2, 4)
    pend(f, 9, 8)
    r = runner(f, max_jobs_per_tick=1)  # the job needs two requeues: it waits
    r.ticks(6)
    assert requeues(r) == [] and r.state.reclaim.blocked
    r = runner(f)
    r.ticks(4)
    assert len(requeues(r)) == 1
    # the job ended elsewhere (premium job 9 is gone) and batch job 1 came back onto h0 within the cooldown
    f.jobs = [j for j in f.jobs if j.job_id in (1, 2)]
    pend(f, 10, 8)
    r.ticks(4)
    assert requeues(r) == [] and r.state.reclaim.blocked == ()


def test_a_gang_reclaims_whole_nodes_or_nothing():
    f = fleet(h=3, l=0)
    run_on(f, "h0", 1, 8)
    run_on(f, "h1", 2, 8)
    pend(f, 9, 16)  # 2 whole nodes: h2 is idle, one of h0/h1 must be freed: the youngest job's
    r = runner(f)
    r.ticks(4)
    (a,) = requeues(r)
    assert (a.node, a.jobs) == ("h1", (2,))
    g = fleet(h=3, l=0)
    run_on(g, "h0", 1, 8)
    run_on(g, "h1", 2, 4, D, requeue=False)
    run_on(g, "h2", 3, 8, D, requeue=False)
    pend(g, 9, 16)  # only h0 can be freed: a 2-node gang still would not start
    r = runner(g)
    r.ticks(4)
    assert requeues(r) == [] and r.state.reclaim.blocked == ()


def test_off_and_a_wall_that_expires():
    f = fleet(h=1)
    run_on(f, "h0", 1, 8)
    pend(f, 9, 8)
    r = Runner(f, Params(reclaim={"enabled": False}), step=30.0)
    r.ticks(40)
    assert requeues(r) == [] and r.state.reclaim == type(r.state.reclaim)()
    r = runner(f, wall_s=120.0)
    r.ticks(4)
    assert requeues(r)
    r.ticks(4)  # job 9 still pending (held back by something else): the wall ends after wall_s
    assert "fy_ok_batch" in r.last.nodes["h0"].fy_features


def test_reclaim_memory_survives_a_restart():
    f = fleet(h=1)
    run_on(f, "h0", 1, 8)
    pend(f, 9, 8)
    r = runner(f)
    r.ticks(4)
    assert r.state.reclaim.walls and r.state.reclaim.requeued
    restored = ControllerState.from_dict(r.state.to_dict())
    assert restored.reclaim == r.state.reclaim and restored == r.state
    old = r.state.to_dict()
    del old["reclaim"]  # a state written before premium reclaim
    assert ControllerState.from_dict(old).reclaim == type(r.state.reclaim)()


def test_the_first_job_in_line_holds_it():
    f = fleet(h=2, l=0)
    run_on(f, "h0", 1, 8)
    run_on(f, "h1", 2, 8, D, requeue=False)
    pend(f, 8, 16)  # older: a 2-node gang no requeue can start (h1 runs decode); its reservation holds h0
    pend(f, 9, 8)
    r = runner(f)
    r.ticks(6)
    assert requeues(r) == [] and r.state.reclaim.blocked == ()
    g = fleet(h=1, l=1)
    run_on(g, "h0", 1, 8)
    pend(g, 5, 8, B)  # an older pending batch job: job 9 is second in Slurm's queue
    pend(g, 9, 8)
    r = runner(g, queue_depth=1)  # Slurm tests only the first job: freed GPUs would not reach job 9
    r.ticks(6)
    assert requeues(r) == []
    r = runner(g, queue_depth=2)
    r.ticks(4)
    assert requeues(r)


def test_one_reclaim_per_premium_job_within_the_cooldown():
    f = fleet(h=1)
    run_on(f, "h0", 1, 8)
    pend(f, 9, 8)
    r = runner(f)
    r.ticks(4)
    assert len(requeues(r)) == 1 and r.state.reclaim.served == ((9, r.now),)
    # job 9 did not start (something else holds it) and another batch job took h0 once the wall expired
    f.jobs = [j for j in f.jobs if j.job_id != 1]
    run_on(f, "h0", 3, 8)
    r.ticks(8)
    assert requeues(r) == [] and r.state.reclaim.blocked == ()


def test_the_wall_holds_while_requeued_batch_pends_and_premium_work_waits():
    """Live A/B seed 5: the premium job on a reclaimed node ended and the batch reclaim had requeued (older,
    so first in Slurm's queue) took the node back while the next premium job pended."""
    f = fleet(h=2, l=0)
    run_on(f, "h0", 1, 8)
    run_on(f, "h1", 2, 8, D, requeue=False)
    pend(f, 9, 8)
    r = runner(f)
    r.ticks(4)
    (a,) = requeues(r)
    assert a.jobs == (1,)
    f.jobs = [replace(j, state="PENDING", nodes=()) if j.job_id == 1 else j for j in f.jobs]
    f.jobs = [replace(j, state="RUNNING", nodes=("h0",)) if j.job_id == 9 else j for j in f.jobs]
    pend(f, 10, 8)  # the next premium job: h0 and h1 busy
    r.tick()
    d = r.last.nodes["h0"]
    assert "fy_ok_batch" not in d.fy_features and "batch it requeued still pends" in d.reason
    f.jobs = [j for j in f.jobs if j.job_id != 9]
    f.jobs = [replace(j, state="RUNNING", nodes=("h0",)) if j.job_id == 10 else j for j in f.jobs]
    r.tick()  # job 10 took h0 when job 9 ended: no premium work waits, the wall lifts though batch 1 pends
    assert "fy_ok_batch" in r.last.nodes["h0"].fy_features and r.state.reclaim.walls == ()


def test_decode_stays_submittable_when_the_keep_open_loan_would_sit_on_a_walled_node():
    """Live A/B at 9777272, seed 2: both L40S out, premium widening's keep-open loan (rule 6) went to the H100
    reclaim had walled, the wall stripped it, no node carried fy_ok_decode and sbatch refused a decode job."""

    def decode_on(r: Runner) -> set[str]:
        assert r.last is not None
        return {n for n, d in r.last.nodes.items() if "fy_ok_decode" in d.fy_features}

    f = fleet(h=3, l=1)
    f.drain_by_admin("l0")  # no non-premium decode home
    f.drain_by_admin("h2")
    run_on(f, "h0", 1, 8)
    run_on(f, "h1", 2, 8, P)
    pend(f, 9, 8)
    r = runner(f)
    r.ticks(4)
    assert requeues(r) and "fy_ok_batch" not in r.last.nodes["h0"].fy_features
    assert decode_on(r) == {"h1"}  # the open loan avoids the walled node
    g = fleet(h=2, l=1)
    g.drain_by_admin("l0")
    run_on(g, "h0", 1, 8)
    pend(g, 8, 8)  # fits the idle h1: claims it
    pend(g, 9, 8)  # blocked: h0 is reclaimed for it
    r = runner(g)
    r.ticks(4)
    assert requeues(r) and r.state.reclaim.walls[0][:2] == ("h0", 9)
    assert decode_on(r) == {"h0"}  # the last resort: a walled node, rather than no decode feature at all
