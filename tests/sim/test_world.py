"""The simulated world after a fatal fault (sim/runner.py, "Fatal faults"): hangs until the collective
timeout, NHC's periodic drain, fast requeue by FleetYield's quarantine, restart cost, checkpoint writes,
ETTR, and the frontier workload."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from slurm_fleetyield.sim import cli as sim_cli
from slurm_fleetyield.sim import faults as fm
from slurm_fleetyield.sim import runner, traces

H = 3600.0


def _sim(policy: str, jobs: list[traces.Job], faults: list[fm.Fault], nodes: int = 4, **kw: object):
    cfg = runner.make_config(nodes=nodes, days=1, workload="synthetic", premium_share=1.0, **kw)
    names = tuple(f"n{i:04d}" for i in range(nodes))
    plan = fm.FaultPlan(tuple(faults), (), frozenset(), 1.0, cfg.faults, cfg.horizon_s)
    sim = runner.Simulation(cfg, policy, runner.Inputs(names, frozenset(names), tuple(jobs), plan))
    return sim, sim.run()


def _gang(nodes: int = 2, hours: float = 10.0, ckpt: float | None = 3600.0, gpn: int = 8) -> traces.Job:
    return traces.Job(1, 0.0, hours * H, nodes, gpn, "pretrain", ckpt)


def _fault(t: float, node: str = "n0000", xid: int = 48) -> fm.Fault:
    return fm.Fault(0, t, node, 0, "hbm3", xid, False)


def test_a_gang_on_a_dead_gpu_hangs_until_the_collective_timeout_unless_fleetyield_requeues_it() -> None:
    """Same job, same fault: the baseline's gang holds its 16 GPUs for the timeout without progress; under
    FleetYield the pushed XID drains the node and requeues the gang in the same tick. Both pay one restart."""
    jobs, faults = [_gang()], [_fault(2.5 * H)]
    base_sim, base = _sim("baseline", jobs, faults, collective_timeout_s=600.0, restart_s=300.0)
    fy_sim, fy = _sim("fleetyield", jobs, faults, collective_timeout_s=600.0, restart_s=300.0)
    assert base["failures_hitting_jobs"] == fy["failures_hitting_jobs"] == 1
    restart = 16 * 300.0 / H
    assert fy["stalled_gpu_h"] == pytest.approx(restart)
    assert base["stalled_gpu_h"] == pytest.approx(restart + 16 * 600.0 / H)
    # the node that failed came back from its repair under neither within the day; the job finished on others
    assert base["jobs_completed"] == fy["jobs_completed"] == 1
    assert base_sim.jobs[1].ended == pytest.approx(fy_sim.jobs[1].ended + 600.0)
    assert base["net_goodput_gpu_h"] < fy["net_goodput_gpu_h"]


def test_a_one_gpu_job_fails_at_once() -> None:
    """No hang for a 1-GPU job; it fails at once -- and again at every scheduling pass that puts it back on
    the dead node (Slurm's first node by weight and name) until NHC's run 300 s later drains it."""
    job = traces.Job(1, 0.0, 5 * H, 1, 1, "batch", 1800.0)
    _, base = _sim("baseline", [job], [_fault(2 * H)], collective_timeout_s=600.0, restart_s=0.0)
    assert base["stalled_gpu_h"] == 0.0
    assert 1 < base["failures_hitting_jobs"] <= 1 + 300 / 60  # one per 60 s pass until the check
    assert base["jobs_completed"] == 1


def test_nhc_drains_at_its_next_run_and_until_then_slurm_places_the_requeued_job_on_the_dead_node() -> None:
    """One node: the gang fails after a 60 s timeout, is requeued, and lands on the same dead node (Slurm
    does not know) until NHC's run at the next 1,200 s mark drains it; then the node is repaired."""
    job = traces.Job(1, 0.0, 10 * H, 1, 8, "finetune", 3600.0)
    sim, m = _sim(
        "baseline",
        [job],
        [_fault(2 * H + 10.0)],
        nodes=1,
        collective_timeout_s=60.0,
        health_check_interval_s=1200.0,
        restart_s=0.0,
    )
    assert m["failures_hitting_jobs"] >= 3  # the fault itself, then placements on the dead node
    assert m["stalled_gpu_h"] == pytest.approx(m["failures_hitting_jobs"] * 8 * 60.0 / H)
    assert "n0000" in sim.repairing and "n0000" not in sim.broken


def test_nhc_drains_the_dead_node_under_fleetyield_too_when_its_drain_was_held() -> None:
    """NHC runs under every policy: a dead node whose drain FleetYield's safety rules hold (here the drain
    rate: 0 new drains per window) is still taken out at NHC's next run, and the gang hangs meanwhile."""
    held = '{"quarantine": {"max_new_drains_per_window": 0}}'
    sim, m = _sim("fleetyield", [_gang()], [_fault(2 * H + 10.0)], core=held, health_check_interval_s=600.0)
    assert not sim.broken and "n0000" in sim.repairing
    assert sim.slurm.nodes["n0000"].reason.startswith("nhc:")
    assert m["stalled_gpu_h"] == pytest.approx(16 * (600.0 + 300.0) / H)  # the hang, then one restart
    _, fast = _sim("fleetyield", [_gang()], [_fault(2 * H + 10.0)], health_check_interval_s=600.0)
    assert fast["stalled_gpu_h"] == pytest.approx(16 * 300.0 / H)


def test_restart_cost_and_checkpoint_writes_stretch_the_run() -> None:
    job = traces.Job(1, 0.0, 9 * H, 1, 8, "finetune", 900.0, False, 100.0)  # 10% of the time writing
    sim, m = _sim("baseline", [job], [], nodes=1)
    js = sim.jobs[1]
    assert js.ended == pytest.approx(js.first_start + 10 * H)
    assert m["jobs_completed"] == 1 and m["stalled_gpu_h"] == 0.0
    # ETTR: 9 h of work in 10 h of wall clock
    assert runner._ettr_of([js], sim.horizon) == pytest.approx(0.9)


def test_ettr_counts_lost_progress_hangs_restarts_and_waits() -> None:
    jobs, faults = [_gang(hours=30.0)], [_fault(2.5 * H)]
    sim, m = _sim("baseline", jobs, faults, collective_timeout_s=600.0, restart_s=300.0)
    js = sim.jobs[1]
    wall = sim.horizon - js.first_start
    assert m["ettr"] == pytest.approx(js.progress(sim.horizon) / wall)
    assert m["ettr"] < 1.0 - (600.0 + 300.0) / wall  # at least the hang and the restart are not productive
    assert math.isnan(runner._ettr_of([], 1.0))


def test_frontier_workload_is_one_gang_over_15_16_of_the_fleet_and_small_jobs() -> None:
    cfg = runner.make_config(nodes=64, days=2, workload="frontier", premium_share=1.0)
    jobs = runner.build_inputs(cfg).jobs
    gangs = [j for j in jobs if j.workload == "pretrain"]
    assert len(gangs) == 1 and gangs[0].nodes == 60 and gangs[0].submit == 0.0
    assert gangs[0].duration > cfg.horizon_s and gangs[0].ckpt_write_s > 0
    small = [j for j in jobs if j.workload != "pretrain"]
    assert small and all(j.nodes == 1 for j in small)
    offered = sum(j.gpu_hours for j in small)
    assert 0.3 < offered / (4 * 8 * 48) < 0.7  # ~background_load of the 4 non-gang nodes' GPU-hours


def test_frontier_defaults_to_a_2048_node_all_h100_fleet_on_the_command_line() -> None:
    run, kw = sim_cli._split(
        {
            "seeds": 1,
            "first_seed": 0,
            "workers": 1,
            "out_dir": "x",
            "no_plots": True,
            "policies": None,
            "as_json": False,
            "workload": "frontier",
            "nodes": None,
            "premium_share": None,
        }
    )
    assert kw["nodes"] == 2048 and kw["premium_share"] == 1.0
    assert run["policies"] == ("baseline", "fleetyield", "oracle")  # not every ablation at 2,048 nodes
    run2, kw = sim_cli._split(
        {
            **dict.fromkeys(run),
            "policies": None,
            "workload": "openb",
            "nodes": None,
            "premium_share": None,
        }
    )
    assert kw["nodes"] == 64 and kw["premium_share"] == 0.5 and run2["policies"] == runner.POLICIES


@pytest.mark.parametrize("opt", ["--health-check-interval=0", "--collective-timeout=-1", "--restart-s=nan"])
def test_world_options_out_of_range_are_errors(opt: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(
        sim_cli.simulate,
        [
            "run",
            "--nodes",
            "2",
            "--days",
            "1",
            "--seeds",
            "1",
            "--workload",
            "synthetic",
            "--no-plots",
            "--policies",
            "baseline",
            "--out",
            str(tmp_path),
            opt,
        ],
    )
    assert r.exit_code != 0 and opt.split("=")[0].lstrip("-").replace("-", "_")[:8] in r.output


def _started(job: traces.Job, nodes: int = 2) -> runner.Simulation:
    cfg = runner.make_config(nodes=nodes, days=1, workload="synthetic", premium_share=1.0)
    names = tuple(f"n{i:04d}" for i in range(nodes))
    plan = fm.FaultPlan((), (), frozenset(), 1.0, cfg.faults, cfg.horizon_s)
    sim = runner.Simulation(cfg, "baseline", runner.Inputs(names, frozenset(names), (job,), plan))
    sim.jobs[job.job_id] = runner._JobState(job)
    sim.horizon = cfg.horizon_s
    sim._enqueue(sim.jobs[job.job_id])
    sim._sched()
    assert sim.jobs[job.job_id].started == 0.0
    return sim


def test_usr1_checkpoints_now_and_requeues_usr2_checkpoints_and_keeps_running() -> None:
    job = traces.Job(1, 0.0, 10 * H, 1, 8, "pretrain", 3600.0, False, 30.0)
    sim = _started(job)
    sim.now = 2.5 * H
    sim._signal(1, "USR1")
    js = sim.jobs[1]
    rate = 3600.0 / 3630.0
    assert js.started is None and js.done == pytest.approx(2.5 * H * rate)  # nothing lost to the requeue
    assert sim.m["stalled_gpu_h"] == pytest.approx(8 * 30.0 / H)  # the write
    sim = _started(job)
    sim.now = 2.5 * H
    sim._signal(1, "USR2")
    js = sim.jobs[1]
    assert js.started == 0.0 and js.saved == pytest.approx(2.5 * H * rate)
    sim.now = 2.75 * H
    sim._interrupt(1)  # a fault later keeps the signalled checkpoint, not the periodic one at 2 h
    assert js.done == pytest.approx(2.5 * H * rate)
    sim = _started(job)
    sim.now = 2.75 * H
    sim._interrupt(1)
    assert js.done > sim.jobs[1].done == pytest.approx(2 * H)  # without the signal: the last periodic one


def _quiet(t: float, node: str = "n0000") -> fm.Fault:
    return fm.Fault(0, t, node, 0, "sdc", None, False)


@pytest.mark.parametrize(
    ("job", "service_loss", "redo_s"),
    [
        (traces.Job(1, 0.0, 10 * H, 1, 8, "pretrain", 3600.0), "inflight", 3600.0),  # one checkpoint interval
        (traces.Job(1, 0.0, 10 * H, 1, 8, "finetune", None), "inflight", 2 * H),  # no checkpoint: all of it
        (traces.Job(1, 0.0, 10 * H, 1, 8, "decode", None), "inflight", runner.SERVICE_INFLIGHT_S),
        (traces.Job(1, 0.0, 10 * H, 1, 8, "decode", None), "run", 2 * H),  # the earlier assumption
    ],
)
def test_a_quiet_corruption_costs_what_an_interruption_would_have_kept(
    job: traces.Job, service_loss: str, redo_s: float
) -> None:
    """A silent corruption 2 h into the run: a checkpointing job redoes one interval, a job that cannot
    checkpoint its whole run, and an inference service (``service_loss="inflight"``) only the requests in
    flight -- what it served before is served, as when it is interrupted."""
    _, m = _sim("baseline", [job], [_quiet(2 * H)], restart_s=0.0, service_loss=service_loss)
    clean, _ = _sim("baseline", [job], [], restart_s=0.0, service_loss=service_loss)
    started = clean.jobs[1].ended - job.duration  # its first scheduling pass, seconds in
    assert 0.0 <= started <= clean.cfg.sched_interval_s
    assert m["quiet_faults"] == 1 and m["failures_hitting_jobs"] == 1
    assert m["wasted_gpu_h"] == pytest.approx(8 * min(redo_s, 2 * H - started) / H)
    assert m["jobs_completed"] == 1
