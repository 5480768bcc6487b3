"""Fault model calibration: rates, class mix, lemon shape, precursor share over long runs."""

from __future__ import annotations

import random

import pytest

from slurm_fleetyield.sim import faults as fm


def long_plan(**kw: float) -> fm.FaultPlan:
    nodes = [f"n{i:04d}" for i in range(2000)]
    return fm.generate(nodes, 8, fm.FaultParams(**kw), 365 * fm.DAY, random.Random(3))


def test_fatal_rate_matches_configured_gpu_share_of_llama3() -> None:
    plan = long_plan()
    want = fm.LLAMA3_RATE_PER_1000_NODE_DAYS * fm.LLAMA3_GPU_SHARE  # 2.31 per 1,000 node-days
    got = plan.summary["fatal_per_1000_node_days"]
    assert got == pytest.approx(want, rel=0.08)


def test_meta_rsc_rate_and_class_mix() -> None:
    plan = long_plan(node_rate_per_1000_node_days=6.50)
    assert plan.summary["fatal_per_1000_node_days"] == pytest.approx(6.50 * fm.LLAMA3_GPU_SHARE, rel=0.08)
    fatal = [f for f in plan.faults if not f.quiet]
    share = sum(f.cls == "faulty_gpu" for f in fatal) / len(fatal)
    assert share == pytest.approx(148 / 256, abs=0.04)


def test_lemon_shape_gives_the_titan_repeat_share() -> None:
    # 3,000 nodes x 90 days: 36 lemon GPUs, ~620 fatal faults a seed; per-seed share sd ~0.014, so the
    # 40-seed mean has a standard error of ~0.002 and the bound below is ~3.5 of them. The raw Titan share
    # (0.185) or no lemons at all (~0.01) fail it.
    nodes = [f"n{i:04d}" for i in range(3000)]
    shares = []
    for seed in range(40):
        plan = fm.generate(nodes, 8, fm.FaultParams(), 90 * fm.DAY, random.Random(seed), repair_s=fm.DAY)
        shares.append(fm.repeat_share(plan.faults, repair_s=fm.DAY))
    assert pytest.approx(0.0715) == fm.TITAN_REPEAT_SHARE
    assert sum(shares) / len(shares) == pytest.approx(fm.TITAN_REPEAT_SHARE, abs=0.007)


def test_repeat_share_drops_faults_while_the_node_is_down() -> None:
    def f(i: int, t_h: float, node: str, gpu: int) -> fm.Fault:
        return fm.Fault(i, t_h * fm.HOUR, node, gpu, "hbm3", 48, False)

    faults = [f(0, 0, "a", 0), f(1, 5, "a", 0), f(2, 10, "a", 1), f(3, 30, "a", 0), f(4, 31, "b", 0)]
    # 1 and 2 fall in a's repair window (node DOWN): no events; 3 is a's GPU 0 back from repair: a repeat.
    assert fm.repeat_share(faults, repair_s=fm.DAY) == pytest.approx(1 / 3)
    assert fm.repeat_share(faults, repair_s=0.0) == pytest.approx(2 / 5)


def test_precursor_share_and_lead() -> None:
    plan = long_plan(precursor_share=0.5, lead_h=24.0)
    fatal = [f for f in plan.faults if not f.quiet]
    with_ep = [f for f in fatal if f.episode is not None]
    assert len(with_ep) / len(fatal) == pytest.approx(0.5, abs=0.05)
    leads = [(f.time - f.episode.start) / fm.HOUR for f in with_ep if f.episode.start > 0]
    assert min(leads) >= 12.0 and max(leads) <= 36.0
    assert all(f.episode is None for f in plan.faults if f.quiet)  # quiet corruption has no precursor


def test_episode_telemetry_escalates() -> None:
    ep = fm.Episode("n0", 0, 0.0, 40 * fm.HOUR, "hbm", 3, 1)
    early, mid, late = (fm.episode_fields(ep, t * fm.HOUR, True) for t in (5, 25, 35))
    assert early[fm.ROWS_CORR] < 11 <= mid[fm.ROWS_CORR]
    assert fm.REMAP_PENDING not in mid and late[fm.REMAP_PENDING] == 1.0
    assert late[fm.SBE_VOL] > mid[fm.SBE_VOL] > early[fm.SBE_VOL]


def test_bad_parameter_is_named() -> None:
    with pytest.raises(ValueError, match="precursor_share"):
        fm.FaultParams(precursor_share=1.5).validate()
