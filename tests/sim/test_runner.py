"""Whole runs: determinism, the oracle as an upper bound, and useful work counted once."""

from __future__ import annotations

from pathlib import Path

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
