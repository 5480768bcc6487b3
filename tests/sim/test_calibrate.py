from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from slurm_fleetyield.sim.calibrate import (
    TITAN_CSV,
    CalibrationError,
    decay_fit,
    post_failure_hazard,
    repeat_stats,
    titan_shape,
)
from slurm_fleetyield.sim.faults import POST_RETURN_RR, TITAN_REPEAT_SHARE

# gc_full.csv's layout: stints carry insert..remove; a fatal row's remove is the logged event time; an event
# that ended no stint (or a second one at the same time) is a row of its own without insert.
TINY = """SN,location,insert,remove,duration,out,event
A,c0,2016-01-01 00:00:00,2016-03-01 00:00:00,5184000,FALSE,DBE
A,c0,,2016-03-01 05:00:00,,,OTB
A,c1,2016-04-01 00:00:00,2016-06-01 00:00:00,5270400,TRUE,DBE
B,c2,2016-01-01 00:00:00,2016-09-01 00:00:00,21081600,TRUE,OTB
B,c2,,2016-02-01 00:00:00,,,DBE
C,c3,2016-01-01 00:00:00,2016-05-01 00:00:00,10368000,TRUE,DBE
C,c3,,2016-05-01 00:00:00,,,OTB
C,c3,,2016-05-03 00:00:00,,,DBE
D,c4,2016-01-01 00:00:00,2019-08-01 20:07:33,113000000,FALSE,
"""
# A: DBE ends its stint, re-reported 5 h later (one failure), re-inserted in April, fails again: 1 repeat.
# B: DBE in February while the GPU stays in its slot, OTB ends the stint in September: 1 repeat, in place.
# C: DBE and a same-time OTB end the stint (one failure); a DBE two days later with no stint after the
#    first failure: a distinct failure without evidence of a return, not a repeat.
# D: never fails.


def rows(text: str = TINY) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_repeats_count_only_failures_after_a_return_to_service() -> None:
    s = repeat_stats(rows())
    assert (s.fatal_rows, s.rows_without_insert, s.re_reports) == (8, 4, 2)
    assert (s.distinct_failures, s.repeats, s.repeats_in_place, s.repeats_reinserted) == (6, 2, 1, 1)
    assert s.repeats_no_return == 1
    assert (s.failed_gpus, s.returned_gpus) == (3, 2)
    assert s.share == pytest.approx(2 / 6)


def test_dedup_window_decides_what_is_a_re_report() -> None:
    s = repeat_stats(rows(), dedup_s=3600.0)  # A's report 5 h later is now a failure of its own
    assert (s.re_reports, s.distinct_failures) == (1, 7)
    # A's second report has no stint after it and no stint covering +1 h: no evidence of a return.
    assert (s.repeats, s.repeats_no_return) == (2, 2)
    wide = repeat_stats(rows(), dedup_s=7 * 86_400.0)  # C's DBE two days later joins its failure
    assert (wide.re_reports, wide.distinct_failures, wide.repeats_no_return) == (3, 5, 0)


def test_bad_rows_are_named() -> None:
    with pytest.raises(CalibrationError, match="row 2: remove='03/01/2016'"):
        repeat_stats(rows(TINY.replace("2016-03-01 05:00:00", "03/01/2016")))
    with pytest.raises(CalibrationError, match="row 1: stint of A"):
        repeat_stats(rows(TINY.replace("2016-03-01 00:00:00,5184000", "2015-03-01 00:00:00,5184000")))
    with pytest.raises(CalibrationError, match="dedup_s"):
        repeat_stats(rows(), dedup_s=-1.0)


@pytest.mark.skipif(not Path(TITAN_CSV).exists(), reason="shared data not mounted")
def test_titan_shape_matches_the_data_readme_and_the_fault_model() -> None:
    s = titan_shape()
    assert (s.rows, s.dbe, s.otb) == (37_343, 4_826, 1_541)
    assert s.repeat_share_raw == pytest.approx(0.185, abs=0.001)  # shared/data/README.md: raw rows per SN
    r = s.repeats
    assert (r.rows_without_insert, r.re_reports, r.distinct_failures, r.repeats) == (1_158, 770, 5_597, 400)
    assert (r.repeats_in_place, r.repeats_reinserted, r.failed_gpus, r.returned_gpus) == (314, 86, 5_190, 495)
    assert s.repeat_share_dedup == pytest.approx(TITAN_REPEAT_SHARE, abs=0.0005)  # the fault model's target


# --- post_failure_hazard: hazard after a return to service, and its decay fit ---


