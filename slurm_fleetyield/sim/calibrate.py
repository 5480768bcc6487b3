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

Hazard after a return (``post_failure_hazard``; ``python -m slurm_fleetyield.sim.calibrate`` prints it):
second distinct failures by service days since the return after the first, relative to never-failed GPUs
(5,190 first failures in 100,555 GPU-years), and the Poisson fit RR(t) = exp(c0 x 2^(-t/H)) that
``risk.history_decay`` implements (``core/params.py``: ``risk.single_fault_half_life_days``). All 495 returns
(in place and re-inserted): 342 second failures in 87,351 GPU-days; x342 at 0-7 d (136), x106 at 7-30 d (93),
x48 at 30-90 d (75), x4.0 after (38); H = 80.0 d, 95% profile likelihood 68.0-94.4 d, c0 5.78. Kept in place
only: 325 GPUs, 279 failures (86% failed again), H = 140.5 d (114.9-173.3). Re-insertions only: 170 GPUs, 63
failures (37%), H = 6.8 d (3.0-13.1). The stop-11 method (rows without ``insert`` dropped, so every return is
a re-insertion): 187 GPUs, 70 failures in 59,594 GPU-days, H = 22.2 d (13.0-36.7), c0 5.60; stop 11 counted
188 and 60,092 GPU-days because one GPU's overlapping stints (SN 0323812008256) made it look returned. A
constant floor fits better in every case (all returns: exp(1.33 + 4.57 x 2^(-t/48.9 d)), 38.9-61.6 d,
log-likelihood +15.0 for one more parameter): the excess does not fade to zero in the data; the rule's shape
assumes it does.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click

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
    stints, reports, fatal_rows, no_insert = _read(rows, dedup_s)
    re_reports = repeats = in_place = reinserted = no_return = returned_gpus = distinct = 0
    for sn, times in reports.items():
        chains = _failures(times, dedup_s)
        re_reports += len(times) - len(chains)
        failures = [c[0] for c in chains]
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


def _read(
    rows: Iterable[Mapping[str, str]], dedup_s: float
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[float]], int, int]:
    """Stints (insert, remove) and fatal report times per SN, fatal rows, fatal rows without insert."""
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
    return stints, reports, fatal_rows, no_insert


def _failures(times: list[float], dedup_s: float) -> list[list[float]]:
    """One GPU's report times grouped into distinct failures (rule 2): each a chain of reports, each report
    within ``dedup_s`` of the previous one."""
    chains: list[list[float]] = []
    for t in sorted(times):
        if chains and t - chains[-1][-1] <= dedup_s:
            chains[-1].append(t)
        else:
            chains.append([t])
    return chains


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


# --- Hazard of a second failure after a return to service, and its decay ---

RETURNS = ("in place", "re-inserted")  # _returned's kinds of return to service
HAZARD_BINS_DAYS = (0.0, 7.0, 30.0, 90.0)  # service days since the return; the last bin is open
HALF_LIFE_RANGE_DAYS = (0.5, 1000.0)  # where the profile likelihood is searched
CHI2_1_95_HALF = 1.920729410347062  # half the 95% quantile of chi-square(1): the profile-likelihood drop
_DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class HazardBin:
    lo_days: float
    hi_days: float  # math.inf for the open last bin
    events: int  # second distinct failures at a service age in [lo, hi)
    gpu_days: float  # service time of returned GPUs at ages in [lo, hi)
    relative: float  # (events / gpu_days) / never-failed rate; nan without exposure


@dataclass(frozen=True, slots=True)
class DecayFit:
    """Poisson maximum-likelihood fit of RR(t) = exp(floor + c0 * 2^(-t / half_life_days)), t = service days
    since the return; ``floor`` is 0 unless fitted. ``ci_days``: 95% profile-likelihood interval of the
    half-life (0.0 / math.inf where the profile does not drop by 1.92 inside HALF_LIFE_RANGE_DAYS)."""

    half_life_days: float
    c0: float
    floor: float
    log_lik: float  # up to a constant (the same for every fit of the same data)
    ci_days: tuple[float, float]
    at_edge: bool  # the maximum is at an end of the searched range: no interior optimum

    def rr(self, t_days: float) -> float:
        return math.exp(self.floor + self.c0 * 2.0 ** (-t_days / self.half_life_days))


