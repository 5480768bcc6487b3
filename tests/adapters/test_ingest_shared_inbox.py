"""Two controllers' push listeners on one PostgreSQL store (high availability): the agent sends every fatal
event to both, and the shared inbox commits it once; the second copy is a 202 duplicate. Real PostgreSQL
(tests/pgcluster.py), real listeners, the agent's real ``Pusher``."""

from __future__ import annotations

import threading
import time

import pytest

from node_agent.protocol import EVENTS_PATH, AgentEvent
from node_agent.push import Pusher, spooled
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.store import Store

SECRET = b"s3cret-for-tests-two"


@pytest.fixture
def two_listeners(pg_url):
    stores = [Store(pg_url), Store(pg_url)]
    servers = [IngestServer("127.0.0.1", 0, SECRET, s, threading.Event()) for s in stores]
    for s in servers:
        s.start()
    yield servers
    for s in servers:
        s.stop()
    for st in stores:
        st.close()


def test_an_event_pushed_to_both_controllers_is_committed_once(two_listeners, tmp_path):
    a, b = two_listeners
    urls = [f"http://127.0.0.1:{s.port}{EVENTS_PATH}" for s in (a, b)]
    pusher = Pusher(tmp_path / "agent", "gpu-01", urls, SECRET)
    ev = AgentEvent(event_id="e-ha-1", time=time.time(), node="gpu-01", gpu=3, kind="xid", xid=79, fatal=True)
    pusher.enqueue([ev])
    assert pusher.flush_once()
    assert all(not spooled(d.state_dir, d.spool_dir) for d in pusher.destinations)  # both answered 2xx
    assert a.wake.is_set() or b.wake.is_set()
    assert [e.event_id for e in a.store.pending()] == ["e-ha-1"]
    assert a.store.inbox_counts()["pending"] == 1
    # one controller processes it; a late copy to either adds nothing
    a.store.acknowledge(["e-ha-1"])
    pusher.enqueue([ev])
    assert pusher.flush_once()
    assert b.store.pending() == [] and b.store.inbox_counts() == a.store.inbox_counts()
