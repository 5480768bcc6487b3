from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from slurm_fleetyield.sim.calibrate import TITAN_CSV, CalibrationError, repeat_stats, titan_shape
from slurm_fleetyield.sim.faults import TITAN_REPEAT_SHARE

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
