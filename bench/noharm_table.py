"""The do-no-harm table from ``make sim-noharm``'s reports (SIMULATED): one row per (workload, load, node
rate, precursor share) with FleetYield's and the A/A control's net goodput vs unmodified Slurm, the oracle's
headroom, and the issue's two tests.

Usage: ``python bench/noharm_table.py [docs/sim/noharm] > docs/sim/noharm/table.md``.
Tests per cell (issue "Price risk by what it puts at stake"): no harm = the lower 95% bound of FleetYield's
net goodput vs baseline >= -0.1%; where the oracle has >= 1% headroom, FleetYield closes >= 50% of it (its
mean vs the oracle's mean). The A/A column (``baseline_aa``: unmodified Slurm with another, equally blind
node order) is what placement alone moves a comparison by: when its own interval is wider than +-0.1%, the
first test cannot be passed or failed at this fleet size and seed count by any policy that moves work.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def _pct(c: dict | None) -> str:
    if not c or c.get("mean") is None:
        return "-"
    return f"{c['mean'] * 100:+.2f}% [{c['lo'] * 100:+.2f}, {c['hi'] * 100:+.2f}]"


def _fleet(config: dict) -> str:
    if "nodes" not in config or "days" not in config:
        return "fleet size not recorded"
    return f"{config['nodes']} nodes x {config['days']:g} days"


def rows(root: Path) -> list[dict]:
    out = []
    for rep in sorted(root.glob("*/precursor_*/report.json")):
        m = re.match(r"(?P<w>.+)-load(?P<l>[0-9.]+)-rate(?P<r>[0-9.]+)$", rep.parent.parent.name)
        if not m:
            continue
        report = json.loads(rep.read_text())
        p = report["policies"]
        share = float(rep.parent.name.split("_", 1)[1])
        fy, aa, orc = (p.get(k, {}).get("net_vs_baseline") for k in ("fleetyield", "baseline_aa", "oracle"))
        harmless = fy is not None and fy["lo"] is not None and fy["lo"] >= -0.001
        head = orc["mean"] if orc and orc["mean"] is not None else 0.0
        closes = None if head < 0.01 else (fy["mean"] >= 0.5 * head if fy else False)
        out.append(
            {
                "workload": m["w"],
                "load": float(m["l"]),
                "rate": float(m["r"]),
                "share": share,
                "fy": fy,
                "aa": aa,
                "oracle": orc,
                "no_harm": harmless,
                "half_headroom": closes,
                "seeds": len(report["seeds"]),
                "fleet": _fleet(report.get("config", {})),
            }
        )
    return sorted(out, key=lambda r: (r["workload"], r["load"], r["rate"], r["share"]))


def table(rs: list[dict]) -> str:
    lines = [
        "SIMULATED (`make sim-noharm`): net goodput vs unmodified Slurm, mean [95% CI] over seeds; "
        + (", ".join(sorted({r["fleet"] for r in rs})) or "no reports"),
        "",
        "| workload | load | rate | share | seeds | FleetYield | A/A control | oracle "
        "| no harm (lo >= -0.1%) | half the headroom |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rs:
        half = "n/a (< 1%)" if r["half_headroom"] is None else ("yes" if r["half_headroom"] else "no")
        lines.append(
            f"| {r['workload']} | {r['load']:g} | {r['rate']:g} | {r['share']:g} | {r['seeds']} "
            f"| {_pct(r['fy'])} | {_pct(r['aa'])} | {_pct(r['oracle'])} | {'yes' if r['no_harm'] else 'no'} "
            f"| {half} |"
        )
    n = len(rs)
    lines += [
        "",
        f"{sum(r['no_harm'] for r in rs)}/{n} cells pass no harm; "
        f"{sum(1 for r in rs if r['half_headroom'])}/{sum(1 for r in rs if r['half_headroom'] is not None)} "
        "cells with >= 1% oracle headroom close half of it; "
        f"{sum(1 for r in rs if r['aa'] and r['aa']['lo'] is not None and r['aa']['lo'] >= -0.001)}/{n} "
        "A/A controls would pass no harm themselves.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/sim/noharm")
    sys.stdout.write(table(rows(root)))


if __name__ == "__main__":
    main()
