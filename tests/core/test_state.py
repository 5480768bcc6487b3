import json

import pytest

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.state import ControllerState


def test_round_trip_is_exact_through_json():
    f = Fleet(5)
    r = Runner(f)
    r.tick()
    f.bump("gpu001", 2, s.SBE_VOL, 7)
    f.push("gpu003", 79, 3, r.now)
    r.tick()
    r.tick()
    st = r.state
    assert st.history and st.processed_events and st.drain_times
    text = json.dumps(st.to_dict(), allow_nan=False)
    back = ControllerState.from_dict(json.loads(text))
    assert back == st
    assert back.to_dict() == st.to_dict()
    assert back.nodes["gpu003"].fatal_history == st.nodes["gpu003"].fatal_history


def test_held_fatal_evidence_round_trips():
    f = Fleet(30)
    for i in range(3):
        f.drain_by_admin(f"gpu{i:03d}", f"fleetyield: XID 79 gpu 0 fell off the bus #{i}")
    f.push("gpu010", 48, 2, 1_000_000.0)
    f.push("gpu011", None, None, 1_000_001.0, kind="alert", message="FleetYieldGpuMissing")
    r = Runner(f)
    r.tick()
    st = r.state
    assert {e.node for e in st.held_fatal} == {"gpu010", "gpu011"}
    back = ControllerState.from_dict(json.loads(json.dumps(st.to_dict(), allow_nan=False)))
    assert back == st and back.held_fatal == st.held_fatal


def test_restored_state_gives_same_next_tick():
    f = Fleet(3)
    r = Runner(f, apply=False)
    r.tick()
    f.bump("gpu001", 2, s.NVLINK_CRC_FLIT, 500)
    restored = ControllerState.from_dict(json.loads(json.dumps(r.state.to_dict())))
    a = r.tick()
    r.state = restored
    r.now -= r.step
    b = r.tick()
    assert a.plan == b.plan and a.state == b.state


def test_wrong_version_rejected():
    with pytest.raises(ValueError, match="version 99"):
        ControllerState.from_dict({"version": 99})


def test_processed_ids_bounded():
    from slurm_fleetyield.core.params import Params

    f = Fleet(200)
    p = Params.model_validate(
        {
            "quarantine": {
                "max_processed_event_ids": 5,
                "max_new_drains_per_window": 100,
                "drain_cap_fraction": 1.0,
            }
        }
    )
    for i in range(20):
        f.push(f"gpu{i:03d}", 79, 0, 1_000_000.0)
    r = Runner(f, p)
    r.tick()
    assert len(r.state.processed_events) == 5


def test_round_trip_with_lifecycle_proposals_settle_and_learn():
    import random as _random
    from dataclasses import replace as _replace

    from core.builders import tier_params
    from slurm_fleetyield.core.loop import tick as _tick
    from slurm_fleetyield.core.model import JobOutcome, JobView, WorkloadClass

    f = Fleet(10)
    r = Runner(f, tier_params())  # a proposal at red without the stake rule's pay test
    r.tick()
    f.set("gpu001", 3, s.REMAP_PENDING, 1)
    f.set("gpu001", 3, s.ROWS_CORR, 14)
    f.push("gpu004", 79, 1, r.now)
    f.jobs = [JobView(7, "PENDING", (), True, WorkloadClass.PRETRAIN, 8)]
    r.tick()
    r.tick()  # gpu004 drained and empty: remediating
    obs = _replace(
        f.observe(r.now + 30),
        outcomes=(JobOutcome(5, ("gpu002",), 8, WorkloadClass.BATCH, r.now - 100, r.now, "COMPLETED"),),
    )
    st = _tick(r.state, obs, r.params, r.now + 30, _random.Random(1)).state
    assert st.lifecycle and st.proposals and st.settle.settled and st.settle.pending and st.learn.predictions
    text = json.dumps(st.to_dict(), allow_nan=False)
    back = ControllerState.from_dict(json.loads(text))
    assert back == st and back.lifecycle == st.lifecycle and back.proposals == st.proposals
    assert back.learn == st.learn and back.settle == st.settle


