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


def test_a_sweep_reuses_bare_runs_only_where_a_fresh_run_agrees(tmp_path: Path) -> None:
    """The sweep simulates unmodified Slurm at the first share only (runner.main_sweep): every report of
    the sweep equals a fresh ``run`` at that share, unmodified Slurm's rows included."""
    fleet = ["--nodes", "16", "--days", "10", "--seeds", "1", "--no-plots", "--workload", "synthetic",
             "--node-rate", "100", "--policies", "baseline,fleetyield"]  # fmt: skip
    sweep = CliRunner().invoke(simulate, ["sweep", *fleet, "--shares", "0,1", "--out", str(tmp_path / "s")])
    assert sweep.exit_code == 0, sweep.output
    fy = []
    for share in ("0", "1"):
        out = tmp_path / f"r{share}"
        run = CliRunner().invoke(simulate, ["run", *fleet, "--precursor-share", share, "--out", str(out)])
        assert run.exit_code == 0, run.output
        fresh = json.loads((out / "report.json").read_text())
        swept = json.loads((tmp_path / "s" / f"precursor_{share}" / "report.json").read_text())
        assert swept["per_seed"] == fresh["per_seed"] and swept["policies"] == fresh["policies"]
        assert swept["config"]["faults"]["precursor_share"] == float(share)
        fy.append(fresh["per_seed"]["0"]["fleetyield"])
    assert fy[0] != fy[1]  # FleetYield sees the precursors: its runs are not reused across shares


def test_bad_workload_is_a_json_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    args = ["run", *SMALL[:-1], str(missing), "--out", str(tmp_path), "--json"]
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 1 and result.stdout == ""
    assert str(missing) in json.loads(result.stderr)["error"]


HEADER = "job_id,submit_s,duration_s,nodes,gpus_per_node,workload,checkpoint_s\n"


def _pretrain_trace(path: Path, n: int = 60) -> Path:
    path.write_text(
        HEADER
        + "".join(f"{100 + i},{i * 3600.0},{4 * 3600.0 + 97 * i},2,8,pretrain,3600\n" for i in range(n))
    )
    return path


def test_run_prints_the_load_that_ran_and_warns_of_idle_nodes(tmp_path: Path) -> None:
    trace = _pretrain_trace(tmp_path / "pretrain.csv")
    base = ["run", "--nodes", "8", "--days", "3", "--seeds", "2", "--no-plots", "--workload", str(trace)]
    base += ["--policies", "baseline", "--premium-share", "0.5"]
    offered = {}
    for load in ("0.2", "0.7"):
        r = CliRunner().invoke(simulate, [*base, "--load", load, "--out", str(tmp_path / load), "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        offered[load] = doc["workload"]["offered_load"]["mean"]
        assert any("4 of 8 nodes (l40s) fit no job" in w for w in doc["workload"]["warnings"])
    # until issue 25 both loads replayed the trace once: the same run
    assert offered["0.2"] < 0.35 < 0.55 < offered["0.7"], offered
    text = CliRunner().invoke(simulate, [*base, "--load", "0.7", "--out", str(tmp_path / "t")]).stdout
    assert "load 0.7 (offered " in text.splitlines()[0]
    assert text.splitlines()[1].startswith("WARNING: 4 of 8 nodes (l40s) fit no job of this workload")


def test_an_oversized_job_is_named_by_the_traces_own_id(tmp_path: Path) -> None:
    trace = _pretrain_trace(tmp_path / "big.csv", 3)
    trace.write_text(trace.read_text() + "4242,50,3600,16,8,pretrain,3600\n")
    r = CliRunner().invoke(simulate, ["run", *SMALL[:-1], str(trace), "--out", str(tmp_path), "--json"])
    assert r.exit_code == 1
    assert json.loads(r.stderr)["error"] == (
        f"{trace}: job 4242 needs 16 x 8 GPUs, larger than the fleet (8 x 8)"
    )