def _day(d: float) -> str:
    return (datetime(2016, 1, 1) + timedelta(days=d)).strftime("%Y-%m-%d %H:%M:%S")


def _stint(sn: str, a: float, b: float, event: str = "") -> str:
    return f"{sn},c,{_day(a)},{_day(b)},{(b - a) * 86400:.0f},FALSE,{event}\n"


def _report(sn: str, d: float, event: str = "DBE") -> str:
    return f"{sn},c,,{_day(d)},,,{event}\n"


HEADER = "SN,location,insert,remove,duration,out,event\n"
# Days from 2016-01-01.
# A: fails at the end of [0, 100], re-inserted at 130, fails at 135: service age 5 at its second failure.
# B: stays in its slot [0, 300] after a DBE at 50 re-reported at 50.5; the clock starts one day after the last
#    report (51.5); the OTB that ends the stint at 300 is at age 248.5.
# C: in place after a DBE at 180 in [0, 200]: 19 days from 181, censored.
# D: never fails in [0, 1000]. E: fails at the end of [0, 400] and never comes back.
HAZARD_CSV = (
    HEADER
    + _stint("A", 0, 100, "DBE")
    + _stint("A", 130, 135, "DBE")
    + _stint("B", 0, 300, "OTB")
    + _report("B", 50)
    + _report("B", 50.5, "OTB")
    + _stint("C", 0, 200)
    + _report("C", 180)
    + _stint("D", 0, 1000)
    + _stint("E", 0, 400, "OTB")
)


def test_hazard_counts_service_days_since_the_return_by_bin() -> None:
    h = post_failure_hazard(rows(HAZARD_CSV))
    # never failed: service before each first failure, A 100 + B 50 + C 180 + D 1000 + E 400 days; 4 failures
    assert (h.base_events, h.base_gpu_days) == (4, pytest.approx(1730.0))
    assert (h.returned_gpus, h.events, h.gpu_days) == (3, 2, pytest.approx(5 + 248.5 + 19))
    assert [(b.lo_days, b.hi_days, b.events) for b in h.bins] == [
        (0, 7, 1),
        (7, 30, 0),
        (30, 90, 0),
        (90, math.inf, 1),
    ]
    assert [b.gpu_days for b in h.bins] == pytest.approx([5 + 7 + 7, 23 + 12, 60, 158.5])
    assert h.bins[0].relative == pytest.approx((1 / 19) / (4 / 1730))
    assert h.returned_gpus == repeat_stats(rows(HAZARD_CSV)).returned_gpus  # one definition of a return
    assert h.fit is not None and h.fit_floor is not None


def test_hazard_can_count_one_kind_of_return() -> None:
    re = post_failure_hazard(rows(HAZARD_CSV), returns=("re-inserted",))
    assert (re.returned_gpus, re.events, re.gpu_days, re.bins[0].events) == (1, 1, pytest.approx(5.0), 1)
    assert re.bins[0].relative == pytest.approx((1 / 5) / (4 / 1730))
    assert math.isnan(re.bins[1].relative)  # no exposure
    inp = post_failure_hazard(rows(HAZARD_CSV), returns=("in place",))
    assert (inp.returned_gpus, inp.events, inp.gpu_days) == (2, 1, pytest.approx(248.5 + 19))
    assert (inp.base_events, inp.base_gpu_days) == (4, pytest.approx(1730.0))  # the reference does not change


def test_hazard_rejects_bad_arguments() -> None:
    with pytest.raises(CalibrationError, match="returns"):
        post_failure_hazard(rows(HAZARD_CSV), returns=("repaired",))
    with pytest.raises(CalibrationError, match="bins_days"):
        post_failure_hazard(rows(HAZARD_CSV), bins_days=(0, 30, 7))
    with pytest.raises(CalibrationError, match="nothing to fit"):
        decay_fit({0: 10.0}, {}, 0.01)
    with pytest.raises(CalibrationError, match="base_per_day"):
        decay_fit({0: 10.0}, {0: 1.0}, 0.0)


def _expected(h: float, c0: float, floor: float, base: float, days: int, scale: float) -> dict[int, float]:
    return {i: scale * base * math.exp(floor + c0 * 2 ** (-(i + 0.5) / h)) for i in range(days)}


