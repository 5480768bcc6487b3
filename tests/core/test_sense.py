from core.builders import Fleet, Runner
from slurm_fleetyield.core.model import Health
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.sense import sense
from slurm_fleetyield.core.signals import NVLINK_CRC_FLIT, SBE_VOL, channel_layout, trended
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.core.trends import _adjust

LAYOUT = channel_layout((79, 13))


def _sense(fleet, now, state=None):
    state = state or ControllerState.empty()
    return sense(fleet.observe(now), state.history, state.layout, LAYOUT, Params().sense, now)


def test_missing_stale_and_failed_samples_are_unknown():
    f = Fleet(3)
    f.nodes["gpu000"].sampled = False
    f.nodes["gpu001"].sample_time = 1000.0 - 61
    f.nodes["gpu002"].error = "connection refused"
    s = _sense(f, 1000.0)
    assert {n.health for n in s.nodes.values()} == {Health.UNKNOWN}
    assert "no sample" in s.nodes["gpu000"].reason
    assert "61s old" in s.nodes["gpu001"].reason
    assert "connection refused" in s.nodes["gpu002"].reason


def test_fresh_sample_is_ok_and_detects_missing_gpu_only_when_fresh():
    f = Fleet(2)
    f.nodes["gpu000"].hidden_gpus = {3}
    f.nodes["gpu001"].hidden_gpus = {3}
    f.nodes["gpu001"].sample_time = 0.0  # stale: no evidence
    s = _sense(f, 1000.0)
    assert s.nodes["gpu000"].missing_gpus == 1
    assert s.nodes["gpu001"].missing_gpus == 0


def test_slurm_gres_count_also_reveals_missing_gpu():
    f = Fleet(1)
    f.nodes["gpu000"].expected_gpus = None
    f.nodes["gpu000"].hidden_gpus = {0, 1}
    assert _sense(f, 1000.0).nodes["gpu000"].missing_gpus == 2


def test_rates_over_window_and_counter_reset_is_not_negative():
    f = Fleet(1)
    r = Runner(f, step=60)
    r.tick()
    f.bump("gpu000", 0, SBE_VOL, 100)
    r.tick()
    g = r.last.sensed.nodes["gpu000"].gpus[0]
    i = LAYOUT.index(SBE_VOL)
    assert g.rates[i] == 100 * 3600 / 600  # growth over the short window, divided by the window length
    f.set("gpu000", 0, SBE_VOL, 5)  # driver reload: counter restarted
    r.tick()
    g = r.last.sensed.nodes["gpu000"].gpus[0]
    assert g.growth[i] == 105  # 100 before the reset + 5 after it, never a negative rate
    assert g.rates[i] > 0


def test_adjust_treats_decrease_as_reset():
    assert _adjust((5.0, None), (10.0, 3.0), (110.0, 3.0)) == (115.0, 3.0)
    assert _adjust((12.0, 4.0), (10.0, None), (110.0, None)) == (112.0, 4.0)


def test_history_is_bounded_by_longest_window():
    f = Fleet(1)
    r = Runner(f, step=30)
    r.ticks(400)  # 3.3 hours
    h = r.state.history["gpu000"]["GPU-gpu000-0"]
    assert len(h.times) <= 3600 / 60 + 1
    assert h.times[0] >= r.now - 3600 - 60  # trimmed at each append, so at most one resolution step older


def test_nvlink_crc_growth_seen_as_rate():
    f = Fleet(1)
    r = Runner(f)
    r.tick()
    f.bump("gpu000", 2, NVLINK_CRC_FLIT, 50)
    r.tick()
    g = r.last.sensed.nodes["gpu000"].gpus[2]
    assert g.rates[LAYOUT.index(NVLINK_CRC_FLIT)] == 50 * 3600 / 600


def test_adjust_unchanged_channel_keeps_the_very_value() -> None:
    """A channel whose raw value did not change keeps its adjusted value, the very object (so ring points
    share it), even where growth arithmetic would not give it back: inf - inf is NaN, -0.0 + 0.0 is 0.0."""
    import math

    la = (8754778.1, -0.0, 5.0, 7.0)
    lr = (math.inf, 0.0, 3.0, 3.0)
    raw = (math.inf, 0.0, 4.5, 1.0)
    got = _adjust(raw, lr, la)
    assert got[0] is la[0] and got[1] is la[1]  # unchanged: kept, not recomputed
    assert got[2] == 6.5  # growth adds
    assert got[3] == 8.0  # a decrease restarts from zero: the new raw value adds
    nan = math.nan
    got = _adjust((nan, 2.0), (nan, 2.0), (1.0, 9.0))
    assert got[0] != got[0] and got[1] is not None and got[1] == 9.0  # NaN never equals: not "unchanged"


