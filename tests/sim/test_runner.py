"""Whole runs: determinism, the oracle as an upper bound, and useful work counted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_fleetyield.sim import faults as fm
from slurm_fleetyield.sim import report, runner

SMALL = dict(
    nodes=16,
    days=20,
    workload="synthetic",
    node_rate_per_1000_node_days=60.0,
    precursor_share=0.5,
    lead_h=24.0,
    control_interval_s=1800.0,
    premium_share=0.75,
    load=0.6,
)


def test_same_seed_same_json_bytes(tmp_path: Path) -> None:
    a = runner.main_simulate(
        tmp_path / "a",
        seeds=2,
        plots=False,
        policies=("baseline", "fleetyield", "oracle"),
        **{**SMALL, "days": 8},
    )
    b = runner.main_simulate(
        tmp_path / "b",
        seeds=2,
        plots=False,
        policies=("baseline", "fleetyield", "oracle"),
        **{**SMALL, "days": 8},
    )
    assert a == b
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()
    assert (tmp_path / "a" / "report.txt").read_text().startswith("SIMULATED")


def test_oracle_beats_fleetyield_beats_baseline_with_visible_precursors() -> None:
    results = runner.run_seeds(
        runner.make_config(**SMALL), list(range(6)), ("baseline", "fleetyield", "oracle")
    )
    rep = report.build(runner.make_config(**SMALL), results)
    net = {p: rep["policies"][p]["net_goodput_gpu_h"]["mean"] for p in ("baseline", "fleetyield", "oracle")}
    hits = {p: rep["policies"][p]["failures_hitting_jobs"]["mean"] for p in net}
    # The oracle bounds both. FleetYield >= baseline on net goodput is NOT asserted: it only held while the
    # runner counted every completed job twice (fixed with premium widening); with honest accounting this
    # 16-node synthetic fleet gives baseline 30,680 vs fleetyield 28,890 GPU-h (docs/simulator.md).
    assert net["oracle"] >= max(net["fleetyield"], net["baseline"]), net
    assert hits["oracle"] <= hits["fleetyield"] <= hits["baseline"], hits


def test_completed_work_is_counted_once() -> None:
    cfg = runner.make_config(**{**SMALL, "days": 4})
    sim = runner.Simulation(cfg, "baseline", runner.build_inputs(cfg))
    m = sim.run()
    expect = 0.0
    for js in sim.jobs.values():
        j = js.job
        if js.started is not None:
            expect += j.gpus * min(cfg.horizon_s - js.started + js.done, j.duration) / 3600
        else:
            expect += j.gpus * js.done / 3600
    assert abs(m["useful_gpu_h"] - expect) < 1e-6 * max(1.0, expect)


def test_unknown_policy_and_option_are_errors() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown simulation option"):
        runner.make_config(nodez=3)
    cfg = runner.make_config(nodes=4, days=1, workload="synthetic")
    with pytest.raises(ValueError, match="unknown policy"):
        runner.Simulation(cfg, "magic", runner.build_inputs(cfg))


def test_baseline_counts_repeats_as_the_fault_model_defines_them() -> None:
    """The runner's repeat share (faults on a DOWN node are no events; repaired GPUs return in place) is the
    one the lemon solve targets (faults.repeat_share on the plan), not the plan's raw per-GPU count."""
    cfg = runner.make_config(
        nodes=8, days=30, workload="synthetic", node_rate_per_1000_node_days=400.0, lemon_node_share=0.25
    )
    inputs = runner.build_inputs(cfg)
    m = runner.run_one(cfg, "baseline", inputs)
    want = fm.repeat_share(inputs.plan.faults, repair_s=cfg.repair_h * runner.HOUR)
    assert m["repeat_share"] == want > 0
    assert want != fm.repeat_share(inputs.plan.faults, repair_s=0.0)  # this seed has faults in repair windows


def test_repeats_are_per_physical_gpu() -> None:
    hist = [(0.0, "n0", 0, None), (10.0, "n0", 0, 5.0), (20.0, "n0", 0, 5.0), (30.0, "n0", 1, None)]
    assert runner._repeat_share(hist) == 0.25  # the swapped-in GPU (swap at 5.0) failed twice: one repeat


