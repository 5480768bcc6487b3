"""The simulator shows the core its queue (premium widening reads it); gap_closed is reported honestly."""

from __future__ import annotations

import math

from slurm_fleetyield.core.model import WorkloadClass
from slurm_fleetyield.sim import report, runner
from slurm_fleetyield.sim.cluster import SimSlurm


def test_read_jobs_reports_whole_job_gpus_and_the_pending_queue():
    s = SimSlurm([("a", 8, "h100", ()), ("b", 8, "h100", ())])
    s.start(1, ("a", "b"), 8, 100.0, "pretrain")
    s.pending = lambda: ()
    (job,) = s.read_jobs()
    assert job.gpus == 16 and job.nodes == ("a", "b")
    cfg = runner.make_config(nodes=4, days=1, workload="synthetic")
    sim = runner.Simulation(cfg, "fleetyield", runner.build_inputs(cfg))
    sim.queue = [(0.0, j.job_id) for j in sim.inp.jobs[:3]]
    for j in sim.inp.jobs[:3]:
        sim.jobs[j.job_id] = runner._JobState(j)
    views = [v for v in sim.slurm.read_jobs() if v.state == "PENDING"]
    assert [v.job_id for v in views] == [j.job_id for j in sim.inp.jobs[:3]]
    assert all(isinstance(v.workload, WorkloadClass) and v.gpus > 0 for v in views)


def test_no_widening_policy_turns_premium_widening_off():
    assert runner.policy_params("fy_no_widening").premium.enabled is False
    assert runner.policy_params("fleetyield").premium.enabled is True
    assert "fy_no_widening" in runner.POLICIES


def _m(net: float) -> dict:
    return {k: 0.0 for k in report.SCALARS} | {"net_goodput_gpu_h": net, "queue_delay_h": {"decode": 0.0}}


def test_gap_closed_is_na_with_a_reason_when_oracle_is_about_baseline():
    cfg = runner.make_config(nodes=4, days=1, workload="synthetic")
    tiny = {s: {"baseline": _m(1000.0), "fleetyield": _m(990.0), "oracle": _m(1000.1)} for s in range(4)}
    rep = report.build(cfg, tiny)
    gc = rep["policies"]["fleetyield"]["gap_closed"]
    assert gc["mean"] is None and "no headroom" in gc["na_reason"] and gc["undefined_seeds"] == 4
    assert "n/a" in report.table(rep)
    real = {s: {"baseline": _m(1000.0), "fleetyield": _m(1050.0), "oracle": _m(1100.0)} for s in range(4)}
    gc = report.build(cfg, real)["policies"]["fleetyield"]["gap_closed"]
    assert math.isclose(gc["mean"], 0.5) and "na_reason" not in gc
    assert math.isclose(report.build(cfg, real)["policies"]["fleetyield"]["net_vs_baseline"]["mean"], 0.05)
