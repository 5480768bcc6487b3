"""Report: per-policy metrics over seeds, with 95% confidence intervals, as text, JSON and PNG.

Input: the ``SimConfig`` and ``{seed: {policy: metrics}}`` from ``runner.run_seeds``. Output: a report dict
(``build``), written by ``write`` as ``report.json`` (sorted keys, rounded: same seeds give the same bytes),
``report.txt`` (a table) and, when matplotlib is installed, ``net_goodput.png`` / ``gap_closed.png`` (Agg
backend, fixed metadata, so the bytes are reproducible too).

Metrics (GPU-hours unless stated): ``net_goodput_gpu_h`` = useful - wasted; ``useful_gpu_h`` = work of
completed jobs plus progress of jobs still running at the end; ``wasted_gpu_h`` = progress lost at
interruptions (since the last checkpoint, or the whole run for jobs that cannot checkpoint) plus work redone
after quiet corruption; ``failures_hitting_jobs`` = interruptions of running jobs by faults;
``premium_misuse_gpu_h`` = GPU-hours of work that does not need premium GPUs (decode, batch, finetune) on
premium nodes while premium-needing work (pretrain gangs) waited; ``queue_delay_h`` per class = mean wait to
first start; ``drained_gpu_h`` = GPU-hours of nodes drained or down; ``refused_jobs`` / ``refused_gpu_h`` =
jobs sbatch refused because no node carried their class feature, and the GPU-hours of work they asked for
(lost demand: not in useful or wasted); ``reclaimed_jobs`` = batch jobs requeued off premium GPUs for a
pending premium-needing job (core/reclaim.py; their lost progress is in ``wasted_gpu_h``); ``gap_closed`` =
(policy - baseline) / (oracle - baseline) of net goodput, per seed, then averaged. It is undefined on a seed
where the oracle beats the baseline by less than ``GAP_MIN_FRACTION`` of the baseline's net goodput (a ratio
over a near-zero gap is noise, not a result: 0.1 GPU-h of headroom would turn a 5 GPU-h loss into "-50x"),
and reported as n/a with that reason when it is undefined on more than half the seeds.
The CI is mean +/- t(0.975, n-1) x sd / sqrt(n) over seeds. ``net_vs_baseline`` is printed as a percentage
with its CI in both tables. ``workload``: the load that actually ran (``offered_load``, per seed: a thinned
replica and work clipped at the horizon make it differ from the ``load`` asked for), the jobs per seed, and
the warnings of sim/workload.py (e.g. nodes no job of the workload fits); the table prints both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# t(0.975, df) for df = 1..30; beyond 30 the normal 1.96 is close enough.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
SCALARS = (
    "net_goodput_gpu_h",
    "useful_gpu_h",
    "wasted_gpu_h",
    "failures_hitting_jobs",
    "fatal_faults",
    "premium_misuse_gpu_h",
    "drained_gpu_h",
    "drains",
    "preemptive_drains",
    "false_drains",
    "jobs_completed",
    "refused_jobs",
    "refused_gpu_h",
    "reclaimed_jobs",
    "stalled_gpu_h",
    "train_interruptions",
    "ettr",
)
TABLE = (
    "net_goodput_gpu_h",
    "net_vs_baseline",
    "wasted_gpu_h",
    "failures_hitting_jobs",
    "premium_misuse_gpu_h",
    "drained_gpu_h",
    "preemptive_drains",
    "gap_closed",
    "ettr",
)


def ci(xs: Sequence[float]) -> dict[str, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    n = len(xs)
    if n == 0:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    mean = sum(xs) / n
    if n == 1:
        return {"mean": mean, "lo": mean, "hi": mean, "n": 1}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    h = t * sd / math.sqrt(n)
    return {"mean": mean, "lo": mean - h, "hi": mean + h, "n": n}


GAP_MIN_FRACTION = 0.01
"""The oracle must beat the baseline by 1% of the baseline's net goodput for gap_closed to mean anything."""


def _gap(m: Mapping[str, Any], base: Mapping[str, Any], oracle: Mapping[str, Any]) -> float:
    b = base["net_goodput_gpu_h"]
    d = oracle["net_goodput_gpu_h"] - b
    if d <= GAP_MIN_FRACTION * abs(b) or d <= 0:
        return math.nan
    return (m["net_goodput_gpu_h"] - b) / d


