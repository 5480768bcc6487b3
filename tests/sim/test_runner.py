"""Whole runs: determinism, and the ordering oracle >= fleetyield >= baseline where precursors are visible."""

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
    assert net["oracle"] >= net["fleetyield"] >= net["baseline"], net
    assert hits["oracle"] <= hits["fleetyield"] <= hits["baseline"], hits


def test_unknown_policy_and_option_are_errors() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown simulation option"):
        runner.make_config(nodez=3)
    cfg = runner.make_config(nodes=4, days=1, workload="synthetic")
    with pytest.raises(ValueError, match="unknown policy"):
        runner.Simulation(cfg, "magic", runner.build_inputs(cfg))
