import math
import random

import pytest

from slurm_fleetyield.core import learn
from slurm_fleetyield.core.model import GpuRisk, Health, NodeDecision, NodeRisk, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.quarantine import Fatal
from slurm_fleetyield.core.state import LearnMemory

H = 7 * 86_400.0


def _fleet(n: int, p_gpu: float) -> tuple[dict, dict]:
    risks, decisions = {}, {}
    for i in range(n):
        name = f"n{i:04d}"
        gpus = tuple(GpuRisk(name, g, f"U-{name}-{g}", "H100", Health.OK, p_gpu) for g in range(8))
        risks[name] = NodeRisk(name, Health.OK, 1 - (1 - p_gpu) ** 8, gpus)
        decisions[name] = NodeDecision(name, Tier.GREEN, Health.OK, 0.0, (), (), 100, "IDLE", "r")
    return risks, decisions


def test_miscalibrated_prior_converges_to_the_true_rate_and_brier_improves():
    params = Params()
    base = params.risk.base_probability
    true_mult = 10.0  # the fleet fails 10x as often as the published rate says (a bad batch of boards)
    rng = random.Random(5)
    mem, now = LearnMemory(), 0.0
    window = []  # (brier_sum, resolved) after each horizon
    for _ in range(12):
        p_gpu = learn.adjust(base, mem.multipliers.get("base", 1.0))  # what core/risk.py would say
        risks, decisions = _fleet(3000, p_gpu)
        mem, _ = learn.learn(mem, risks, decisions, (), {}, params, now)  # open predictions
        fatal = []
        true_p = learn.adjust(base, true_mult)
        for name in risks:
            for g in range(8):
                if rng.random() < true_p:
                    fatal.append(Fatal(name, now + H / 2, "xid", f"{name}-{now}-{g}", "push", g, None, 79))
                    break
        mem, _ = learn.learn(mem, risks, decisions, tuple(fatal), {}, params, now + H / 2)
        now += H
        mem, cal = learn.learn(mem, {}, {}, (), {}, params, now)  # horizon passed: the rest resolve
        window.append((mem.brier_sum, mem.resolved))
    m = mem.multipliers["base"]
    assert m == pytest.approx(true_mult, rel=0.1)
    first = window[0][0] / window[0][1]
    last = (window[-1][0] - window[-6][0]) / (window[-1][1] - window[-6][1])
    assert last < first  # later predictions are scored better than the uncalibrated first ones
    assert cal.resolved == 12 * 3000 and math.isfinite(cal.brier)
    assert sum(b.count for b in cal.bins) == cal.resolved
    busy = max(cal.bins, key=lambda b: b.count)
    assert busy.observed_frequency == pytest.approx(busy.predicted_mean, rel=0.25)


def test_well_calibrated_model_stays_near_one():
    params = Params()
    base = params.risk.base_probability
    rng = random.Random(9)
    mem, now = LearnMemory(), 0.0
    for _ in range(20):
        risks, decisions = _fleet(600, learn.adjust(base, mem.multipliers.get("base", 1.0)))
        mem, _ = learn.learn(mem, risks, decisions, (), {}, params, now)
        fatal = [
            Fatal(n, now + 1, "xid", f"{n}-{now}", "push", 0, None, 79)
            for n in risks
            if rng.random() < 1 - (1 - base) ** 8
        ]
        mem, _ = learn.learn(mem, risks, decisions, tuple(fatal), {}, params, now + 1)
        now += H
        mem, _ = learn.learn(mem, {}, {}, (), {}, params, now)
    assert mem.multipliers["base"] == pytest.approx(1.0, abs=0.35)


def test_event_after_the_horizon_is_not_an_event_and_predictions_are_one_per_node():
    params = Params()
    risks, decisions = _fleet(3, 0.01)
    mem, _ = learn.learn(LearnMemory(), risks, decisions, (), {}, params, 0.0)
    assert len(mem.predictions) == 3
    mem2, _ = learn.learn(mem, risks, decisions, (), {}, params, 60.0)
    assert mem2.predictions == mem.predictions  # still open: not re-made
    late = (Fatal("n0000", H + 10, "xid", "k", "push", 0, None, 79),)
    _, cal = learn.learn(mem2, {}, {}, late, {}, params, H + 10)
    assert cal.resolved == 3 and sum(b.observed_frequency * b.count for b in cal.bins if b.count) == 0


def test_a_multiplier_is_republished_only_when_it_moved_past_the_tolerance():
    """The posterior mean drifts with every resolved prediction; each published change re-scores every GPU of
    its bucket, so a drift within ``publish_tolerance`` keeps the published value (the very mapping)."""
    lp = Params().learn
    assert lp.publish_tolerance == 0.02
    old = {"base": 2.0}
    prior = lp.prior_strength
    obs = {"base": prior}  # observed events: mean = (prior + prior) / (prior + e)
    e_near = {"base": 2 * prior / (2.0 * 1.01) - prior}
    assert learn._published(old, obs, e_near, lp) is old  # 1% move: kept
    e_far = {"base": 2 * prior / (2.0 * 1.03) - prior}
    far = learn._published(old, obs, e_far, lp)
    assert far is not old and far["base"] == pytest.approx(2.0 * 1.03)  # 3% move: published
    exact = Params(learn={"publish_tolerance": 0.0}).learn
    assert learn._published(old, obs, e_near, exact)["base"] == pytest.approx(2.0 * 1.01)
    new_bucket = learn._published(old, {**obs, "gpu_temp": 0.0}, {**e_near, "gpu_temp": 1.0}, lp)
    assert new_bucket["base"] == 2.0 and new_bucket["gpu_temp"] == pytest.approx(prior / (prior + 1.0))
    with pytest.raises(ValueError):
        Params(learn={"publish_tolerance": 1.0})


def test_no_lemon_stays_no_lemon_as_time_passes() -> None:
    """Over one fatal history, in any report order, ``is_lemon`` False at some time stays False at every
    later time (price re-prices only last tick's lemons when nothing but time moved: core/price.py)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from slurm_fleetyield.core.state import NodeMemory

    lp = Params(learn={"lemon_failures": 2, "lemon_window_s": 10_000.0, "lemon_dedup_s": 600.0}).learn
    times = st.lists(st.floats(0.0, 30_000.0, allow_nan=False), max_size=8)

    @settings(max_examples=400, deadline=None)
    @given(times, st.lists(st.floats(0.0, 40_000.0, allow_nan=False), min_size=2, max_size=6))
    def check(history: list[float], clock: list[float]) -> None:
        m = NodeMemory(Tier.GREEN, 0.0, "", fatal_history=tuple((t, "GPU-a") for t in history))
        top = max(history, default=0.0)
        verdicts = [learn.is_lemon(m, now, lp) for now in sorted(c for c in clock if c >= top)]
        assert verdicts == sorted(verdicts, reverse=True), verdicts  # True ... True, False ... False

    check()
