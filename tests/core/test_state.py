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
