"""``fleetyield simulate run|sweep --json``: the report on stdout as JSON (what report.json holds), not the
table; a bad option value is a JSON error."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from slurm_fleetyield.sim.cli import simulate

SMALL = ["--nodes", "8", "--days", "1", "--seeds", "1", "--no-plots", "--workload", "synthetic"]


def test_run_json_is_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(simulate, ["run", *SMALL, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc == json.loads((out / "report.json").read_text())
    assert doc["config"]["days"] == 1.0
    text = CliRunner().invoke(simulate, ["run", *SMALL, "--out", str(out)])
    assert text.exit_code == 0 and not text.stdout.lstrip().startswith("{")


def test_sweep_json_is_sweep_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(simulate, ["sweep", *SMALL, "--shares", "0,0.5", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads((out / "sweep.json").read_text())
    assert set(json.loads(result.stdout)) == {"0", "0.5"}


def test_bad_workload_is_a_json_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    args = ["run", *SMALL[:-1], str(missing), "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 1 and result.stdout == ""
    assert str(missing) in json.loads(result.stderr)["error"]
