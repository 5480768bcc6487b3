"""Report tables: net vs baseline as a percentage with its CI; the load that actually ran and the workload's
warnings in the header."""

from __future__ import annotations

from typing import Any

from slurm_fleetyield.sim import report, runner
from slurm_fleetyield.sim.report import SCALARS


def _metrics(net: float) -> dict[str, Any]:
    m: dict[str, Any] = dict.fromkeys(SCALARS, 0.0)
    m["net_goodput_gpu_h"] = net
    m["queue_delay_h"] = {"batch": 0.0}
    m["workload"] = {"offered_load": 0.5, "jobs": 10, "warnings": ["a warning"] if net >= 1000 else []}
    return m


def _rep() -> dict[str, Any]:
    # fleetyield +1% and +3% over the baseline on two seeds; the warning on one seed only
    results = {
        0: {"baseline": _metrics(1000.0), "fleetyield": _metrics(1010.0), "oracle": _metrics(1100.0)},
        1: {"baseline": _metrics(900.0), "fleetyield": _metrics(927.0), "oracle": _metrics(1000.0)},
    }
    return report.build(runner.make_config(nodes=8, days=1, workload="synthetic", load=0.7), results)


def test_run_table_shows_net_vs_baseline_in_percent_with_ci() -> None:
    text = report.table(_rep())
    row = next(line for line in text.splitlines() if line.startswith("fleetyield"))
    # mean 2%, t(0.975, 1) = 12.706: 2 +/- 12.706 x 1.414 / 1.414 = [-10.71, +14.71]
    assert "+2.00% [-10.71, +14.71]" in row


def test_sweep_table_shows_net_vs_baseline_in_percent_with_ci() -> None:
    text = report.sweep_table([(0.25, _rep())])
    row = next(line for line in text.splitlines() if "fleetyield" in line)
    assert "+2.00% [-10.71, +14.71]" in row


def test_header_says_what_load_ran_and_warns() -> None:
    rep = _rep()
    assert rep["workload"]["offered_load"]["mean"] == 0.5
    text = report.table(rep)
    head = text.splitlines()[0]
    assert "load 0.7 (offered 0.500 [0.5, 0.5], 10 jobs/seed)" in head
    assert "WARNING: a warning (on 1 of 2 seeds)" in text.splitlines()[1]
