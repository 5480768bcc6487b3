"""Keep open (core/keep_open.py): a class feature job_submit.lua adds is never left on no node."""

from __future__ import annotations

import pytest

from core.builders import L40S, Fleet, Runner
from core.builders import tier_params as Params  # the tier rule's mechanisms (builders.TIER_RULE)
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import Tier
from slurm_fleetyield.core.state import ControllerState

TRAIN, FINETUNE, DECODE = "fy_ok_train", "fy_ok_finetune", "fy_ok_decode"
CLOSED = Params(keep_open={"enabled": False})


pytestmark = pytest.mark.usefixtures("tier_rule")  # Runner() runs builders.TIER_RULE


def yellow_fleet(n: int = 3, model: str = L40S) -> Fleet:
    """``n`` non-premium nodes, every one yellow through 11 correctable remapped rows (HBM still full)."""
    f = Fleet(0)
    for i in range(n):
        f.add(f"y{i}", model, gpu_type="l40s")
        f.set(f"y{i}", 0, s.ROWS_CORR, 11)
    return f


def carriers(r: Runner, feature: str) -> set[str]:
    assert r.last is not None
    return {n for n, d in r.last.nodes.items() if feature in d.fy_features}


def test_with_no_green_node_one_yellow_node_keeps_every_class_submittable():
    f = yellow_fleet()
    f.set("y1", 1, s.ROWS_CORR, 11)  # y1 riskier: y0 and y2 are equal, y0 first by name
    r = Runner(f)
    r.tick()
    assert r.last is not None and all(d.tier is Tier.YELLOW for d in r.last.nodes.values())
    for feat in (TRAIN, FINETUNE, DECODE):
        assert carriers(r, feat) == {"y0"}
    d = r.last.nodes["y0"]
    assert "kept open (no other node carries it: Slurm would refuse the class at submission)" in d.reason
    assert d.weight == r.last.nodes["y2"].weight  # keeps its yellow weight
    assert any(u.nodes == ("y0",) and TRAIN in u.features for u in r.last.plan.of_kind("update"))
    assert sorted(e.message.split()[0] for e in r.last.events if e.kind == "open_lend") == [
        DECODE,
        FINETUNE,
        TRAIN,
    ]
    assert r.state.kept_open == ((DECODE, "y0"), (FINETUNE, "y0"), (TRAIN, "y0"))
    # off: the yellow nodes carry fy_ok_batch only, as before
    off = Runner(yellow_fleet(), CLOSED)
    off.tick()
    assert carriers(off, TRAIN) == carriers(off, FINETUNE) == carriers(off, DECODE) == set()


def test_the_kept_node_does_not_hop_and_a_green_node_closes_it():
    f = yellow_fleet()
    r = Runner(f)
    r.tick()
    assert carriers(r, TRAIN) == {"y0"}
    f.set("y0", 1, s.ROWS_CORR, 11)  # y0 now riskier than y1, still yellow: it keeps the feature
    r.tick()
    assert r.last is not None and r.last.nodes["y0"].risk > r.last.nodes["y1"].risk
    assert carriers(r, TRAIN) == {"y0"} and not [e for e in r.last.events if "open" in e.kind]
    f.set("y2", 0, s.ROWS_CORR, 0)  # y2 is green again: it carries every class feature on its own
    r.tick()
    assert r.last.nodes["y2"].tier is Tier.GREEN
    assert carriers(r, TRAIN) == {"y2"} and carriers(r, DECODE) == {"y2"}
    assert {e.node for e in r.last.events if e.kind == "open_return"} == {"y0"}
    assert r.state.kept_open == ()
    assert not [e for e in r.last.events if e.kind.startswith("gang_")]  # it was never a gang loan


def test_the_envelope_decides_which_feature_a_node_may_keep_open():
    f = yellow_fleet(2)
    for i in range(2):  # pending row remaps: HBM not full, so no finetune/decode home anywhere
        f.set(f"y{i}", 2, s.REMAP_PENDING, 1)
    r = Runner(f)
    r.tick()
    assert r.last is not None
    assert carriers(r, TRAIN) == {"y0"} and carriers(r, FINETUNE) == carriers(r, DECODE) == set()
    unsub = sorted(e.message for e in r.last.events if e.kind == "class_unsubmittable")
    assert len(unsub) == 2 and "fy_ok_decode" in unsub[0] and "fy_ok_finetune" in unsub[1]
    assert dict(r.state.kept_open) == {DECODE: "", FINETUNE: "", TRAIN: "y0"}
    r.tick()
    assert not [e for e in r.last.events if e.kind == "class_unsubmittable"]  # said once
    f.set("y1", 2, s.REMAP_PENDING, 0)  # y1's HBM is full again (still yellow): it can keep them open
    r.tick()
    assert carriers(r, FINETUNE) == carriers(r, DECODE) == {"y1"} and carriers(r, TRAIN) == {"y0"}


def test_the_largest_node_first_and_never_a_red_lemon_or_drained_node():
    f = yellow_fleet(2)
    f.add("big", L40S, gpus=16, gpu_type="l40s")
    f.set("big", 0, s.ROWS_CORR, 11)
    f.set("big", 1, s.ROWS_CORR, 11)  # riskier than y0/y1, but the only node a 16-GPU job fits
    r = Runner(f)
    r.tick()
    assert carriers(r, TRAIN) == {"big"}
    f.drain_by_admin("big")  # someone else's drain: left alone, and not in service
    r.tick()
    big = f.nodes["big"].slurm
    assert big is not None and TRAIN in big.available_features  # left alone, Slurm still shows it there:
    assert carriers(r, TRAIN) - {"big"} == set()  # submission stays open (jobs pend), nothing else opened
    f.slurm_update("big", available_features=("rack1",), active_features=("rack1",))
    r.tick()
    assert carriers(r, TRAIN) == {"y0"}
    f.set("y0", 0, s.REMAP_FAILURE, 1)
    f.set("y1", 0, s.REMAP_FAILURE, 1)  # red: never kept open
    r.tick()
    assert r.last is not None and r.last.nodes["y0"].tier is Tier.RED
    assert carriers(r, TRAIN) == set()
    assert any(e.kind == "class_unsubmittable" and TRAIN in e.message for e in r.last.events)


def test_kept_open_survives_a_restart():
    f = yellow_fleet()
    r = Runner(f)
    r.tick()
    restored = ControllerState.from_dict(r.state.to_dict())
    assert restored.kept_open == r.state.kept_open and restored == r.state
    old = r.state.to_dict()
    del old["kept_open"]  # a state written before keep open
    assert ControllerState.from_dict(old).kept_open == ()
