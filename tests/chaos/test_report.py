"""The A/B Markdown block and README's copy of it (chaos/report.py)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from slurm_fleetyield.chaos import report
from slurm_fleetyield.chaos.cli import chaos
from slurm_fleetyield.chaos.timeline import TimelineParams

ROOT = Path(__file__).parents[2]
AB_JSON = ROOT / "docs" / "ab" / "ab.json"
AB_PRECURSOR_JSON = ROOT / "docs" / "ab-precursor" / "ab.json"


def _summary() -> dict:
    t = {"net_goodput_gpu_s": 1000.0, "hardware_failures": 2.0, "wasted_gpu_s": 50.0,
         "premium_misuse_gpu_s": 30.0, "completed": 20.0, "jobs": 26.0, "failures": 3.0, "unfinished": 1.0,
         "elapsed_s": 300.0}  # fmt: skip
    f = t | {"net_goodput_gpu_s": 1200.0, "premium_misuse_gpu_s": 0.0}
    return {
        "seeds": [0, 1],
        "arms": {"bare": {"0": t, "1": t}, "fleetyield": {"0": f, "1": f}},
        "params": TimelineParams.for_duration(240).to_dict(),
        "versions": {"git_commit": "a" * 40, "git_describe": "abc123", "slurm": "slurm-wlm 22.05.8"},
        "command": "fleetyield chaos ab --seeds 0,1 --duration 240 --out docs/ab",
        "started": 1767225600.0,
        "elapsed_s": 1800.0,
    }


def test_render_side_by_side_sums_and_provenance():
    md = report.render(_summary())
    assert md.startswith(report.BEGIN) and md.rstrip().endswith(report.END)
    assert "| **sum** | **2,000** | **2,400** | **4** | **4** | **100** | **100** | **60** | **0** |" in md
    assert "+20.0%" in md and "`abc123`" in md and "slurm-wlm 22.05.8" in md
    assert "--seeds 0,1 --duration 240" in md and "work 16.0-80.0 s" in md
    assert "**Measured**" in md and "**Simulated**" in md


def test_refused_submissions_get_a_column_only_when_counted():
    assert "refused by sbatch" not in report.render(_summary())  # runs before they were counted
    s = _summary()
    s["arms"]["fleetyield"]["1"] = s["arms"]["fleetyield"]["1"] | {"refused": 4.0}
    md = report.render(s)
    assert "| refused by sbatch: bare | refused by sbatch: fleetyield | useful GPU-s: bare |" in md
    assert "| 1 | 20 / 26 | 20 / 26 | 0 | 4 |" in md


def test_splice_replaces_only_the_block_and_is_idempotent():
    md = report.render(_summary())
    readme = "# T\n\nintro\n"
    once = report.splice(readme, md)
    assert once.startswith(readme.rstrip("\n")) and report.extract(once) == md
    assert report.HEADING in once
    placed = report.splice("# T\n\n## Status\nok\n\n## Benchmarks\nb\n", md)
    assert placed.index(report.HEADING) < placed.index("## Benchmarks") and report.extract(placed) == md
    again = report.splice(once + "\ntail\n", md)
    assert again == once + "\ntail\n"
    broken = "x " + report.BEGIN + " y"
    try:
        report.splice(broken, md)
    except ValueError as exc:
        assert "no" in str(exc)
    else:
        raise AssertionError("a README with a half block was accepted")


def test_a_precursor_run_has_its_own_block_and_both_stay_in_readme():
    sudden = _summary()
    early = _summary()
    early["params"] = TimelineParams.for_duration(240, precursor_share=0.5).to_dict()
    md_s, md_p = report.render(sudden), report.render(early)
    assert md_s.startswith(report.BEGIN) and "every fault sudden" in md_s and "make ab`" in md_s
    assert md_p.startswith(report.PRECURSOR_BEGIN) and md_p.rstrip().endswith(report.PRECURSOR_END)
    assert "probability 0.5" in md_p and "24.0-60.0 s" in md_p and "make ab-precursor" in md_p
    readme = "# T\n\n## Status\nok\n\n## Benchmarks\nb\n"
    both = report.splice(report.splice(readme, md_s), md_p)
    assert report.extract(both) == md_s and report.extract(both, precursor=True) == md_p
    assert both.index(report.END) < both.index(report.PRECURSOR_BEGIN) < both.index("## Benchmarks")
    assert report.splice(report.splice(both, md_p), md_s) == both  # each replaces only its own block
    alone = report.splice(readme, md_p)  # no sudden-fault block yet: under the heading
    assert report.extract(alone, precursor=True) == md_p and report.extract(alone) is None


def test_report_cli_writes_readme_and_refuses_bad_input(tmp_path: Path):
    (tmp_path / "ab.json").write_text(json.dumps(_summary()))
    (tmp_path / "README.md").write_text("# T\n")
    r = CliRunner().invoke(
        chaos, ["report", str(tmp_path / "ab.json"), "--readme", str(tmp_path / "README.md")]
    )
    assert r.exit_code == 0, r.output
    assert report.extract((tmp_path / "README.md").read_text()) == report.render(_summary())
    (tmp_path / "bad.json").write_text("{}")
    r = CliRunner().invoke(
        chaos, ["report", str(tmp_path / "bad.json"), "--readme", str(tmp_path / "README.md")]
    )
    assert r.exit_code != 0 and "not an A/B summary" in r.output
    assert report.extract((tmp_path / "README.md").read_text()) == report.render(_summary())  # unchanged


def test_readme_block_is_what_the_committed_ab_json_renders():
    """README's A/B table is generated: it must equal what `fleetyield chaos report` renders from the
    committed docs/ab/ab.json (no block at all while there is no result)."""
    block = report.extract((ROOT / "README.md").read_text())
    if not AB_JSON.exists():
        assert block is None, "README has an A/B block but docs/ab/ab.json is missing"
        return
    assert block == report.render(json.loads(AB_JSON.read_text()))
    early = report.extract((ROOT / "README.md").read_text(), precursor=True)
    if not AB_PRECURSOR_JSON.exists():
        assert early is None, "README has a precursor A/B block but docs/ab-precursor/ab.json is missing"
        return
    assert early == report.render(json.loads(AB_PRECURSOR_JSON.read_text()))


def test_report_cli_json(tmp_path: Path):
    (tmp_path / "ab.json").write_text(json.dumps(_summary()))
    r = CliRunner().invoke(chaos, ["report", str(tmp_path / "ab.json"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"markdown": report.render(_summary())}
    (tmp_path / "bad.json").write_text("{}")
    r = CliRunner().invoke(chaos, ["report", str(tmp_path / "bad.json"), "--json"])
    assert r.exit_code == 1 and r.stdout == ""
    assert json.loads(r.stderr)["error"].startswith(f"{tmp_path / 'bad.json'}: not an A/B summary")
