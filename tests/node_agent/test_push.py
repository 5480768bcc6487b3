from __future__ import annotations

import socket
import time
from pathlib import Path

from agent_rig import make_rig
from receiver import Receiver, wait_for

from node_agent.faults import parse_fault
from node_agent.push import Pusher, spooled

SECRET = b"test-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fatal_event_is_pushed_at_once_with_valid_signature(tmp_path: Path) -> None:
    rx = Receiver(SECRET)
    rig = make_rig(tmp_path / "s")
    pusher = Pusher(rig.state_dir, "node-a", rx.url, SECRET)
    rig.agent.pusher = pusher
    pusher.start()
    try:
        t0 = time.monotonic()
        rig.agent.inject(parse_fault({"kind": "xid", "xid": 79, "gpu": 1}))
        assert wait_for(lambda: len(rx.events()) == 2)
        assert time.monotonic() - t0 < 1.0
        assert {e.kind for e in rx.events()} == {"xid", "gpu_missing"}
        assert rx.rejected == []
        assert spooled(rig.state_dir) == []
    finally:
        pusher.stop()
        rx.close()


def test_events_spool_while_receiver_down_and_deliver_later(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1/agent/events"
    rig = make_rig(tmp_path / "s")
    pusher = Pusher(rig.state_dir, "node-a", url, SECRET, timeout_s=1.0)
    rig.agent.pusher = pusher
    rig.agent.inject(parse_fault({"kind": "xid", "xid": 48, "gpu": 0}))
    assert pusher.flush_once() is False
    assert [e.xid for _, e in spooled(rig.state_dir)] == [48]
    # enqueueing the same event again is idempotent (spool keyed by event_id)
    pusher.enqueue([spooled(rig.state_dir)[0][1]])
    assert len(spooled(rig.state_dir)) == 1
    rx = Receiver(SECRET, port=port)
    try:
        assert pusher.flush_once() is True
        assert [e.xid for e in rx.events()] == [48]
        assert spooled(rig.state_dir) == []
    finally:
        rx.close()


def test_sender_thread_retries_with_backoff(tmp_path: Path) -> None:
    port = _free_port()
    rig = make_rig(tmp_path / "s")
    pusher = Pusher(
        rig.state_dir,
        "node-a",
        f"http://127.0.0.1:{port}/x",
        SECRET,
        timeout_s=0.5,
        backoff_initial_s=0.05,
        backoff_max_s=0.2,
    )
    rig.agent.pusher = pusher
    pusher.start()
    try:
        rig.agent.inject(parse_fault({"kind": "xid", "xid": 119, "gpu": 2}))
        assert wait_for(lambda: pusher.failures >= 1)
        rx = Receiver(SECRET, port=port)
        try:
            assert wait_for(lambda: [e.xid for e in rx.events()] == [119])
        finally:
            rx.close()
    finally:
        pusher.stop()


def test_wrong_secret_is_rejected_and_stays_spooled(tmp_path: Path) -> None:
    rx = Receiver(b"the-controller-secret-xyz")
    rig = make_rig(tmp_path / "s")
    pusher = Pusher(rig.state_dir, "node-a", rx.url, SECRET)
    rig.agent.pusher = pusher
    try:
        rig.agent.inject(parse_fault({"kind": "xid", "xid": 95, "gpu": 0}))
        assert pusher.flush_once() is False
        assert rx.rejected and "bad signature" in rx.rejected[0]
        assert len(spooled(rig.state_dir)) == 1
    finally:
        rx.close()
