import math
import random

import pytest

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import Health
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.risk import Scorer, compile_signals, logit, signal_values


def test_quiet_gpu_has_base_probability_and_node_combines():
    r = Runner(Fleet(1))
    res = r.tick()
    nr = res.risks["gpu000"]
    base = Params().risk.base_probability
    assert all(g.probability == base for g in nr.gpus)
    assert nr.probability == pytest.approx(1 - (1 - base) ** 8)
    assert nr.health is Health.OK


def test_remap_pending_makes_gpu_warn_with_explained_contribution():
    f = Fleet(1)
    f.set("gpu000", 4, s.REMAP_PENDING, 1)
    res = Runner(f).tick()
    g = res.risks["gpu000"].gpus[4]
    assert [c.signal for c in g.contributions] == ["remap_pending"]
    assert g.probability == pytest.approx(1 / (1 + math.exp(-(logit(Params().risk.base_probability) + 3.5))))
    assert g.health is Health.WARN
    assert res.risks["gpu000"].health is Health.WARN


def test_superbench_boundary_for_correctable_rows():
    f = Fleet(2)
    f.set("gpu000", 0, s.ROWS_CORR, 10)
    f.set("gpu001", 0, s.ROWS_CORR, 11)
    res = Runner(f).tick()
    assert res.risks["gpu000"].gpus[0].contributions[0].weight == 1.0
    assert res.risks["gpu001"].gpus[0].contributions[0].weight == 3.5


def test_remap_failure_is_red():
    f = Fleet(1)
    f.set("gpu000", 1, s.REMAP_FAILURE, 1)
    res = Runner(f).tick()
    assert res.risks["gpu000"].health is Health.BAD
    assert res.risks["gpu000"].probability >= Params().risk.red_threshold


def test_a_driver_recovery_action_is_red_and_none_or_absent_adds_nothing():
    # nvmlDeviceGpuRecoveryAction_t: 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset
    for action in (1, 2, 3, 4):
        f = Fleet(1)
        f.set("gpu000", 2, s.RECOVERY_ACTION, action)
        r = Runner(f).tick().risks["gpu000"]
        assert r.probability >= Params().risk.red_threshold, (action, r.probability)
        assert [c.signal for c in r.gpus[2].contributions] == ["recovery_action"]
    f = Fleet(1)
    f.set("gpu000", 2, s.RECOVERY_ACTION, 0)
    assert Runner(f).tick().risks["gpu000"].gpus[2].contributions == ()  # 0: none requested
    assert Runner(Fleet(1)).tick().risks["gpu000"].gpus[2].contributions == ()  # pre-R570: not reported


def test_disabled_signal_and_zero_weight_do_not_contribute():
    f = Fleet(1)
    f.set("gpu000", 0, s.REMAP_PENDING, 1)
    off = Params.model_validate({"risk": {"signals": [n for n in s.SIGNAL_NAMES if n != "remap_pending"]}})
    muted = Params.model_validate({"risk": {"weights": {"remap_pending": 0}}})
    for p in (off, muted):
        assert Runner(Fleet(1), p).tick().risks["gpu000"].gpus[0].contributions == ()
        assert Runner(f, p).tick().risks["gpu000"].gpus[0].contributions == ()


def test_nonfatal_xid_is_risk_only():
    f = Fleet(1)
    r = Runner(f)
    r.tick()
    f.xid("gpu000", 5, 13, 3)
    res = r.tick()
    g = res.risks["gpu000"].gpus[5]
    assert [(c.signal, c.value) for c in g.contributions] == [("xid_nonfatal", 3.0)]
    assert res.plan.of_kind("drain") == ()


