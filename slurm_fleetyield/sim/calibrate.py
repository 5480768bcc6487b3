"""Calibration: measure the shape of GPU failures in the Titan lifetimes data.

Input: ``titan-gpu-lifetimes/gc_full.csv`` (Ostrouchov et al., "GPU Lifetimes on Titan Supercomputer: Survival
Analysis and Reliability", SC '20; github.com/olcf/TitanGPULife, commit f3303559), one row per GPU stint in a
slot: ``SN,location,insert,remove,duration,out,event``. Output: ``TitanShape``: fatal events (DBE, OTB),
GPU-years observed, the share of fatal events hitting a GPU that had already failed (the lemon shape the
fault model targets, ``faults.TITAN_REPEAT_SHARE``) and the share of events carried by the worst 1% of GPUs.
Titan's K20X rates are old hardware: use the shape only, never the rate (shared/data/README.md).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from slurm_fleetyield.sim.data import titan_csv

TITAN_CSV = str(titan_csv())


@dataclass(frozen=True, slots=True)
class TitanShape:
    rows: int
    gpus: int
    fatal_events: int
    dbe: int
    otb: int
    gpu_years: float
    repeat_share: float  # fatal events on a GPU (serial number) that already had one
    top1pct_event_share: float  # share of fatal events on the 1% of GPUs with the most events


def titan_shape(path: str | Path = TITAN_CSV) -> TitanShape:
    per_gpu: dict[str, list[tuple[float, str]]] = {}
    rows = 0
    seconds = 0.0
    dbe = otb = 0
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            rows += 1
            try:
                seconds += float(r["duration"] or 0.0)
                t = float(r["remove"] or r["insert"] or 0.0)
            except ValueError:
                t = 0.0
            ev = (r.get("event") or "").strip()
            per_gpu.setdefault(r["SN"], [])
            if ev in ("DBE", "OTB"):
                dbe += ev == "DBE"
                otb += ev == "OTB"
                per_gpu[r["SN"]].append((t, ev))
    fatal = dbe + otb
    repeats = sum(max(0, len(v) - 1) for v in per_gpu.values())
    counts = sorted((len(v) for v in per_gpu.values()), reverse=True)
    top = counts[: max(1, len(counts) // 100)]
    return TitanShape(
        rows,
        len(per_gpu),
        fatal,
        dbe,
        otb,
        seconds / (365.25 * 86_400.0),
        repeats / fatal if fatal else 0.0,
        sum(top) / fatal if fatal else 0.0,
    )


if __name__ == "__main__":  # pragma: no cover
    print(titan_shape())