@dataclass(frozen=True, slots=True)
class PostFailureHazard:
    returns: tuple[str, ...]  # which kinds of return to service were counted
    base_events: int  # first distinct failures (all failed GPUs)
    base_gpu_days: float  # service time before each GPU's first distinct failure (never-failed exposure)
    returned_gpus: int  # GPUs back in service after their first failure, by a counted kind of return
    events: int  # their second distinct failures
    gpu_days: float  # their service time from the return to the second failure (or the end of the data)
    bins: tuple[HazardBin, ...]
    fit: DecayFit | None  # no floor: RR -> 1 (the shape core/risk.py's decay implements); None without events
    fit_floor: DecayFit | None  # the floor fitted as well

    @property
    def base_per_day(self) -> float:
        return self.base_events / self.base_gpu_days if self.base_gpu_days else 0.0


def post_failure_hazard(
    rows: Iterable[Mapping[str, str]],
    dedup_s: float = DEDUP_S,
    returns: Iterable[str] = RETURNS,
    bins_days: Iterable[float] = HAZARD_BINS_DAYS,
    half_life_range: tuple[float, float] = HALF_LIFE_RANGE_DAYS,
) -> PostFailureHazard:
    """Hazard of a GPU's second distinct failure by service days since its return to service after the first,
    relative to never-failed GPUs, and its exponential-decay fit (``decay_fit``).

    Failures, re-reports and returns follow ``repeat_stats``' rule (module docstring). The clock starts when
    the GPU is back and its first failure is over: for one that stayed in place, one ``dedup_s`` after the
    failure's last report (earlier, a report would be a re-report of the same failure); for a re-inserted
    one, at the first re-insertion after the failure (not before the same point). Only service time counts
    (time in a slot: stints, overlaps merged); the exposure ends at the second failure or the GPU's last
    stint. Never-failed rate: first distinct failures over service time before each GPU's first failure."""
    kinds = tuple(returns)
    if not kinds or set(kinds) - set(RETURNS):
        raise CalibrationError(f"returns={kinds!r}: choose from {RETURNS!r}")
    edges = tuple(float(b) for b in bins_days)
    if not edges or edges[0] != 0.0 or any(b <= a for a, b in itertools.pairwise(edges)):
        raise CalibrationError(f"bins_days={edges!r} must start at 0 and increase")
    stints, reports, _, _ = _read(rows, dedup_s)
    base_s = 0.0
    base_events = returned = 0
    spans: list[tuple[float, float]] = []  # service ages (days) of returned GPUs
    ages: list[float] = []  # service age (days) at each second failure
    for sn in sorted(stints.keys() | reports.keys()):  # a fixed order: the same sums on every run
        raw = stints.get(sn, [])
        merged = _merge(raw)
        chains = _failures(reports.get(sn, []), dedup_s)
        first = chains[0][0] if chains else math.inf
        base_s += sum(max(0.0, min(b, first) - a) for a, b in merged)
        if not chains:
            continue
        base_events += 1
        nxt = chains[1][0] if len(chains) > 1 else math.inf
        back = _returned(raw, first, nxt, dedup_s)
        if back not in kinds:
            continue
        returned += 1
        start = chains[0][-1] + dedup_s
        if back == "re-inserted":
            start = max(start, min(a for a, _ in raw if first < a <= nxt))
        age = 0.0
        for a, b in merged:
            lo, hi = max(a, start), min(b, nxt)
            if hi > lo:
                spans.append((age, age + (hi - lo) / _DAY))
                age += (hi - lo) / _DAY
        if nxt < math.inf:
            ages.append(age)
    base = base_events / (base_s / _DAY) if base_s else 0.0
    bins = []
    for lo, hi in zip(edges, (*edges[1:], math.inf), strict=True):
        days = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)
        n = sum(lo <= t < hi for t in ages)
        bins.append(HazardBin(lo, hi, n, days, n / days / base if days and base else math.nan))
    exposure: dict[int, float] = {}
    for a, b in spans:  # 1-day cells of service age, as the stop-11 fit
        t = a
        while t < b:
            nxt_t = min(b, math.floor(t) + 1.0)
            exposure[int(t)] = exposure.get(int(t), 0.0) + nxt_t - t
            t = nxt_t
    events: dict[int, float] = {}
    for t in ages:
        events[int(t)] = events.get(int(t), 0.0) + 1.0
    fits = [
        decay_fit(exposure, events, base, floor=f, half_life_range=half_life_range) if ages and base else None
        for f in (False, True)
    ]
    return PostFailureHazard(
        kinds,
        base_events,
        base_s / _DAY,
        returned,
        len(ages),
        sum(b - a for a, b in spans),
        tuple(bins),
        *fits,
    )


