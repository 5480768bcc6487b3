"""Hot spares in the simulator: Slurm's QOS preemption (REQUEUE) in SimSlurm, job_submit.lua's spare-aware
constraints in the runner, and the frontier run with and without spares."""

from __future__ import annotations

from slurm_fleetyield.core.plan import Plan, UpdateNodes
from slurm_fleetyield.sim import runner
from slurm_fleetyield.sim.cluster import SimSlurm

GANG = frozenset({"fy_ok_gang"})


def _cluster(requeued: list[int]) -> SimSlurm:
    s = SimSlurm([(f"n{i}", 8, "h100", ("h100",)) for i in range(3)], requeued.append)
    s.apply(Plan((UpdateNodes(("n0", "n1", "n2"), ("h100", "fy_ok_gang", "fy_ok_preempt"), 1),)))
    return s


def test_a_blocked_job_requeues_preemptible_jobs_and_starts_on_their_gpus() -> None:
    s = _cluster([])
    s.start(10, ("n0",), 8, 100.0, "pretrain")  # normal QOS: never a victim
    s.start(11, ("n1",), 2, 100.0, "batch", qos="fy_preemptible")
    s.start(12, ("n1",), 1, 100.0, "batch", qos="fy_preemptible")
    s.start(13, ("n2",), 4, 100.0, "batch", qos="fy_preemptible")
    assert s.schedule(0.0, [(1, GANG, 2, 8, 50.0)]) == []  # no node is free: the pass cannot start it
    got = s.preempt_for(GANG, 2, 8, "fy_preemptible")
    assert got == (("n1", "n2"), (11, 12, 13))  # n0's job is not preemptible
    assert s.preempt_for(GANG, 3, 8, "fy_preemptible") is None  # does not fit even so: nothing evicted
    assert s.preempt_for(GANG, 2, 8, "") is None  # no preemptible QOS: no preemption
    views = {v.job_id: v for v in s.read_jobs()}
    assert views[11].qos == "fy_preemptible" and views[10].qos == ""


def test_preemption_takes_free_nodes_first_then_the_fewest_victim_gpus() -> None:
    s = _cluster([])
    s.start(11, ("n0",), 4, 100.0, "batch", qos="fy_preemptible")
    s.start(12, ("n1",), 1, 100.0, "batch", qos="fy_preemptible")
    assert s.preempt_for(GANG, 1, 8, "fy_preemptible") == (("n2",), ())
    assert s.preempt_for(GANG, 2, 8, "fy_preemptible") == (("n1", "n2"), (12,))


def _frontier(policy: str, **kw: object) -> runner.Simulation:
    cfg = runner.make_config(
        workload="frontier", nodes=256, days=4, premium_share=1.0, background_load=0.9, **kw
    )
    return runner.Simulation(cfg, policy, runner.build_inputs(cfg))


def test_job_submit_mapping_with_spares_on_and_off() -> None:
    on, off = _frontier("fleetyield"), _frontier("fy_no_spares")
    assert on.params.spares.enabled and not off.params.spares.enabled
    gang = next(j for j in on.inp.jobs if j.workload == "pretrain")
    batch = next(j for j in on.inp.jobs if j.workload == "batch")
    tune = next(j for j in on.inp.jobs if j.workload == "finetune")
    assert "fy_ok_gang" in on._constraint(gang) and "fy_ok_train" not in on._constraint(gang)
    assert "fy_ok_preempt" in on._constraint(batch) and on._qos(batch) == "fy_preemptible"
    assert on._qos(tune) == "" and on._constraint(tune) == off._constraint(tune)
    assert off._constraint(gang) == off.constraint["pretrain"] and off._qos(batch) == ""


def test_spares_hold_nodes_preempt_batch_and_cut_the_gang_restart_wait() -> None:
    m_on, m_off = _frontier("fleetyield").run(), _frontier("fy_no_spares").run()
    assert m_off["spares_mean"] == 0 and m_off["preemptions"] == 0
    assert m_on["spares_mean"] > 0 and m_on["preemptions"] > 0
    assert m_on["gang_restarts"] > 0
    assert m_on["gang_restart_wait_mean_s"] < m_off["gang_restart_wait_mean_s"]


def test_the_baseline_is_unchanged_without_a_preemptible_qos() -> None:
    """No job of the preemptible QOS (the baseline; spares off): no preemption, the run as before it."""
    b = _frontier("baseline").run()
    assert b["preemptions"] == 0 and b["spares_mean"] == 0
    again = _frontier("baseline").run()
    assert b == again
    cfg = runner.make_config(workload="frontier", nodes=64, days=3, premium_share=1.0)
    assert "background_load" not in cfg.to_dict()  # the default: reports byte-identical to before