def test_a_swapped_lemon_leaves_a_gpu_with_the_base_hazard() -> None:
    cfg = runner.make_config(nodes=2, days=1, workload="synthetic")
    inputs = runner.build_inputs(cfg)
    lemon, plain = ("n0000", 0), ("n0001", 0)
    faults = tuple(
        fm.Fault(i, 100.0 + i, *key, "hbm3", 48, key == lemon) for i, key in enumerate([lemon, plain] * 1000)
    )
    plan = fm.FaultPlan(faults, (), frozenset({lemon}), 10.0, cfg.faults, cfg.horizon_s)
    kept = []
    for _ in range(2):
        sim = runner.Simulation(
            cfg, "baseline", runner.Inputs(inputs.nodes, inputs.premium, inputs.jobs, plan)
        )
        sim._swap("n0000", [lemon])
        sim._swap("n0001", [plain])
        kept.append({f.fault_id for f in faults if f.fault_id not in sim.cancelled})
    assert kept[0] == kept[1]  # the thinning is fixed by seed and fault id
    on_lemon = sum(faults[i].lemon for i in kept[0])
    assert 70 <= on_lemon <= 130  # 1,000 lemon faults kept at 1 / 10 (sd ~9.5)
    assert len(kept[0]) - on_lemon == 1000  # a plain GPU's unannounced faults all stay
    assert lemon not in sim.lemons


def test_a_swap_cancels_the_old_gpus_post_return_follow_ups() -> None:
    """A GPU swapped in is new: follow-ups of faults before the swap (and theirs, a chain) never happen; a
    fault of the new GPU and its own follow-ups stay. A follow-up of a cancelled fault is void at its time."""
    cfg = runner.make_config(nodes=2, days=1, workload="synthetic", post_return="titan")
    inputs = runner.build_inputs(cfg)
    h = runner.HOUR

    def f(i: int, t_h: float, node: str, parent: int | None) -> fm.Fault:
        return fm.Fault(i, t_h * h, node, 0, "hbm3", 48, False, None, parent)

    faults = (
        f(0, 10, "n0000", None),  # the old GPU's fault
        f(1, 30, "n0001", None),  # another node: cancelled below as if the oracle had absorbed it
        f(2, 100, "n0000", 0),  # follow-up of 0
        f(3, 150, "n0001", 1),  # follow-up of the cancelled 1
        f(4, 200, "n0000", 2),  # follow-up of a follow-up
        f(5, 300, "n0000", None),  # the new GPU's own fault
        f(6, 400, "n0000", 5),  # and its follow-up
    )
    plan = fm.FaultPlan(faults, (), frozenset(), 1.0, cfg.faults, cfg.horizon_s)
    sim = runner.Simulation(cfg, "baseline", runner.Inputs(inputs.nodes, inputs.premium, inputs.jobs, plan))
    sim.now = 50 * h
    sim.cancelled.add(1)
    sim._swap("n0000", [("n0000", 0)])
    assert sim.cancelled == {1, 2, 4}
    sim.now = 150 * h
    sim._fault(faults[3])
    assert sim.cancelled == {1, 2, 3, 4} and sim.m["fatal_faults"] == 0
    sim.now = 300 * h
    sim._fault(faults[5])
    assert sim.m["fatal_faults"] == 1


def test_post_return_titan_runs_are_deterministic_and_report_the_option(tmp_path: Path) -> None:
    kw = {**SMALL, "days": 8, "post_return": "titan"}
    pol = ("baseline", "fleetyield", "oracle")
    a = runner.main_simulate(tmp_path / "a", seeds=2, plots=False, policies=pol, **kw)
    runner.main_simulate(tmp_path / "b", seeds=2, plots=False, policies=pol, **kw)
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()
    assert a["config"]["faults"]["post_return"] == "titan"
    none = runner.main_simulate(tmp_path / "c", seeds=2, plots=False, policies=pol, **{**SMALL, "days": 8})
    assert "post_return" not in none["config"]["faults"]  # the default leaves reports as they were
    assert a["policies"]["baseline"] != none["policies"]["baseline"]


def test_a_job_whose_class_feature_no_node_carries_is_refused_not_queued() -> None:
    cfg = runner.make_config(**{**SMALL, "days": 3})
    sim = runner.Simulation(cfg, "fleetyield", runner.build_inputs(cfg))
    by_class: dict[str, Any] = {}
    for j in sim.inp.jobs:
        sim.jobs[j.job_id] = runner._JobState(j)
        by_class.setdefault(j.workload, j)
    finetune, batch = by_class["finetune"], by_class["batch"]
    sim._arrive(finetune.job_id)  # before the first tick (job_submit.lua not enabled yet): queued
    assert sim.m["refused_jobs"] == 0 and len(sim.queue) == 1
    sim._tick("first")
    for name, n in sim.slurm.nodes.items():  # no node carries fy_ok_finetune (the hole keep open fills)
        sim.slurm.set_features(name, tuple(f for f in n.features if f != "fy_ok_finetune"), n.weight)
    sim._arrive(batch.job_id)
    sim._arrive(finetune.job_id)
    assert sim.m["refused_jobs"] == 1 and sim.m["refused_gpu_h"] == finetune.gpu_hours
    assert {jid for _, jid in sim.queue} == {finetune.job_id, batch.job_id}  # queued before; batch pends
