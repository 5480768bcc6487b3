"""The agent pushing to two controllers (high availability): every fatal event reaches each, one dead
controller holds back neither the other nor its own later delivery, and the config takes one URL or a list.
Receivers are real HTTP servers verifying the signature (tests/node_agent/receiver.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from agent_rig import make_rig
from receiver import Receiver, wait_for

from node_agent.config import build_config
from node_agent.faults import parse_fault
from node_agent.push import SPOOL_DIR, Pusher, spool_dir_name, spool_event, spooled

SECRET = b"test-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_event_reaches_both_controllers(tmp_path: Path) -> None:
    a, b = Receiver(SECRET), Receiver(SECRET)
    rig = make_rig(tmp_path / "s")
    pusher = Pusher(rig.state_dir, "node-a", [a.url, b.url], SECRET)
    rig.agent.pusher = pusher
    pusher.start()
    try:
        rig.agent.inject(parse_fault({"kind": "xid", "xid": 79, "gpu": 1}))
        assert wait_for(lambda: len(a.events()) == 2 and len(b.events()) == 2)
        assert {e.event_id for e in a.events()} == {e.event_id for e in b.events()}
        assert wait_for(lambda: all(not spooled(rig.state_dir, d.spool_dir) for d in pusher.destinations))
    finally:
        pusher.stop()
        a.close()
        b.close()


def test_a_dead_controller_holds_back_neither_the_other_nor_its_own_backlog(tmp_path: Path) -> None:
    live = Receiver(SECRET)
    dead_port = _free_port()
    dead_url = f"http://127.0.0.1:{dead_port}/v1/agent/events"
    rig = make_rig(tmp_path / "s")
    pusher = Pusher(rig.state_dir, "node-a", [dead_url, live.url], SECRET, timeout_s=0.5)
    rig.agent.pusher = pusher
    rig.agent.inject(parse_fault({"kind": "xid", "xid": 48, "gpu": 0}))
    assert pusher.flush_once() is False  # the dead one failed ...
    assert [e.xid for e in live.events()] == [48]  # ... the live one has it anyway
    assert [e.xid for _, e in spooled(rig.state_dir, SPOOL_DIR)] == [48]  # kept for the dead one
    assert spooled(rig.state_dir, spool_dir_name(live.url, 1)) == []
    revived = Receiver(SECRET, port=dead_port)
    try:
        assert pusher.flush_once() is True
        assert [e.xid for e in revived.events()] == [48]
        assert [e.xid for e in live.events()] == [48]  # not sent twice to the live one
    finally:
        revived.close()
        live.close()


def test_events_spooled_before_a_second_url_go_to_both(tmp_path: Path) -> None:
    a, b = Receiver(SECRET), Receiver(SECRET)
    rig = make_rig(tmp_path / "s")
    rig.agent.inject(parse_fault({"kind": "xid", "xid": 119, "gpu": 2}))  # no pusher: offline, spool/ only
    assert [e.xid for _, e in spooled(rig.state_dir)] == [119]
    pusher = Pusher(rig.state_dir, "node-a", [a.url, b.url], SECRET)
    pusher.start()
    try:
        assert wait_for(lambda: [e.xid for e in a.events()] == [119] and [e.xid for e in b.events()] == [119])
    finally:
        pusher.stop()
        a.close()
        b.close()


def test_each_destination_keeps_its_spool_when_the_list_is_reordered(tmp_path: Path) -> None:
    first, second = "http://c1:9402/v1/agent/events", "http://c2:9402/v1/agent/events"
    assert spool_dir_name(first, 0) == SPOOL_DIR
    assert spool_dir_name(second, 1) == spool_dir_name(second, 2) != spool_dir_name(first, 1)
    rig = make_rig(tmp_path / "s")
    rig.agent.inject(parse_fault({"kind": "xid", "xid": 79, "gpu": 0}))
    (_, ev), *_ = spooled(rig.state_dir)
    spool_event(rig.state_dir, ev, spool_dir_name(second, 1))
    assert len(spooled(rig.state_dir, spool_dir_name(second, 1))) == 1


def test_config_takes_one_url_or_a_list_and_refuses_bad_ones(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    base = {"state_dir": str(tmp_path / "st"), "push_secret_file": str(secret)}
    one = build_config(None, {**base, "push_url": "http://c1:9402/v1/agent/events"})
    assert one.push_url == ["http://c1:9402/v1/agent/events"]
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'push_url = ["http://c1:9402/v1/agent/events", "http://c2:9402/v1/agent/events"]\n'
        f'push_secret_file = "{secret}"\nstate_dir = "{tmp_path / "st"}"\n'
    )
    two = build_config(toml, {})
    assert two.push_url == ["http://c1:9402/v1/agent/events", "http://c2:9402/v1/agent/events"]
    flags = build_config(toml, {"push_url": ("http://c3:9402/x",)})  # flags win (click's repeated option)
    assert flags.push_url == ["http://c3:9402/x"]
    with pytest.raises(ValueError, match="must be an http"):
        build_config(None, {**base, "push_url": ["http://c1:9402/x", "c2:9402"]})
    with pytest.raises(ValueError, match="twice"):
        build_config(None, {**base, "push_url": ["http://c1:9402/x", "http://c1:9402/x"]})
    with pytest.raises(ValueError, match="push_url"):
        build_config(None, {**base, "push_url": 9402})