def test_layout_keeps_quarantine_xids_out_of_the_trend_ring() -> None:
    layout = channel_layout((43, 13), (79, 48, 13))
    assert layout[-4:] == ("xid:13", "xid:43", "xid_new:48", "xid_new:79")  # an XID in both: windowed once
    assert trended(layout) == len(layout) - 2
    assert trended(channel_layout((13,))) == len(channel_layout((13,)))


def test_a_quarantine_xid_is_new_by_its_raw_total_and_never_enters_the_ring() -> None:
    f = Fleet(1)
    layout = channel_layout((13,), (79,))
    history, old_layout = {}, ()
    now = 1000.0
    got = []
    for xid, by in [(None, 0), (79, 2), (13, 1), (None, 0), (79, -1), (79, 3)]:
        if xid is not None:
            f.xid("gpu000", 0, xid, by)
        s = sense(f.observe(now), history, old_layout, layout, Params().sense, now)
        history, old_layout = s.history, layout
        g = s.nodes["gpu000"].gpus[0]
        got.append(g.new_xids)
        h = s.history["gpu000"]["GPU-gpu000-0"]
        assert len(h.last_adj) == trended(layout) and {len(p) for p in h.points} == {trended(layout)}
        assert len(g.raw) == len(layout)
        if g.growth is not None:
            assert len(g.growth) == trended(layout)
        now += 60.0
    # 79 grew by 2; 13 by 1; 79's total went 2 -> 1: restarted from zero, its 1 is new; then 1 -> 4: 3 new
    assert got == [(), ((79, 2.0),), ((13, 1.0),), (), ((79, 1.0),), ((79, 3.0),)]


def _run(f: Fleet, layouts: list[tuple[str, ...]], changes: list) -> list:  # type: ignore[type-arg]
    """Sense one sample per layout (60 s apart), applying ``changes[i](f)`` before sample i."""
    history, old, now, out = {}, (), 1000.0, []
    for layout, change in zip(layouts, changes, strict=True):
        change(f)
        s = sense(f.observe(now), history, old, layout, Params().sense, now)
        history, old, now = s.history, layout, now + 60.0
        out.append(s)
    return out


def test_a_layout_change_carries_each_gpu_history_over_by_channel() -> None:
    """The layout before quarantine XIDs left the ring (every XID windowed), then today's: trends and last
    totals carry over, so an XID that grew across the change is new and rates go on as if never changed."""
    legacy, today = channel_layout((13, 79)), channel_layout((13,), (79,))

    def steps() -> list:  # type: ignore[type-arg]
        return [
            lambda f: f.xid("gpu000", 0, 79, 1),
            lambda f: f.bump("gpu000", 0, SBE_VOL, 30),
            lambda f: f.bump("gpu000", 0, SBE_VOL, 30),
            lambda f: (f.xid("gpu000", 0, 79, 2), f.bump("gpu000", 0, SBE_VOL, 30)),
        ]

    changed = _run(Fleet(1), [legacy] * 3 + [today], steps())
    control = _run(Fleet(1), [today] * 4, steps())
    assert [e.kind for e in changed[3].events] == ["history_relayout"]
    assert control[3].events == ()
    g, want = changed[3].nodes["gpu000"].gpus[0], control[3].nodes["gpu000"].gpus[0]
    assert g.new_xids == want.new_xids == ((79, 2.0),) and not g.baseline
    assert (g.raw, g.rates, g.growth) == (want.raw, want.rates, want.growth)
    assert g.rates[today.index(SBE_VOL)] > 0


def test_a_channel_the_old_layout_did_not_keep_starts_from_its_own_baseline() -> None:
    before, after = channel_layout((13,), (79,)), channel_layout((13, 31), (79,))
    changes = [lambda f: f.xid("gpu000", 0, 31, 4), lambda f: None, lambda f: f.xid("gpu000", 0, 31, 1)]
    s = _run(Fleet(1), [before, after, after], changes)
    first, later = s[1].nodes["gpu000"].gpus[0], s[2].nodes["gpu000"].gpus[0]
    assert first.new_xids == () and later.new_xids == ((31, 1.0),)  # its total before the change is no news
