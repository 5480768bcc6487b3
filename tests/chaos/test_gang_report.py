"""The gang A/B's Markdown block and README's copy of it (chaos/gang_report.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from slurm_fleetyield.chaos import gang, gang_report, report
from slurm_fleetyield.chaos.cli import chaos

ROOT = Path(__file__).parents[2]
GANG_JSON = ROOT / "docs" / "ab-gang" / "ab-gang.json"


def _arm(recovery: float | None, lost: float, stalled: float, wall: float | None) -> dict[str, Any]:
    rec = {"recovery_s": recovery, "lost_s": lost, "stalled_s": stalled, "drained_s": 1.0, "hit": True,
           "requeued_s": stalled + 1}  # fmt: skip
    return {"fault_node": "gpu-l40s-2", "recoveries": [rec], "wall_s": wall, "attempts": 2,
            "unfinished": wall is None}  # fmt: skip


def _summary() -> dict[str, Any]:
    gp = gang.GangParams()
    return {
        "kind": "gang",
        "seeds": [0, 1],
        "params": gp.to_dict(),
        "plans": {str(s): {"gpu": 6, "xid": 79} for s in (0, 1)},
        "arms": {
            "bare": {"0": _arm(84.0, 4.0, 61.0, 230.0), "1": _arm(90.0, 10.0, 60.0, None)},
            "fleetyield": {"0": _arm(11.0, 6.0, 0.0, 150.0), "1": _arm(13.0, 8.0, 1.0, 152.0)},
        },
        "versions": {"git_commit": "b" * 40, "git_describe": "gang123", "slurm": "slurm-wlm 22.05.8"},
        "command": "fleetyield chaos ab-gang --seeds 0,1 --out docs/ab-gang",
        "started": 1767225600.0,
        "elapsed_s": 900.0,
    }


def test_render_one_row_per_seed_and_arm_means_and_what_is_measured():
    md = gang_report.render(_summary())
    assert md.startswith(gang_report.BEGIN) and md.rstrip().endswith(gang_report.END)
    assert "| 0 | bare | gpu-l40s-2, 6, 79 | 1 | 61 | 62 | 84 | 4 | 2 | 230 |" in md
    assert "| **mean** | **bare** |  | 1.0 | 60.5 | 61.5 | **87.0** | **7.0** |  | 230.0 |" in md
    assert "| **mean** | **fleetyield** |  | 1.0 | 0.5 | 1.5 | **12.0** | **7.0** |  | 151.0 |" in md
    assert "Unfinished at the deadline" in md and "bare seed 1" in md
    assert "**Measured**" in md and "**Simulated**" in md and "`gang123`" in md and "-N3" in md
    assert "collective timeout (60 s)" in md and "every 30 s" in md


def test_splice_goes_after_the_other_ab_blocks_and_replaces_only_itself():
    ab_block = f"{report.BEGIN}\nold A/B\n{report.END}\n"
    readme = f"# X\n\n{report.HEADING}\n\n{ab_block}\n## Benchmarks\n\nb\n"
    md = gang_report.render(_summary())
    once = gang_report.splice(readme, md)
    assert once.index(report.END) < once.index(gang_report.BEGIN) < once.index("## Benchmarks")
    assert report.extract(once) == ab_block and gang_report.extract(once) == md
    md2 = gang_report.render(_summary() | {"elapsed_s": 60.0})
    twice = gang_report.splice(once, md2)
    assert gang_report.extract(twice) == md2 and twice.replace(md2, md) == once
    bare = gang_report.splice("# X\n\n## Benchmarks\n", md)
    assert bare.index(report.HEADING) < bare.index(gang_report.BEGIN) < bare.index("## Benchmarks")


def test_report_cli_renders_a_gang_summary_into_its_own_block(tmp_path: Path):
    (tmp_path / "ab-gang.json").write_text(json.dumps(_summary()))
    (tmp_path / "README.md").write_text("# X\n\n## Benchmarks\n")
    r = CliRunner().invoke(
        chaos, ["report", str(tmp_path / "ab-gang.json"), "--readme", str(tmp_path / "README.md")]
    )
    assert r.exit_code == 0, r.output
    text = (tmp_path / "README.md").read_text()
    assert gang_report.extract(text) == gang_report.render(_summary()) and report.extract(text) is None


def test_readme_gang_block_is_what_the_committed_json_renders():
    block = gang_report.extract((ROOT / "README.md").read_text())
    if not GANG_JSON.exists():
        assert block is None, "README has a gang A/B block but docs/ab-gang/ab-gang.json is missing"
        return
    assert block == gang_report.render(json.loads(GANG_JSON.read_text()))
