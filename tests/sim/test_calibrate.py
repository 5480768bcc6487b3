from __future__ import annotations

from pathlib import Path

import pytest

from slurm_fleetyield.sim.calibrate import TITAN_CSV, titan_shape


@pytest.mark.skipif(not Path(TITAN_CSV).exists(), reason="shared data not mounted")
def test_titan_shape_matches_the_data_readme() -> None:
    s = titan_shape()
    assert (s.rows, s.dbe, s.otb) == (37_343, 4_826, 1_541)
    assert s.repeat_share == pytest.approx(0.185, abs=0.001)