def test_repeat_offender_raises_risk_of_that_gpu_more_than_siblings():
    f = Fleet(4)
    r = Runner(f)
    r.tick()
    f.push("gpu000", 79, 3, r.now)
    r.tick()
    f.drain_by_admin("gpu000", "")  # stays drained by us; then the admin resumes it
    f.slurm_update("gpu000", states=frozenset({"IDLE"}), reason="")
    res = r.tick()
    gpus = res.risks["gpu000"].gpus
    assert {c.signal for c in gpus[3].contributions} >= {"gpu_repeat_offender"}
    assert {c.signal for c in gpus[0].contributions} == {"node_repeat_offender"}
    assert gpus[3].probability > gpus[0].probability


def test_fast_scorer_agrees_with_obvious_path():
    rng = random.Random(3)
    f = Fleet(20)
    r = Runner(f)
    r.tick()
    for _ in range(5):
        for n in f.nodes:
            for gi in range(8):
                for field in (s.SBE_VOL, s.NVLINK_CRC_FLIT, s.PCIE_REPLAY, s.THERMAL_VIOLATION, s.ROWS_CORR):
                    if rng.random() < 0.2:
                        f.bump(n, gi, field, rng.choice([1, 5, 50, 2e8]))
                if rng.random() < 0.1:
                    f.set(n, gi, s.GPU_TEMP, rng.uniform(70, 95))
                if rng.random() < 0.1:
                    f.set(n, gi, s.THROTTLE_REASONS, rng.choice([0x4, 0x8, 0x48, 0xC8]))
                if rng.random() < 0.05:
                    f.xid(n, gi, rng.choice([13, 43, 92]))
        r.tick()
    res = r.last
    compiled = compile_signals(r.params, res.sensed.layout)
    scorer = Scorer(compiled, r.params, res.sensed.layout)
    fired = 0
    for node in res.sensed.nodes.values():
        for g in node.gpus:
            _z, contribs = scorer.score(g, 0, 0)
            slow = {name: (v, c) for name, v, c in signal_values(g, compiled, 0, 0) if c}
            fast = {c.signal: (c.value, c.weight) for c in contribs}
            assert fast.keys() == slow.keys()
            for k, (v, c) in fast.items():
                assert v == pytest.approx(slow[k][0]) and c == slow[k][1]
            fired += len(contribs)
    assert fired > 50


def test_one_fault_seen_through_several_reports_is_one_event_of_history():
    """An XID 79 reaches the fatal history three times (pushed XID, pushed 'GPU missing' of that GPU, the
    scrape's unnamed 'GPU missing'): one failure, not a repeat offender. A second failure of the same GPU
    later than the dedup window counts again."""
    from slurm_fleetyield.core.model import Tier
    from slurm_fleetyield.core.params import Params as P
    from slurm_fleetyield.core.risk import fatal_uuids
    from slurm_fleetyield.core.state import ControllerState, NodeMemory

    def uuids(history: tuple[tuple[float, str], ...], now: float = 10_000.0) -> list[str]:
        st = ControllerState(nodes={"n": NodeMemory(Tier.GREEN, 0.0, "", fatal_history=history)})
        return fatal_uuids(st, "n", P(), now)

    one_fault = ((1000.0, "GPU-a"), (1000.2, "GPU-a"), (1001.5, ""))
    assert uuids(one_fault) == ["GPU-a"]
    two_gpus = (*one_fault, (1002.0, "GPU-b"), (1002.1, "GPU-b"), (1003.0, ""))
    assert uuids(two_gpus) == ["GPU-a", "GPU-b"]
    window = P().learn.lemon_dedup_s
    again = (*one_fault, (1000.0 + window + 1, "GPU-a"))
    assert uuids(again, now=1000.0 + window + 10) == ["GPU-a", "GPU-a"]
    assert uuids(((1000.0, ""), (1000.0 + window + 1, ""))) == ["", ""]  # node-wide events apart
    assert uuids(((5.0, "GPU-a"),), now=5.0 + P().risk.fatal_history_days * 86_400.0 + 1) == []


# --- One remediated fault decays (issue #5 experiment; risk.single_fault_half_life_days) ---

DAY = 86_400.0


