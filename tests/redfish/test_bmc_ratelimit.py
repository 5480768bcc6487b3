"""adapters/bmc_ratelimit.py: the fleet-wide token bucket, in process and shared through a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket


def test_n_per_window_then_refill() -> None:
    t = [0.0]
    b = TokenBucket(3, 600.0, clock=lambda: t[0])
    assert [b.take() for _ in range(3)] == [None, None, None]
    limited = b.take()
    assert limited is not None and limited.retry_in_s == pytest.approx(200.0)
    assert "3 power actions per 600s" in str(limited)
    t[0] += 199.0
    assert b.take() is not None  # a refused take consumes nothing
    t[0] += 1.0
    assert b.take() is None
    t[0] += 10_000.0
    assert b.available() == 3.0  # never more than the burst


def test_clock_stepping_back_mints_nothing() -> None:
    t = [1000.0]
    b = TokenBucket(1, 60.0, clock=lambda: t[0])
    assert b.take() is None
    t[0] = 0.0
    assert b.take() is not None


def test_file_state_is_shared_between_processes(tmp_path: Path) -> None:
    t = [50.0]
    path = tmp_path / "gate" / "bmc-ratelimit.json"
    daemon = TokenBucket(2, 600.0, state_path=path, clock=lambda: t[0])
    suspend_program = TokenBucket(2, 600.0, state_path=path, clock=lambda: t[0])
    assert daemon.take() is None
    assert suspend_program.take() is None
    assert daemon.take() is not None and suspend_program.take() is not None
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_corrupt_file_is_a_full_bucket_never_more(tmp_path: Path) -> None:
    path = tmp_path / "rl.json"
    path.write_text("{not json")
    b = TokenBucket(2, 600.0, state_path=path, clock=lambda: 0.0)
    assert [b.take(), b.take()] == [None, None]
    assert b.take() is not None


@pytest.mark.parametrize("actions,window", [(0, 60.0), (1, 0.0), (1, float("inf"))])
def test_bad_parameters(actions: int, window: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(actions, window)
