"""bench/noharm_table.py: the do-no-harm verdicts from sweep reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "noharm_table", Path(__file__).parents[2] / "bench" / "noharm_table.py"
)
assert _spec and _spec.loader
nt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nt)


def _ci(mean: float, lo: float, hi: float) -> dict:
    return {"mean": mean, "lo": lo, "hi": hi, "n": 10}


def _report(root: Path, cell: str, share: str, fy: dict, aa: dict, oracle: dict) -> None:
    d = root / cell / f"precursor_{share}"
    d.mkdir(parents=True)
    pol = {
        k: {"net_vs_baseline": v} for k, v in (("fleetyield", fy), ("baseline_aa", aa), ("oracle", oracle))
    }
    (d / "report.json").write_text(json.dumps({"policies": pol, "seeds": list(range(10))}))


def test_verdicts_per_cell(tmp_path: Path) -> None:
    _report(
        tmp_path,
        "openb-load0.7-rate10",
        "0",
        _ci(0.002, -0.0005, 0.004),
        _ci(0, -0.01, 0.01),
        _ci(0.03, 0.02, 0.04),
    )
    _report(
        tmp_path,
        "openb-load0.7-rate1",
        "0.25",
        _ci(0.0, -0.002, 0.002),
        _ci(0, -0.001, 0.001),
        _ci(0.001, 0, 0.002),
    )
    rs = nt.rows(tmp_path)
    assert [(r["rate"], r["share"]) for r in rs] == [(1.0, 0.25), (10.0, 0.0)]
    low, high = rs
    assert not low["no_harm"] and low["half_headroom"] is None  # lo -0.2%; oracle below 1%: no headroom test
    assert high["no_harm"] and high["half_headroom"] is False  # +0.2% of a 3% headroom
    text = nt.table(rs)
    assert "| openb | 0.7 | 10 | 0 | 10 | +0.20% [-0.05, +0.40]" in text
    assert "1/2 cells pass no harm; 0/1 cells" in text and "1/2 A/A controls" in text
