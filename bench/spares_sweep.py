"""Hot spares sweep (issue #26 lever 3, SIMULATED): frontier x precursor share x background load, and openb.

Writes one JSON per (workload, share, load, seed) with every policy's raw metrics under ``OUT`` (default
docs/sim/spares/raw), then ``python bench/spares_sweep.py --table`` prints the docs/results.md table.
Usage: nice -n 10 .venv/bin/python bench/spares_sweep.py [--workers 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from slurm_fleetyield.sim import runner

POLICIES = ("baseline", "fleetyield", "fy_no_spares", "oracle")
KEYS = (
    "ettr",
    "net_goodput_gpu_h",
    "gang_restarts",
    "gang_restart_wait_mean_s",
    "gang_restart_wait_max_s",
    "spares_mean",
    "preemptions",
    "requeues",
)


def cases() -> list[tuple[str, float, float, int]]:
    out = []
    for share in (0.25, 0.0):
        for load in (0.9, 1.0, 0.5):
            out += [("frontier", share, load, s) for s in range(3)]
    out += [("openb", 0.25, 0.0, s) for s in range(3)]
    return out


def one(case: tuple[str, float, float, int], out: str) -> str:
    wl, share, load, seed = case
    kw: dict = {"workload": wl, "days": 30.0, "seed": seed, "precursor_share": share}
    if wl == "frontier":
        kw.update(nodes=1024, premium_share=1.0, background_load=load)
    cfg = runner.make_config(**kw)
    res = runner.run_policies(cfg, POLICIES)
    doc = {"config": cfg.to_dict(), "policies": {p: {k: r[k] for k in KEYS} for p, r in res.items()}}
    path = Path(out) / f"{wl}_share{share:g}_load{load:g}_seed{seed}.json"
    path.write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    return str(path)


def ci(xs: list[float]) -> str:
    xs = [x for x in xs if isinstance(x, float) and math.isfinite(x)]
    if not xs:
        return "n/a"
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return f"{m:.3g}"
    h = 4.303 * statistics.stdev(xs) / math.sqrt(len(xs))  # t(0.975, 2 dof): 3 seeds
    return f"{m:.4g} [{m - h:.4g}, {m + h:.4g}]"


def table(out: str) -> str:
    groups: dict[tuple[str, float, float], list[dict]] = {}
    for f in sorted(Path(out).glob("*.json")):
        d = json.loads(f.read_text())
        c = d["config"]
        key = (c["workload"], c["faults"]["precursor_share"], c.get("background_load", 0.5))
        groups.setdefault(key, []).append(d["policies"])
    rows = [
        "| workload | share | bg load | policy | ETTR [95% CI] | net goodput vs baseline % | gang restart "
        "wait mean / max (s) | spares held (mean) | preemptions / day |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (wl, share, load), seeds in sorted(groups.items()):
        for p in POLICIES:
            if p not in seeds[0]:
                continue
            rel = [100 * (s[p]["net_goodput_gpu_h"] / s["baseline"]["net_goodput_gpu_h"] - 1) for s in seeds]
            wait = statistics.fmean(s[p]["gang_restart_wait_mean_s"] for s in seeds)
            mx = max(s[p]["gang_restart_wait_max_s"] for s in seeds)
            rows.append(
                f"| {wl} | {share:g} | {load if wl == 'frontier' else '-'} | {p} | "
                f"{ci([s[p]['ettr'] for s in seeds])} | {ci(rel)} | {wait:.0f} / {mx:.0f} | "
                f"{statistics.fmean(s[p]['spares_mean'] for s in seeds):.2f} | "
                f"{statistics.fmean(s[p]['preemptions'] for s in seeds) / 30:.1f} |"
            )
    return (
        "\n".join(rows) + f"\n\n({len(groups)} configurations, seeds per configuration: "
        f"{sorted({len(v) for v in groups.values()})})\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="docs/sim/spares/raw")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    if a.table:
        print(table(a.out), end="")
        return
    Path(a.out).mkdir(parents=True, exist_ok=True)
    todo = [
        c
        for c in cases()
        if not (Path(a.out) / f"{c[0]}_share{c[1]:g}_load{c[2]:g}_seed{c[3]}.json").exists()
    ]
    with ProcessPoolExecutor(a.workers) as ex:
        for path in ex.map(one, todo, [a.out] * len(todo)):
            print(path, flush=True)


if __name__ == "__main__":
    main()