@pytest.mark.parametrize("floor", [0.0, 0.7])
def test_decay_fit_recovers_the_curve_its_data_was_made_from(floor: float) -> None:
    # Events equal to their expectation in every cell: the likelihood is maximal at the true parameters.
    base, exposure = 1e-3, {i: 500.0 for i in range(400)}
    events = _expected(20.0, 4.0, floor, base, 400, 500.0)
    f = decay_fit(exposure, events, base, floor=floor > 0)
    assert (f.half_life_days, f.c0, f.floor) == pytest.approx((20.0, 4.0, floor), abs=1e-3)
    lo, hi = f.ci_days
    assert lo < 20.0 < hi and not f.at_edge
    four = decay_fit(
        {i: 4 * x for i, x in exposure.items()}, {i: 4 * e for i, e in events.items()}, base, floor=floor > 0
    )
    assert four.half_life_days == pytest.approx(20.0, abs=1e-3)
    assert (four.ci_days[1] - four.ci_days[0]) < 0.6 * (hi - lo)  # 4x the data: about half as wide
    assert not floor or decay_fit(exposure, events, base).log_lik < f.log_lik  # a floor the model must fit


def test_decay_fit_interval_is_where_the_profile_drops_by_the_chi_square_cut() -> None:
    base, exposure = 1e-3, {i: 200.0 for i in range(300)}
    f = decay_fit(exposure, _expected(15.0, 3.0, 0.0, base, 300, 200.0), base)
    for bound in f.ci_days:
        at = decay_fit(
            exposure,
            _expected(15.0, 3.0, 0.0, base, 300, 200.0),
            base,
            half_life_range=(bound, bound * 1.0001),
        )
        assert f.log_lik - at.log_lik == pytest.approx(1.9207, abs=0.01)


def test_hazard_fit_recovers_the_half_life_from_a_csv_drawn_at_its_quantiles() -> None:
    # 300 GPUs fail after 1,000 service days (never-failed rate 1e-3/day), are re-inserted 10 days later and
    # fail again at the quantiles (j + 0.5) / 300 of hazard 1e-3 * exp(4 * 2^(-t / 20 d)), censored at 365 d.
    step = 0.01
    cum = list(
        itertools.accumulate(
            1e-3 * math.exp(4.0 * 2 ** (-(k + 0.5) * step / 20.0)) * step for k in range(36_500)
        )
    )
    text = HEADER
    for j in range(300):
        k = bisect.bisect_left(cum, -math.log(1 - (j + 0.5) / 300))
        text += _stint(f"G{j}", 0, 1000, "DBE")
        text += (
            _stint(f"G{j}", 1010, 1010 + (k + 1) * step, "DBE")
            if k < len(cum)
            else _stint(f"G{j}", 1010, 1375)
        )
    h = post_failure_hazard(rows(text))
    assert (h.base_per_day, h.returned_gpus) == (pytest.approx(1e-3), 300)
    assert h.fit is not None and h.fit.half_life_days == pytest.approx(20.0, rel=0.05)
    assert h.fit.c0 == pytest.approx(4.0, rel=0.05)
    assert h.fit.ci_days[0] < 20.0 < h.fit.ci_days[1]


@pytest.mark.skipif(not Path(TITAN_CSV).exists(), reason="shared data not mounted")
def test_titan_hazard_reproduces_the_stop_11_fit_and_refits_with_all_returns() -> None:
    all_rows = rows(Path(TITAN_CSV).read_text())
    # Stop 11: rows without insert dropped, re-insertions (188 GPUs there: one more, with overlapping stints)
    old = post_failure_hazard([r for r in all_rows if r["insert"]])
    assert (old.returned_gpus, old.events, old.base_events) == (187, 70, 5_127)
    assert [b.events for b in old.bins] == [25, 13, 8, 24]
    assert old.fit is not None and old.fit.half_life_days == pytest.approx(22.0, abs=0.5)
    assert old.fit.ci_days == pytest.approx((13.0, 36.5), abs=0.5)
    new = post_failure_hazard(all_rows)
    assert (new.returned_gpus, new.events, new.base_events) == (495, 342, 5_190)
    assert [b.events for b in new.bins] == [136, 93, 75, 38]
    assert new.fit is not None and new.fit.half_life_days == pytest.approx(80.0, abs=0.5)
    assert new.fit.ci_days == pytest.approx((68.0, 94.4), abs=0.5)
    # the simulator's --post-return constants (sim/faults.py POST_RETURN_RR) are these fits
    assert new.fit_floor is not None
    for kind, fit in (("titan", new.fit), ("titan-floor", new.fit_floor)):
        floor, c0, half_life = POST_RETURN_RR[kind]
        assert (floor, c0, half_life) == pytest.approx((fit.floor, fit.c0, fit.half_life_days), abs=0.01)