def test_version_1_state_upgrades_and_adopts_quarantined_nodes():
    f = Fleet(5)
    r = Runner(f)
    r.tick()
    f.push("gpu003", 48, 2, r.now)
    r.tick()
    r.tick()
    v1 = r.state.to_dict()
    for k in ("lifecycle", "lifecycle_drained", "proposals", "denials", "settle", "learn"):
        del v1[k]
    v1["version"] = 1
    back = ControllerState.from_dict(json.loads(json.dumps(v1)))
    assert back.version == 2
    lc = back.lifecycle["gpu003"]
    assert lc.stage.value == "quarantined" and lc.cause is not None and lc.cause.xid == 48
    assert set(back.lifecycle) == {"gpu003"} and back.lifecycle_drained == {"gpu003"}
    assert ControllerState.from_dict(back.to_dict()) == back


def test_sorted_names_is_the_sorted_union_and_follows_every_key_change() -> None:
    """The kept answer is handed back only while the maps hold the same keys in the same order: a key
    added, dropped or reordered in either map gives the fresh sorted union."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from slurm_fleetyield.core.state import sorted_names

    keys = st.lists(st.sampled_from(["n1", "n2", "n10", "gpu-a", "gpu-b"]), unique=True)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(keys, keys), min_size=1, max_size=6))
    def check(steps: list[tuple[list[str], list[str]]]) -> None:
        memo: dict[str, object] = {}
        for a, b in steps:
            ma, mb = dict.fromkeys(a, 0), dict.fromkeys(b, 0)
            want = sorted(set(a) | set(b))
            assert sorted_names(memo, ma, mb) == want
            assert sorted_names(None, ma, mb) == want

    check()


def test_changed_keys_and_noted_changes_are_the_plain_diff() -> None:
    """``changed_keys`` finds every key whose value is another object, or that only one map has; a stage's
    note (``note_changes``: a copy of the old answer with some keys set again) hands back the same set,
    and only for the very pair of maps it was made for. A note for maps of different lengths is dropped."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from slurm_fleetyield.core.state import changed_keys, note_changes

    names = ["n1", "n2", "n3", "n4", "n5"]
    values = [object() for _ in range(3)]
    maps = st.dictionaries(st.sampled_from(names), st.sampled_from(values))
    edits = st.dictionaries(st.sampled_from(names), st.sampled_from(values))

    @settings(max_examples=300, deadline=None)
    @given(maps, edits, maps)
    def check(old: dict[str, object], edit: dict[str, object], other: dict[str, object]) -> None:
        want = {k for k in old.keys() | other.keys() if old.get(k) is not other.get(k)}
        want |= old.keys() ^ other.keys()
        assert changed_keys(other, old) == want
        new = {**old, **edit}  # the stage's answer: last tick's, with the keys it did again
        memo: dict[str, object] = {}
        note_changes(memo, "stage", new, old, edit)
        plain = changed_keys(new, old)
        if len(new) == len(old):
            assert set(memo["changes"]["stage"][2]) == plain  # type: ignore[index]
        else:
            assert "stage" not in memo["changes"]  # type: ignore[operator]
        assert changed_keys(new, old, memo) == plain
        assert changed_keys(new, dict(old), memo) == changed_keys(new, dict(old))  # another old: no note
        note_changes(memo, "stage", new, None)
        assert "stage" not in memo["changes"]  # type: ignore[operator]

    check()


def test_slurm_view_is_one_copy_per_observations_with_its_changes_noted() -> None:
    """One copy of Slurm's view per ``Observations`` (stages of one tick share it, even when the shell
    updates its mapping in place between ticks); the next tick's copy notes its diff against it."""
    from slurm_fleetyield.core.model import Observations, SlurmNode
    from slurm_fleetyield.core.state import changed_keys, slurm_view

    view = {n: SlurmNode(n, frozenset({"IDLE"})) for n in ("a", "b", "c")}
    first = Observations(time=0.0, slurm=view, samples={})
    memo: dict[str, object] = {}
    snap = slurm_view(memo, first)
    assert snap == view and snap is not view and slurm_view(memo, first) is snap
    view["b"] = SlurmNode("b", frozenset({"ALLOCATED"}))  # the shell updates its mapping in place
    del view["c"]
    second = Observations(time=60.0, slurm=view, samples={})
    snap2 = slurm_view(memo, second)
    assert snap2 == view and snap == {n: SlurmNode(n, frozenset({"IDLE"})) for n in ("a", "b", "c")}
    assert changed_keys(snap2, snap, memo) == changed_keys(snap2, snap) == {"b", "c"}
    assert slurm_view(None, second) == view and slurm_view(None, second) is not view