def _fault_and_resume(f: Fleet, r: Runner, node: str, gpu: int) -> None:
    f.push(node, 79, gpu, r.now)
    r.tick()
    f.drain_by_admin(node, "")
    f.slurm_update(node, states=frozenset({"IDLE"}), reason="")
    r.tick()


def _at(r: Runner, when: float):
    r.now = when
    return r.tick(advance=False).risks["gpu000"]


def test_one_isolated_fault_is_yellow_at_first_then_green_with_a_note():
    """The old rule held one remediated fault yellow for fatal_history_days (90 d): risk ~0.061 > 0.05.
    With the default weights the decayed node crosses 0.05 at ~0.2 half-lives (2^-0.2 of the repeat-offender
    terms): yellow at 0.15, green at 0.25 (80 d: 12 d and 20 d; it was 3.3 d and 5.5 d at 22 d)."""
    hl = Params().risk.single_fault_half_life_days
    assert hl == 80.0  # Titan, all returns to service (tests/sim/test_calibrate.py pins the fit)
    f = Fleet(2)
    r = Runner(f)
    r.tick()
    t0 = r.now
    _fault_and_resume(f, r, "gpu000", 3)
    assert _at(r, t0 + 600.0).health is Health.WARN  # just back: as before
    assert _at(r, t0 + 0.15 * hl * DAY).health is Health.WARN  # 12 d: still yellow
    later = _at(r, t0 + 0.25 * hl * DAY)  # 20 d
    assert later.health is Health.OK, later
    assert later.probability < Params().risk.yellow_threshold
    g3 = later.gpus[3]
    (note,) = [c for c in g3.contributions if c.signal == "gpu_repeat_offender"]  # green with a note
    assert 0 < note.weight < 2.5
    assert note.weight == pytest.approx(2.5 * 2 ** (-20 / 80), rel=0.01)  # age ~20 d, half-life 80 d
    assert g3.probability > later.gpus[0].probability  # the faulted GPU still ranks worse
    old = Params.model_validate({"risk": {"single_fault_half_life_days": None}})
    r_old = Runner(Fleet(2), old)
    r_old.tick()
    t_old = r_old.now
    _fault_and_resume(r_old.fleet, r_old, "gpu000", 3)
    assert _at(r_old, t_old + 0.25 * hl * DAY).health is Health.WARN  # the old rule, still available


def test_decay_scales_both_history_contributions_by_the_half_life():
    from slurm_fleetyield.core.model import Tier
    from slurm_fleetyield.core.risk import fatal_events, history_decay
    from slurm_fleetyield.core.state import ControllerState, NodeMemory

    p = Params()
    hl = p.risk.single_fault_half_life_days * DAY
    st = ControllerState(nodes={"n": NodeMemory(Tier.GREEN, 0.0, "", fatal_history=((1000.0, "GPU-a"),))})
    ev = fatal_events(st, "n", p, 1000.0 + hl)
    assert ev == [(1000.0, "GPU-a")]
    assert history_decay(ev, p, 1000.0 + hl) == pytest.approx(0.5)
    assert history_decay(ev, p, 1000.0) == 1.0
    assert history_decay([], p, 1000.0) == 1.0
    two = [(1000.0, "GPU-a"), (1000.0 + DAY, "GPU-b")]
    assert history_decay(two, p, 1000.0 + 30 * DAY) == 1.0  # a repeat offender keeps full weights
    with pytest.raises(ValueError):
        Params.model_validate({"risk": {"single_fault_half_life_days": 0}})


