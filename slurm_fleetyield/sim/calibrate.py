"""Calibration: measure the shape of GPU failures in the Titan lifetimes data.

Input: ``titan-gpu-lifetimes/gc_full.csv`` (Ostrouchov et al., "GPU Lifetimes on Titan Supercomputer: Survival
Analysis and Reliability", SC '20; github.com/olcf/TitanGPULife, commit f3303559), one row per GPU stint in a
slot: ``SN,location,insert,remove,duration,out,event``. Output: ``TitanShape``: fatal events (DBE, OTB),
GPU-years observed, the share of fatal events hitting a GPU that had already failed, counted two ways (raw
rows, and deduplicated after a return to service: the lemon shape the fault model targets,
``faults.TITAN_REPEAT_SHARE``), and the share of events carried by the worst 1% of GPUs.
Titan's K20X rates are old hardware: use the shape only, never the rate (shared/data/README.md).

How the file is built (TitanGPULife ``code/TitanGPUmodel.Rmd``): inventory stints (``insert``..``remove``)
full-joined with the failure log on (SN, remove time, location). A fatal row's ``remove`` is the logged event
time. An event that ended a stint sits on that stint's row; an event at a time that ended no stint (the GPU
stayed in its slot), or a second event logged at the same time, is a row of its own with no ``insert``.

Deduplicated repeat rule (``repeat_stats``), per serial number:
1. Every fatal row is a report at its ``remove`` time, with or without an ``insert``.
2. A report within ``dedup_s`` (default one day, the simulator's default ``repair_h``) of the same GPU's
   previous report is a re-report of the same failure (chained: each report extends the window).
3. After a distinct failure at ``t``, the GPU returned to service if the inventory still saw it in place one
   ``dedup_s`` later (a stint that began at or before ``t`` and ends at or after ``t + dedup_s``) or saw it
   re-inserted (a stint that begins after ``t``, at or before its next failure).
4. A distinct failure is a repeat if the GPU returned to service after its previous distinct failure. A
   later failure with no such evidence counts as an event but not as a repeat (``repeats_no_return``).
Measured on ``gc_full.csv`` (37,343 rows; 6,367 fatal rows, 1,158 of them without ``insert``): 770 re-reports,
5,597 distinct failures, 400 repeats (314 kept in place, 86 re-inserted): 7.15%. Raw rows per SN: 1,177 of
6,367 (18.5%). Only 495 of 5,190 failed GPUs (9.5%) were seen back in service after their first failure;
Titan replaced the rest. Window sensitivity: one hour 7.67%, seven days 5.11%. Physical re-insertion only
(stints, rows without ``insert`` dropped, as in the stop-11 re-analysis): 82 of 5,209 (1.6%).
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from slurm_fleetyield.sim.data import titan_csv

TITAN_CSV = str(titan_csv())
FATAL = ("DBE", "OTB")
DEDUP_S = 86_400.0  # one day: reports closer than this are one failure (= the simulator's default repair_h)


class CalibrationError(ValueError):
    """A row the calibration cannot read: names the row (1 = first data row) and the field."""


@dataclass(frozen=True, slots=True)
class RepeatStats:
    fatal_rows: int  # DBE/OTB rows
    rows_without_insert: int  # fatal rows without insert: ended no stint, or a same-time twin
    re_reports: int  # fatal rows within dedup_s of the same GPU's previous fatal row
    distinct_failures: int
    repeats: int  # distinct failures after a return to service following an earlier one
    repeats_in_place: int  # ... the GPU stayed in its slot
    repeats_reinserted: int  # ... the GPU was removed and inserted again
    repeats_no_return: int  # later distinct failures without evidence of a return (not repeats)
    failed_gpus: int
    returned_gpus: int  # GPUs seen back in service after their first distinct failure

    @property
    def share(self) -> float:
        """Repeats over distinct failures: the deduplicated repeat share."""
        return self.repeats / self.distinct_failures if self.distinct_failures else 0.0

    @property
    def returned_share(self) -> float:
        return self.returned_gpus / self.failed_gpus if self.failed_gpus else 0.0


@dataclass(frozen=True, slots=True)
class TitanShape:
    rows: int
    gpus: int
    fatal_events: int  # fatal rows (raw)
    dbe: int
    otb: int
    gpu_years: float
    repeat_share_raw: float  # fatal rows on an SN that already had one (re-reports included)
    repeat_share_dedup: float  # repeat_stats(...).share: repeats after a return / distinct failures
    returned_share: float  # failed GPUs seen back in service after their first failure
    top1pct_event_share: float  # share of fatal rows on the 1% of GPUs with the most fatal rows
    repeats: RepeatStats


def _time(row: Mapping[str, str], name: str, i: int) -> float | None:
    s = (row.get(name) or "").strip()
    if not s:
        return None
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        raise CalibrationError(f"row {i}: {name}={s!r} is not a date-time (YYYY-MM-DD HH:MM:SS)") from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()  # naive: read as UTC, no DST shifts


def repeat_stats(rows: Iterable[Mapping[str, str]], dedup_s: float = DEDUP_S) -> RepeatStats:
    """The deduplicated repeat count of ``gc_full.csv`` rows (the rule is in the module docstring)."""
    if not dedup_s >= 0:
        raise CalibrationError(f"dedup_s={dedup_s!r} must be >= 0")
    stints: dict[str, list[tuple[float, float]]] = {}
    reports: dict[str, list[float]] = {}
    fatal_rows = no_insert = 0
    for i, r in enumerate(rows, 1):
        sn = (r.get("SN") or "").strip()
        if not sn:
            raise CalibrationError(f"row {i}: no SN")
        ins, rem = _time(r, "insert", i), _time(r, "remove", i)
        if ins is not None:
            if rem is None or rem < ins:
                raise CalibrationError(
                    f"row {i}: stint of {sn} has insert {r['insert']!r}, remove {r.get('remove')!r}"
                )
            stints.setdefault(sn, []).append((ins, rem))
        if (r.get("event") or "").strip() in FATAL:
            if rem is None:
                raise CalibrationError(f"row {i}: fatal event of {sn} has no remove (event) time")
            fatal_rows += 1
            no_insert += ins is None
            reports.setdefault(sn, []).append(rem)
    re_reports = repeats = in_place = reinserted = no_return = returned_gpus = distinct = 0
    for sn, times in reports.items():
        times.sort()
        failures = [times[0]]
        for prev, t in itertools.pairwise(times):
            if t - prev <= dedup_s:
                re_reports += 1
            else:
                failures.append(t)
        distinct += len(failures)
        gpu_stints = stints.get(sn, [])
        for k, t in enumerate(failures):
            nxt = failures[k + 1] if k + 1 < len(failures) else math.inf
            back = _returned(gpu_stints, t, nxt, dedup_s)
            if k == 0:
                returned_gpus += back is not None
            if k + 1 < len(failures):
                if back is None:
                    no_return += 1
                else:
                    repeats += 1
                    in_place += back == "in place"
                    reinserted += back == "re-inserted"
    return RepeatStats(
        fatal_rows,
        no_insert,
        re_reports,
        distinct,
        repeats,
        in_place,
        reinserted,
        no_return,
        len(reports),
        returned_gpus,
    )


def _returned(stints: list[tuple[float, float]], t: float, until: float, dedup_s: float) -> str | None:
    """How the GPU came back after a failure at ``t``, before its next one at ``until``: ``in place``,
    ``re-inserted`` or None (no evidence)."""
    if any(a <= t and b >= t + dedup_s for a, b in stints):
        return "in place"
    if any(t < a <= until for a, _ in stints):
        return "re-inserted"
    return None


def titan_shape(path: str | Path = TITAN_CSV, dedup_s: float = DEDUP_S) -> TitanShape:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows_per_gpu: dict[str, int] = {}
    seconds = 0.0
    dbe = otb = 0
    for i, r in enumerate(rows, 1):
        try:
            seconds += float(r.get("duration") or 0.0)
        except ValueError:
            raise CalibrationError(f"row {i}: duration={r.get('duration')!r} is not a number") from None
        ev = (r.get("event") or "").strip()
        rows_per_gpu.setdefault(r["SN"], 0)
        if ev in FATAL:
            dbe += ev == "DBE"
            otb += ev == "OTB"
            rows_per_gpu[r["SN"]] += 1
    fatal = dbe + otb
    raw_repeats = sum(max(0, n - 1) for n in rows_per_gpu.values())
    counts = sorted(rows_per_gpu.values(), reverse=True)
    top = counts[: max(1, len(counts) // 100)]
    st = repeat_stats(rows, dedup_s)
    return TitanShape(
        rows=len(rows),
        gpus=len(rows_per_gpu),
        fatal_events=fatal,
        dbe=dbe,
        otb=otb,
        gpu_years=seconds / (365.25 * 86_400.0),
        repeat_share_raw=raw_repeats / fatal if fatal else 0.0,
        repeat_share_dedup=st.share,
        returned_share=st.returned_share,
        top1pct_event_share=sum(top) / fatal if fatal else 0.0,
        repeats=st,
    )


if __name__ == "__main__":  # pragma: no cover
    print(titan_shape())