def _merge(stints: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(stints):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def decay_fit(
    exposure: Mapping[int, float],
    events: Mapping[int, float],
    base_per_day: float,
    *,
    floor: bool = False,
    half_life_range: tuple[float, float] = HALF_LIFE_RANGE_DAYS,
) -> DecayFit:
    """Maximum-likelihood fit of RR(t) = exp(floor + c0 * 2^(-t/H)) to events and GPU-days in 1-day cells of
    service age (cell i: ages [i, i+1), RR taken at i + 0.5), Poisson with mean base_per_day * GPU-days * RR;
    the never-failed rate is taken as known. For each H, c0 (and the floor) are exact maximisers of a concave
    likelihood (safeguarded Newton); H is profiled on a log grid refined by golden section, and the 95%
    interval is where the profile is within 1.92 of its maximum (bisection). Pure Python."""
    lo_h, hi_h = half_life_range
    if not 0 < lo_h < hi_h < math.inf:
        raise CalibrationError(f"half_life_range={half_life_range!r} must be 0 < low < high")
    if not base_per_day > 0:
        raise CalibrationError(f"base_per_day={base_per_day!r} must be > 0")
    cells = sorted(set(exposure) | set(events))
    if any(c < 0 for c in cells) or any(v < 0 for v in (*exposure.values(), *events.values())):
        raise CalibrationError("cells, GPU-days and events must be >= 0")
    t = [c + 0.5 for c in cells]
    x = [base_per_day * exposure.get(c, 0.0) for c in cells]
    e = [events.get(c, 0.0) for c in cells]
    if not sum(e) > 0 or not sum(x) > 0:
        raise CalibrationError("nothing to fit: no events or no exposure")
    profile = _Profile(t, x, e, floor)
    grid = [lo_h * (hi_h / lo_h) ** (k / 160) for k in range(161)]
    lls = [profile(h)[0] for h in grid]
    k = max(range(len(grid)), key=lls.__getitem__)
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    h = _golden(lambda v: profile(v)[0], a, b)
    best, c0, f = profile(h)
    if lls[k] > best:  # the grid point beats the refinement (flat or edge)
        h, (best, c0, f) = grid[k], profile(grid[k])
    cut = best - CHI2_1_95_HALF

    def bound(side: range) -> float:
        inside = h
        for j in side:
            if lls[j] < cut:
                return _bisect(lambda v: profile(v)[0] - cut, inside, grid[j])
            inside = grid[j]
        return 0.0 if side.step < 0 else math.inf

    ci = (bound(range(k - 1, -1, -1)), bound(range(k + 1, len(grid))))
    return DecayFit(h, c0, f, best, ci, at_edge=k in (0, len(grid) - 1))


class _Profile:
    """Log-likelihood maximised over c0 (and the floor) for a given half-life H."""

    def __init__(self, t: list[float], x: list[float], e: list[float], floor: bool) -> None:
        self.t, self.x, self.e, self.floor = t, x, e, floor
        self.n = sum(e)

    def __call__(self, h: float) -> tuple[float, float, float]:
        g = [2.0 ** (-ti / h) for ti in self.t]
        eg = sum(ei * gi for ei, gi in zip(self.e, g, strict=True))

        def score(c: float) -> tuple[float, float]:  # d/dc and d2/dc2 of the (profiled) log-likelihood
            w = [xi * math.exp(c * gi) for xi, gi in zip(self.x, g, strict=True)]
            s0 = sum(w)
            s1 = sum(wi * gi for wi, gi in zip(w, g, strict=True))
            s2 = sum(wi * gi * gi for wi, gi in zip(w, g, strict=True))
            if not self.floor:
                return eg - s1, -s2
            m = s1 / s0
            return eg - self.n * m, -self.n * (s2 / s0 - m * m)

        c = _root(score)
        s0 = sum(xi * math.exp(c * gi) for xi, gi in zip(self.x, g, strict=True))
        f = math.log(self.n / s0) if self.floor else 0.0
        ll = f * self.n + c * eg - (self.n if self.floor else s0)
        return ll, c, f


def _root(score: Callable[[float], tuple[float, float]], cap: float = 300.0) -> float:
    """Root of a decreasing function: safeguarded Newton on an expanding bracket (the cap when none)."""
    lo, hi = -1.0, 1.0
    while score(lo)[0] < 0 and lo > -cap:
        lo *= 2
    while score(hi)[0] > 0 and hi < cap:
        hi *= 2
    if score(lo)[0] < 0:
        return lo
    if score(hi)[0] > 0:
        return hi
    c = 0.5 * (lo + hi)
    for _ in range(200):
        s, d = score(c)
        if abs(s) <= 1e-10 * (1.0 + abs(d)) or hi - lo < 1e-12:
            return c
        if s > 0:
            lo = c
        else:
            hi = c
        step = c - s / d if d < 0 else math.nan
        c = step if lo < step < hi else 0.5 * (lo + hi)
    return c


def _golden(fn: Callable[[float], float], a: float, b: float, tol: float = 1e-5) -> float:
    """Maximiser of fn on [a, b] by golden section in log space."""
    r = (math.sqrt(5.0) - 1.0) / 2.0
    la, lb = math.log(a), math.log(b)
    lc, ld = lb - r * (lb - la), la + r * (lb - la)
    fc, fd = fn(math.exp(lc)), fn(math.exp(ld))
    while lb - la > tol:
        if fc >= fd:
            lb, ld, fd = ld, lc, fc
            lc = lb - r * (lb - la)
            fc = fn(math.exp(lc))
        else:
            la, lc, fc = lc, ld, fd
            ld = la + r * (lb - la)
            fd = fn(math.exp(ld))
    return math.exp(0.5 * (la + lb))


def _bisect(fn: Callable[[float], float], inside: float, outside: float) -> float:
    """Where fn (>= 0 at ``inside``, < 0 at ``outside``) crosses 0, in log space."""
    a, b = math.log(inside), math.log(outside)
    for _ in range(40):
        m = 0.5 * (a + b)
        if fn(math.exp(m)) >= 0:
            a = m
        else:
            b = m
    return math.exp(0.5 * (a + b))


def _rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _print_hazard(title: str, h: PostFailureHazard) -> None:
    click.echo(f"\n{title}")
    click.echo(
        f"  never failed: {h.base_events:,} first failures / {h.base_gpu_days / 365.25:,.0f} GPU-years"
        f" = {h.base_per_day * 1e5:.2f}e-5 per GPU-day"
    )
    click.echo(
        f"  returned GPUs {h.returned_gpus:,}; second failures {h.events} in {h.gpu_days:,.0f} GPU-days"
        f" (x{h.events / h.gpu_days / h.base_per_day:.1f} overall)"
        if h.gpu_days
        else ""
    )
    for b in h.bins:
        span = f"{b.lo_days:g}-{b.hi_days:g} d" if b.hi_days < math.inf else f">{b.lo_days:g} d"
        click.echo(f"  {span:>9}: {b.events:3d} / {b.gpu_days:9,.0f} GPU-days  x{b.relative:.1f}")
    for name, fit in (("no floor (RR -> 1)", h.fit), ("with floor", h.fit_floor)):
        if fit is None:
            continue
        lo, hi = fit.ci_days
        click.echo(
            f"  fit {name}: RR(t) = exp({fit.floor:.2f} + {fit.c0:.2f} x 2^(-t/{fit.half_life_days:.1f} d)),"
            f" 95% profile {lo:.1f}-{hi:.1f} d, log-lik {fit.log_lik:.2f}"
            f"{' (maximum at the edge of the range)' if fit.at_edge else ''}"
        )


@click.command()
@click.option("--path", default=TITAN_CSV, show_default=True, help="Titan gc_full.csv.")
@click.option("--dedup-s", default=DEDUP_S, show_default=True, help="Re-report window (seconds).")
def main(path: str, dedup_s: float) -> None:  # pragma: no cover - prints the module's measurements
    """Titan's failure shape (titan_shape) and the hazard after a return to service (post_failure_hazard)."""
    rows = _rows(path)
    click.echo(titan_shape(path, dedup_s))
    _print_hazard(
        "Stop-11 method: rows without insert dropped, re-insertions",
        post_failure_hazard([r for r in rows if (r.get("insert") or "").strip()], dedup_s),
    )
    _print_hazard(
        "Re-insertions only (all rows)", post_failure_hazard(rows, dedup_s, returns=("re-inserted",))
    )
    _print_hazard("Kept in place only (all rows)", post_failure_hazard(rows, dedup_s, returns=("in place",)))
    _print_hazard("All returns to service (in place + re-inserted)", post_failure_hazard(rows, dedup_s))


if __name__ == "__main__":  # pragma: no cover
    main()