def test_decay_moves_in_whole_steps_of_the_faults_age():
    """Between steps a single-fault node's risk does not move (so its node is reused, not re-scored, every
    tick); at each step it takes the continuous value; step 0 is the continuous rule."""
    from slurm_fleetyield.core.risk import history_decay

    p = Params()
    step = p.risk.single_fault_decay_step_hours * 3_600.0
    assert step == 6 * 3_600.0
    hl = p.risk.single_fault_half_life_days * DAY
    ev = [(1000.0, "GPU-a")]
    at_step = history_decay(ev, p, 1000.0 + 4 * step)
    assert at_step == pytest.approx(2.0 ** (-4 * step / hl))
    assert history_decay(ev, p, 1000.0 + 4 * step + 900.0) == at_step  # one tick later: unchanged
    assert history_decay(ev, p, 1000.0 + 5 * step - 1.0) == at_step
    assert history_decay(ev, p, 1000.0 + 5 * step) < at_step
    continuous = Params.model_validate({"risk": {"single_fault_decay_step_hours": 0}})
    assert history_decay(ev, continuous, 1000.0 + 4 * step + 900.0) == pytest.approx(
        2.0 ** (-(4 * step + 900.0) / hl)
    )
    with pytest.raises(ValueError):
        Params.model_validate({"risk": {"single_fault_decay_step_hours": -1}})


def test_fatal_events_are_the_reports_inside_the_window_at_any_time():
    """fatal_events: the node's distinct reports inside the window, at any time (forwards, backwards, at the
    window's edges), an unnamed twin counted once, and a new history read anew."""
    from dataclasses import replace

    from slurm_fleetyield.core.model import Tier
    from slurm_fleetyield.core.risk import fatal_events
    from slurm_fleetyield.core.state import ControllerState, NodeMemory

    p = Params()
    w = p.risk.fatal_history_days * DAY
    hist = ((1000.0, "GPU-a"), (1000.0 + 2 * DAY, "GPU-b"), (1000.0 + 2 * DAY + 60.0, ""))
    mem = NodeMemory(Tier.GREEN, 0.0, "", fatal_history=hist)
    st = ControllerState(nodes={"n": mem})
    times = [1000.0 + DAY, 1000.0 + w - 1, 1000.0 + w, 1000.0 + w + 1, 1000.0 + w + 2 * DAY + 60.0]
    times += [1000.0 + w + 2 * DAY + 61.0, 1000.0 + DAY, 1000.0 + w + 1, 1000.0 + w + 3 * DAY]
    answers = []
    for now in times:
        answers.append(len(fatal_events(st, "n", p, now)))
    assert answers == [2, 2, 2, 1, 1, 0, 2, 1, 0]  # the unnamed twin counts once its named report has left
    longer = replace(mem, fatal_history=(*hist, (1000.0 + 5 * DAY, "GPU-c")))
    st2 = replace(st, nodes={"n": longer})
    assert fatal_events(st2, "n", p, 1000.0 + 6 * DAY) == [
        (1000.0, "GPU-a"),
        (1000.0 + 2 * DAY, "GPU-b"),
        (1000.0 + 5 * DAY, "GPU-c"),
    ]


def test_repeat_offender_stays_yellow_at_any_age_in_the_window():
    f = Fleet(2)
    r = Runner(f)
    r.tick()
    t0 = r.now
    _fault_and_resume(f, r, "gpu000", 3)
    r.now = t0 + 2 * DAY  # well past lemon_dedup_s: a second, distinct failure
    r.tick(advance=False)
    _fault_and_resume(f, r, "gpu000", 5)
    late = _at(r, t0 + 60 * DAY)
    assert late.health is Health.WARN, late
    w = {c.signal: c.weight for c in late.gpus[3].contributions}
    assert w == {"gpu_repeat_offender": 2.5, "node_repeat_offender": 1.0}


