from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_rig import FakeClock, make_rig

from node_agent.faults import FaultSpecError
from node_agent.scenario import load_scenario

SCENARIO = """
seed = 42
[[events]]
at_s = 10
jitter_s = 5
fault = { kind = "xid", xid = 79, gpu = "random" }
[[events]]
at_s = 20
fault = { kind = "degrade", mode = "ecc", rate = 3.0, gpu = "random" }
[[events]]
at_s = 30
fault = { kind = "xid", xid = 74, gpu = 1 }
"""


def _replay(tmp: Path, scenario_file: Path) -> list[bytes]:
    clock = FakeClock()
    rig = make_rig(tmp, gpus=8, clock=clock)
    rig.agent.scenario = load_scenario(scenario_file)
    rig.agent.start_scenario(clock.now)
    out = []
    for _ in range(8):
        clock.advance(5)
        rig.agent.tick(clock.now)
        out.append(rig.text().encode())
    return out


def test_same_seed_replays_identically(tmp_path: Path) -> None:
    f = tmp_path / "sc.toml"
    f.write_text(SCENARIO)
    a = _replay(tmp_path / "a", f)
    b = _replay(tmp_path / "b", f)
    assert a == b
    assert a[0] != a[-1]
    assert b'xid="74"' in a[-1]


def test_other_seed_differs(tmp_path: Path) -> None:
    f1, f2 = tmp_path / "1.toml", tmp_path / "2.json"
    f1.write_text(SCENARIO)
    f2.write_text(
        json.dumps(
            {
                "seed": 43,
                "events": [
                    {"at_s": 10, "jitter_s": 5, "fault": {"kind": "xid", "xid": 79, "gpu": "random"}},
                    {"at_s": 20, "fault": {"kind": "degrade", "mode": "ecc", "rate": 3.0, "gpu": "random"}},
                    {"at_s": 30, "fault": {"kind": "xid", "xid": 74, "gpu": 1}},
                ],
            }
        )
    )
    r1 = load_scenario(f1).resolve(0, 8)
    r2 = load_scenario(f2).resolve(0, 8)
    assert [s.kind for _, s in r1] == [s.kind for _, s in r2]
    assert r1 != r2


def test_restart_does_not_replay_applied_events(tmp_path: Path) -> None:
    f = tmp_path / "sc.toml"
    f.write_text(SCENARIO)
    clock = FakeClock()
    rig = make_rig(tmp_path / "s", gpus=8, clock=clock)
    rig.agent.scenario = load_scenario(f)
    rig.agent.start_scenario(clock.now)
    clock.advance(25)
    assert len(rig.agent.tick(clock.now)) == 2
    again = make_rig(tmp_path / "s", gpus=8, clock=clock)
    again.agent.scenario = load_scenario(f)
    again.agent.start_scenario(clock.now)
    assert again.agent.tick(clock.now) == []
    clock.advance(10)
    assert len(again.agent.tick(clock.now)) == 1


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.json", "{not json", "not valid json"),
        ("bad.toml", "events = [", "not valid toml"),
        ("nofault.json", '{"events": [{"at_s": 1}]}', "events.0.fault: Field required"),
        (
            "neg.json",
            '{"events": [{"at_s": -1, "fault": {"kind": "corrupt", "gpu": 0}}]}',
            "greater than or equal",
        ),
        ("badxid.json", '{"events": [{"at_s": 1, "fault": {"kind": "xid", "gpu": 0}}]}', "event #0: xid"),
        ("extra.json", '{"events": [], "surprise": 1}', "Extra inputs"),
    ],
)
def test_bad_scenario_files(tmp_path: Path, name: str, content: str, message: str) -> None:
    f = tmp_path / name
    f.write_text(content)
    with pytest.raises(FaultSpecError, match=message):
        load_scenario(f)


def test_scenario_gpu_out_of_range(tmp_path: Path) -> None:
    f = tmp_path / "sc.json"
    f.write_text('{"events": [{"at_s": 1, "fault": {"kind": "corrupt", "gpu": 5}}]}')
    with pytest.raises(FaultSpecError, match="node has 2 GPUs"):
        load_scenario(f).resolve(0, 2)
