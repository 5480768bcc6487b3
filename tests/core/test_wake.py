"""``TickResult.wake_at`` (core/wake.py) and ``loop.resample``: each time-driven rule's deadline, and that a
tick before ``wake_at`` on re-sampled observations changes nothing but the trend ring."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core import wake
from slurm_fleetyield.core.loop import resample, tick
from slurm_fleetyield.core.memories import Denial, LearnMemory, OpenProposal
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState

NOW = 1_000_000.0


def test_an_empty_state_never_wakes() -> None:
    assert wake.wake_at(ControllerState.empty(), Params(), NOW) == math.inf


def test_each_stored_deadline_contributes() -> None:
    p = Params()
    empty = ControllerState.empty()
    prop = OpenProposal("p-1", "n1", 0.3, NOW - 10, NOW + 500.0, below_since=NOW - 100.0)
    cases = {
        "proposal expiry": (dataclasses.replace(empty, proposals={"n1": prop}), NOW + 500.0),
        "withdrawal hysteresis": (
            dataclasses.replace(empty, proposals={"n1": dataclasses.replace(prop, expires_at=NOW + 1e6)}),
            NOW - 100.0 + p.gate.withdraw_after_s,
        ),
        "approved, held by a cap": (
            dataclasses.replace(empty, proposals={"n1": dataclasses.replace(prop, approved_by="a")}),
            NOW,
        ),
        "denial cooldown": (
            dataclasses.replace(empty, denials={"n1": Denial("p-1", NOW - 5.0, 0.3)}),
            NOW - 5.0 + p.gate.deny_cooldown_s,
        ),
        "drain rate window": (
            dataclasses.replace(empty, drain_times=(NOW - 1e6, NOW - 20.0)),
            NOW - 20.0 + p.quarantine.window_s,
        ),
        "learn due": (dataclasses.replace(empty, learn=LearnMemory(next_due=NOW + 77.0)), NOW + 77.0),
    }
    for name, (state, due) in cases.items():
        assert wake.wake_at(state, p, NOW) == due, name


def test_a_node_not_sampled_now_wakes_when_its_sample_goes_stale() -> None:
    f = Fleet(2)
    r = Runner(f)
    r.ticks(3)
    assert r.last is not None and r.last.wake_at > r.now  # sampled now: no staleness deadline
    f.nodes["gpu001"].sample_time = r.now
    r.tick()
    assert r.last.wake_at == r.now - r.step + Params().sense.stale_after_s


def test_a_skipped_resample_would_move_the_next_rate() -> None:
    """Why a skipped grid tick still moves the trend ring (``resample``): the rate of a burst after a quiet
    stretch reads the time of the last point (the 600 s window's divisor)."""

    def burst(skip: bool) -> float:
        f = Fleet(1)
        r = Runner(f, step=900.0)
        r.tick()
        if skip:
            r.now += 1800.0
        else:
            r.ticks(2)
        f.bump("gpu000", 0, s.COUNTER_CHANNELS[0], 5)
        return r.tick().risks["gpu000"].probability

    assert burst(skip=True) < burst(skip=False)


def _settle(r: Runner) -> None:
    for _ in range(6):
        if not r.tick(advance=False).plan.actions:
            return
    raise AssertionError("the fleet does not settle")


_FIELDS = (s.REMAP_PENDING, s.COUNTER_CHANNELS[0], s.COUNTER_CHANNELS[1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(1, 5),
    faults=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 7), st.sampled_from(_FIELDS), st.integers(1, 50)),
        max_size=6,
    ),
    push=st.one_of(st.none(), st.integers(0, 4)),
    steps=st.lists(st.sampled_from((30.0, 900.0, 3600.0)), min_size=1, max_size=4),
    frac=st.floats(0.0, 0.999),
    long_sense=st.booleans(),
)
def test_a_tick_before_wake_at_changes_only_the_trend_ring(
    nodes: int,
    faults: list[tuple[int, int, str, int]],
    push: int | None,
    steps: list[float],
    frac: float,
    long_sense: bool,
) -> None:
    """A fleet ticked a few times, with counters moving and maybe a fatal push, settled (a tick on the same
    observations without actions); a tick at any time before its ``wake_at`` on the same readings re-sampled
    gives no actions, the same decisions and risks, and the state ``resample`` computes."""
    params = Params(sense={"stale_after_s": 1e9}) if long_sense else Params()
    f = Fleet(nodes)
    r = Runner(f, params)
    r.tick()
    for i, step in enumerate(steps):
        for n, g, field, by in faults[i :: len(steps)]:
            f.bump(f"gpu{n % nodes:03d}", g, field, by)
        if push is not None and i == 0:
            f.push(f"gpu{push % nodes:03d}", 79, 0, r.now)
        r.step = step
        r.tick()
    _settle(r)
    last = r.last
    assert last is not None
    horizon = min(last.wake_at, r.now + 30 * 86_400.0)
    if horizon <= r.now:
        return  # a rule moves every tick: nothing to skip
    t = r.now + frac * (horizon - r.now)
    obs = f.observe(t)
    nxt = tick(r.state, obs, params, t, r.rng)
    assert not nxt.plan.actions
    assert dict(nxt.nodes) == dict(last.nodes)
    assert dict(nxt.risks) == dict(last.risks)
    assert nxt.state == resample(r.state, obs, params, t)