def test_fast_scorer_and_explain_path_agree_on_decayed_history():
    from slurm_fleetyield.core.risk import fatal_events, history_decay

    f = Fleet(1)
    r = Runner(f)
    r.tick()
    t0 = r.now
    _fault_and_resume(f, r, "gpu000", 2)
    r.now = t0 + 3 * DAY
    res = r.tick(advance=False)
    compiled = compile_signals(r.params, res.sensed.layout)
    ev = fatal_events(res.previous, "gpu000", r.params, r.now)
    decay = history_decay(ev, r.params, r.now)
    assert 0.5 < decay < 1.0
    for i, g in enumerate(res.sensed.nodes["gpu000"].gpus):
        n_gpu = [u for _, u in ev].count(g.reading.uuid)
        slow = {n: c for n, _v, c in signal_values(g, compiled, n_gpu, len(ev) - n_gpu, decay) if c}
        fast = {c.signal: c.weight for c in res.risks["gpu000"].gpus[i].contributions}
        assert slow == pytest.approx(fast), (i, slow, fast)
        assert fast  # every GPU carries a (decayed) history term


def test_history_due_is_no_later_than_the_next_change_of_the_history_inputs() -> None:
    """Between a node's assessment and its due time (``risk.history_due``), the fatal events in the window
    and the single-fault decay (all that time changes in a node's risk) stay what they were; a due time
    later than a change would let the carried answer go stale."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from slurm_fleetyield.core.fatal_history import _fatal_events, history_decay
    from slurm_fleetyield.core.risk import history_due

    day = 86_400.0
    report = st.tuples(st.floats(0.0, 40 * day), st.sampled_from(["", "GPU-a", "GPU-b"]))

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(report, min_size=1, max_size=4),
        st.floats(0.0, 60 * day),
        st.floats(0.0, 1.0),
        st.sampled_from([(30.0, 6.0), (10.0, 1.0), (5.0, 0.0)]),
        st.sampled_from([80.0, None]),
    )
    def check(hist, now, frac, window_step, half_life):  # type: ignore[no-untyped-def]
        days, step_h = window_step
        p = Params(
            risk={
                "fatal_history_days": days,
                "single_fault_decay_step_hours": step_h,
                "single_fault_half_life_days": half_life,
            }
        )
        history = tuple(sorted(hist))
        dedup = p.learn.lemon_dedup_s

        def inputs(t: float):  # type: ignore[no-untyped-def]
            ev = _fatal_events(history, t - days * day, dedup)
            return ev, history_decay(ev, p, t)

        events, _ = inputs(now)
        due = history_due(history, events, p, now)
        assert due >= now
        until = min(due - 1.0, now + 100 * day)  # the carried answer is used while now < due - 1 s
        if until <= now:
            return
        later = now + frac * (until - now)
        assert inputs(later) == inputs(now), (history, now, later, due)

    check()


def test_carried_risk_survives_a_fatal_event_on_a_node_slurm_does_not_know() -> None:
    """A sampled node unknown to Slurm gets a pushed fatal event: remember keeps no memory for it, so the
    history index must not name it, and the following ticks (risk starting from last tick's answer) equal a
    recompute from an empty memo."""
    from dataclasses import replace

    from slurm_fleetyield.core.loop import tick

    fleet = Fleet(3)
    fleet.nodes["gpu002"].slurm = None  # sampled, not in Slurm
    run = Runner(fleet)
    run.ticks(3)
    fleet.push("gpu002", 79, 1, run.now)
    fleet.push("gpu000", 79, 2, run.now)
    for _ in range(4):
        before = run.state
        r = run.tick()
        fresh = tick(replace(before, memo={}), fleet.observe(run.now), run.params, run.now, random.Random(7))
        assert dict(r.risks) == dict(fresh.risks)
        index = run.state.memo["fatal_history_index"]
        assert index[0] is run.state.nodes and set(index[1]) <= set(run.state.nodes), index[1]
    assert "gpu000" in index[1]


def test_violation_counters_are_read_as_nanoseconds() -> None:
    """DCGM and NVML count violation time in ns (dcgm-exporter's HELP says so since 4.4): an hour at 30 %
    throttled grows the counter by 0.3 * 3.6e12 and reads as the fraction 0.3, not 1000 times that."""
    specs = {spec.name: spec for spec in s.SIGNALS}
    for name in ("thermal_violation", "power_violation"):
        assert 0.3 * 3.6e12 * specs[name].scale == pytest.approx(0.3), name