def _gap_row(results: Mapping[int, Mapping[str, Mapping[str, Any]]], p: str) -> dict[str, Any]:
    seeds = sorted(results)
    gaps = [_gap(results[s][p], results[s]["baseline"], results[s]["oracle"]) for s in seeds]
    undefined = sum(1 for g in gaps if not math.isfinite(g))
    row: dict[str, Any] = ci(gaps) if undefined * 2 <= len(seeds) else dict(ci([]))
    row["undefined_seeds"] = undefined
    if undefined * 2 > len(seeds):
        row["na_reason"] = (
            f"oracle within {GAP_MIN_FRACTION:.0%} of baseline net goodput on {undefined}/{len(seeds)} "
            "seeds: no headroom to close (compare net goodput directly)"
        )
    return row


def build(cfg: Any, results: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    seeds = sorted(results)
    policies = list(next(iter(results.values())).keys()) if results else []
    out: dict[str, Any] = {"config": cfg.to_dict(), "seeds": seeds, "policies": {}, "per_seed": {}}
    for p in policies:
        row: dict[str, Any] = {}
        for k in SCALARS:
            row[k] = ci([results[s][p][k] for s in seeds])
        classes = sorted(results[seeds[0]][p]["queue_delay_h"])
        row["queue_delay_h"] = {c: ci([results[s][p]["queue_delay_h"][c] for s in seeds]) for c in classes}
        if "baseline" in results[seeds[0]]:
            row["net_vs_baseline"] = ci([_rel(results[s][p], results[s]["baseline"]) for s in seeds])
        if "baseline" in results[seeds[0]] and "oracle" in results[seeds[0]]:
            row["gap_closed"] = _gap_row(results, p)
            row["ettr_gap_closed"] = ci([_ettr_gap(results[s], p) for s in seeds])
        out["policies"][p] = row
    out["per_seed"] = {str(s): {p: {k: results[s][p][k] for k in SCALARS} for p in policies} for s in seeds}
    first = [results[s][policies[0]] for s in seeds] if policies else []
    facts = [m["workload"] for m in first if "workload" in m]
    if facts:
        out["workload"] = {
            "offered_load": ci([f["offered_load"] for f in facts]),
            "jobs": ci([f["jobs"] for f in facts]),
            "warnings": _warnings([f["warnings"] for f in facts]),
        }
    return _round(out)


ETTR_GAP_MIN = 0.005
"""The oracle's ETTR must exceed the baseline's by half a point for an ETTR gap to be defined."""


def _ettr_gap(seed: Mapping[str, Mapping[str, Any]], p: str) -> float:
    """Share of the baseline -> oracle ETTR gap that ``p`` closes on one seed (NaN: no gap, or no ETTR)."""
    b, o, m = (seed[k].get("ettr", math.nan) for k in ("baseline", "oracle", p))
    if not all(isinstance(x, float) and math.isfinite(x) for x in (b, o, m)) or o - b < ETTR_GAP_MIN:
        return math.nan
    return (m - b) / (o - b)


def _warnings(per_seed: Sequence[Sequence[str]]) -> list[str]:
    """Each seed's workload warnings once, with the share of seeds that gave it when not all did."""
    n = len(per_seed)
    counts: dict[str, int] = {}
    for ws in per_seed:
        for w in dict.fromkeys(ws):
            counts[w] = counts.get(w, 0) + 1
    return sorted(w if k == n else f"{w} (on {k} of {n} seeds)" for w, k in counts.items())


def _rel(m: Mapping[str, Any], base: Mapping[str, Any]) -> float:
    """Net goodput relative to the baseline's, per seed (0.05 = 5% more)."""
    b = base["net_goodput_gpu_h"]
    return (m["net_goodput_gpu_h"] - b) / abs(b) if b else math.nan


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return None if not math.isfinite(x) else round(x, 6)
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def table(rep: Mapping[str, Any]) -> str:
    cfg = rep["config"]
    head = (
        f"SIMULATED results (not measurements): {cfg['nodes']} nodes x {cfg['gpus_per_node']} GPUs, "
        f"{cfg['days']:g} days, workload {cfg['workload']}, load {cfg['load']:g}{_offered(rep)}, "
        f"precursor share {cfg['faults']['precursor_share']:g}, seeds {rep['seeds'][0]}..{rep['seeds'][-1]} "
        f"(n={len(rep['seeds'])}); mean [95% CI]"
    )
    cols = ["policy", *TABLE]
    rows = [cols]
    for p, row in rep["policies"].items():
        cells = [p]
        for k in TABLE:
            c = row.get(k)
            if c and c.get("na_reason"):
                cells.append("n/a*")
            elif not c or c["mean"] is None:
                cells.append("-")
            elif k == "net_vs_baseline":
                cells.append(_pct(c))
            else:
                cells.append(f"{c['mean']:.3g} [{_f(c['lo'])}, {_f(c['hi'])}]")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = [head]
    lines.extend(f"WARNING: {w}" for w in rep.get("workload", {}).get("warnings", ()))
    lines.append("")
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    lines.append("")
    reasons = {
        r["gap_closed"]["na_reason"]
        for r in rep["policies"].values()
        if r.get("gap_closed", {}).get("na_reason")
    }
    for why in sorted(reasons):
        lines.append(f"* gap_closed n/a: {why}")
    lines.append(
        "net_vs_baseline: (policy - baseline) / baseline net goodput, per seed; "
        "queue delay (h, mean over seeds): "
        + "; ".join(
            f"{p}: "
            + ", ".join(
                f"{c} {v['mean']:.2f}" for c, v in row["queue_delay_h"].items() if v["mean"] is not None
            )
            for p, row in rep["policies"].items()
        )
    )
    return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _pct(c: Mapping[str, Any]) -> str:
    """A relative figure (0.0123) as ``+1.23% [+0.50, +1.96]``: mean and 95% CI in percent."""

    def p(x: float | None) -> str:
        return "-" if x is None else f"{x * 100:+.2f}"

    return f"{p(c['mean'])}% [{p(c['lo'])}, {p(c['hi'])}]"


def _offered(rep: Mapping[str, Any]) -> str:
    """What ran, beside the load asked for: the offered load measured on each seed's job stream."""
    w = rep.get("workload")
    if not w or w["offered_load"]["mean"] is None:
        return ""
    o = w["offered_load"]
    return f" (offered {o['mean']:.3f} [{_f(o['lo'])}, {_f(o['hi'])}], {w['jobs']['mean']:.0f} jobs/seed)"


def write(rep: Mapping[str, Any], out: Path, plots: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.json", out / "report.txt"]
    files[0].write_text(json.dumps(rep, sort_keys=True, indent=1) + "\n")
    files[1].write_text(table(rep))
    if plots:
        files.extend(_plots(rep, out))
    return files


def _plots(rep: Mapping[str, Any], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    meta = {"Software": None, "Creation Time": None}
    written = []
    for key, fname in (("net_goodput_gpu_h", "net_goodput.png"), ("gap_closed", "gap_closed.png")):
        pols = [p for p, r in rep["policies"].items() if r.get(key) and r[key]["mean"] is not None]
        if not pols:
            continue
        means = [rep["policies"][p][key]["mean"] for p in pols]
        err = [
            [m - rep["policies"][p][key]["lo"] for p, m in zip(pols, means, strict=True)],
            [rep["policies"][p][key]["hi"] - m for p, m in zip(pols, means, strict=True)],
        ]
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar(pols, means, yerr=err, capsize=4, color="#4a7")
        ax.set_ylabel(key)
        ax.set_title(f"{key} (simulated, 95% CI over {len(rep['seeds'])} seeds)")
        ax.tick_params(axis="x", rotation=20)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, metadata=meta)
        plt.close(fig)
        written.append(path)
    return written


def sweep_table(rows: Sequence[tuple[float, Mapping[str, Any]]]) -> str:
    """Precursor-observability sweep: one line per (share, policy) with net goodput and gap closed."""
    lines = ["SIMULATED sweep over precursor observability (share of fatal faults with a precursor)"]
    warned = sorted({w for _, rep in rows for w in rep.get("workload", {}).get("warnings", ())})
    lines.extend(f"WARNING: {w}" for w in warned)
    lines.append("")
    lines.append(
        f"{'share':>6}  {'policy':<14} {'net goodput GPU-h [95% CI]':<30} {'vs baseline [95% CI]':<26} "
        "gap closed [95% CI]"
    )
    for share, rep in rows:
        for p, row in rep["policies"].items():
            g, gc = row["net_goodput_gpu_h"], row.get("gap_closed")
            gtxt = f"{g['mean']:.4g} [{_f(g['lo'])}, {_f(g['hi'])}]"
            if gc and gc.get("na_reason"):
                ctxt = f"n/a ({gc['na_reason']})"
            elif not gc or gc["mean"] is None:
                ctxt = "-"
            else:
                ctxt = f"{gc['mean']:.3f} [{_f(gc['lo'])}, {_f(gc['hi'])}]"
            r = row.get("net_vs_baseline")
            rtxt = _pct(r) if r and r["mean"] is not None else "-"
            e = row.get("ettr")
            etxt = ""
            if e and e["mean"] is not None:
                etxt = f"  ettr {e['mean']:.3f} [{_f(e['lo'])}, {_f(e['hi'])}]"
            lines.append(f"{share:>6.2f}  {p:<14} {gtxt:<30} {rtxt:<26} {ctxt}{etxt}")
    return "\n".join(lines) + "\n"
