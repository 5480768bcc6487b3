"""Push listener over real HTTP on 127.0.0.1, with the agent's own signer and Pusher on the other end."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from node_agent.protocol import EVENTS_PATH, AgentEvent, AgentEventBatch, signed_headers
from node_agent.push import Pusher
from slurm_fleetyield.adapters.ingest import IngestServer, fatal_events
from slurm_fleetyield.adapters.store import Store

SECRET = b"s3cret-for-tests"


def event(eid: str, node: str = "gpu-01", fatal: bool = True, xid: int = 79) -> AgentEvent:
    return AgentEvent(
        event_id=eid, time=time.time(), node=node, gpu=3, uuid="GPU-1", kind="xid", xid=xid, fatal=fatal
    )


@pytest.fixture
def ingest(tmp_path):
    store = Store(tmp_path / "fy.db")
    wake = threading.Event()
    server = IngestServer("127.0.0.1", 0, SECRET, store, wake, max_body_bytes=4096)
    server.start()
    yield server
    server.stop()
    store.close()


def post(server: IngestServer, body: bytes, headers: dict[str, str], path: str = EVENTS_PATH, method="POST"):
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.port}{path}", data=body, headers=headers, method=method
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def signed(
    batch: AgentEventBatch, secret: bytes = SECRET, ts: int | None = None
) -> tuple[bytes, dict[str, str]]:
    body = batch.model_dump_json().encode()
    return body, signed_headers(secret, batch.node, int(time.time()) if ts is None else ts, body)


def test_accepts_stores_before_reply_and_wakes(ingest):
    body, headers = signed(
        AgentEventBatch(node="gpu-01", events=[event("e1"), event("e2", fatal=False, xid=13)])
    )
    status, doc = post(ingest, body, headers)
    assert status == 202 and doc == {"accepted": 1, "duplicates": 0, "ignored_nonfatal": 1}
    assert ingest.wake.is_set()
    pending = ingest.store.pending()  # already durable when the 202 arrived
    assert [(e.event_id, e.node, e.xid, e.source) for e in pending] == [("e1", "gpu-01", 79, "agent-push")]
    assert ingest.store.events()[0]["kind"] == "agent_xid"  # the non-fatal one is only logged
    ingest.wake.clear()
    status, doc = post(ingest, body, headers)  # a retry of the same request
    assert status == 202 and doc["duplicates"] == 1 and not ingest.wake.is_set()
    assert len(ingest.store.pending()) == 1


@pytest.mark.parametrize(
    ("mutate", "status"),
    [
        (lambda b, h: (b, {**h, "X-FleetYield-Signature": "sha256=" + "0" * 64}), 401),
        (lambda b, h: (b, {k: v for k, v in h.items() if k != "X-FleetYield-Signature"}), 401),
        (lambda b, h: (b.replace(b"gpu-01", b"gpu-02", 1), h), 401),  # tampered body
        (lambda b, h: (b, {**h, "X-FleetYield-Node": "gpu-02"}), 400),  # signed, but inconsistent
    ],
)
def test_rejections_change_nothing(ingest, mutate, status):
    body, headers = mutate(*signed(AgentEventBatch(node="gpu-01", events=[event("e1")])))
    assert post(ingest, body, headers)[0] == status
    assert ingest.store.pending() == [] and not ingest.wake.is_set()


def test_unauthenticated_pushes_are_counted_not_stored(ingest):
    seen: list[tuple[str, str]] = []
    ingest.on_unauthenticated = lambda endpoint, reason: seen.append((endpoint, reason))
    batch = AgentEventBatch(node="gpu-01", events=[event("e1", fatal=False, xid=13)])
    for _ in range(5):
        assert post(ingest, *signed(batch, secret=b"other-secret-0123456789"))[0] == 401
    body, headers = signed(batch)
    assert post(ingest, body, {**headers, "X-FleetYield-Node": "gpu-02"})[0] == 400  # authentic: not counted
    assert seen == [("events", "bad_signature")] * 5
    assert ingest.store.events() == [] and ingest.store.pending() == []


def test_wrong_secret_stale_timestamp_and_bad_json(ingest):
    batch = AgentEventBatch(node="gpu-01", events=[event("e1")])
    assert post(ingest, *signed(batch, secret=b"other"))[0] == 401
    assert post(ingest, *signed(batch, ts=int(time.time()) - 3600))[0] == 401
    body = b'{"node": "gpu-01", "events": [{"nope": 1}]}'
    headers = signed_headers(SECRET, "gpu-01", int(time.time()), body)
    status, doc = post(ingest, body, headers)
    assert status == 400 and "malformed body" in doc["error"]
    assert ingest.store.pending() == []


def test_size_limit_path_and_methods(ingest):
    batch = AgentEventBatch(node="gpu-01", events=[event(f"e{i}") for i in range(40)])
    assert post(ingest, *signed(batch))[0] == 413
    assert post(ingest, b"{}", {}, path="/v1/other")[0] == 404
    assert post(ingest, None, {}, method="GET")[0] == 405
    assert ingest.store.pending() == []


def test_the_agents_pusher_delivers(ingest, tmp_path):
    pusher = Pusher(tmp_path / "agent", "gpu-01", f"http://127.0.0.1:{ingest.port}{EVENTS_PATH}", SECRET)
    pusher.enqueue([event("p1"), event("p2", xid=48)])
    assert pusher.flush_once()
    assert ingest.wake.wait(5)
    assert sorted(e.event_id for e in ingest.store.pending()) == ["p1", "p2"]


def test_an_xid_storm_of_one_gpu_is_one_row_with_its_count():
    t0 = 1_700_000_000.0
    storm = [
        AgentEvent(event_id=f"s{i}", time=t0 + i, node="gpu-01", gpu=3, kind="xid", xid=95, fatal=True)
        for i in range(40)
    ]
    other_gpu = AgentEvent(event_id="g5", time=t0 + 1, node="gpu-01", gpu=5, kind="xid", xid=95, fatal=True)
    later = AgentEvent(event_id="late", time=t0 + 400, node="gpu-01", gpu=3, kind="xid", xid=95, fatal=True)
    kept = fatal_events([*storm, other_gpu, later])
    assert [(e.event_id, e.gpu) for e in kept] == [("s0", 3), ("g5", 5), ("late", 3)]
    assert kept[0].message.endswith("(x40 within 300s)")
    assert "(x" not in kept[1].message and "(x" not in kept[2].message  # past the window: new evidence


def test_an_xid_the_controller_drains_is_queued_though_the_agent_calls_it_non_fatal(tmp_path):
    store = Store(tmp_path / "fy.db")
    server = IngestServer("127.0.0.1", 0, SECRET, store, threading.Event(), drain_xids=frozenset({13}))
    try:
        batch = AgentEventBatch(
            node="gpu-01", events=[event("e13", fatal=False, xid=13), event("e31", fatal=False, xid=31)]
        )
        status, doc = server.handle(*reversed(signed(batch)))
        assert status == 202 and doc == {"accepted": 1, "duplicates": 0, "ignored_nonfatal": 1}
        assert [e.event_id for e in store.pending()] == ["e13"]
    finally:
        store.close()


def test_replayed_pushes_do_not_flood_the_event_log(tmp_path):
    # issue #27 item 5: 50 replays of one 200-event body wrote 10,000 rows, pushing history past events_keep
    store = Store(tmp_path / "fy.db", events_keep=100)
    server = IngestServer("127.0.0.1", 0, SECRET, store, threading.Event(), max_body_bytes=1 << 20)
    server.start()
    try:
        events = [event(f"n{i:03d}", fatal=False, xid=13) for i in range(190)]
        # ten fatal events of ten GPUs (one GPU's repeats of one XID would fold into one row)
        events += [event(f"f{i:03d}").model_copy(update={"gpu": i}) for i in range(10)]
        body, headers = signed(AgentEventBatch(node="gpu-01", events=events))
        status, doc = post(server, body, headers)
        assert status == 202 and (doc["accepted"], doc["ignored_nonfatal"]) == (10, 190)
        first = store.events(limit=10_000)
        for _ in range(50):
            status, doc = post(server, body, headers)
            assert status == 202 and (doc["accepted"], doc["duplicates"]) == (0, 10)
        assert store.events(limit=10_000) == first and len(store.pending()) == 10
        # an agent's retry of the same events (new timestamp, same ids) is a duplicate too, after a restart
        store.close()
        store = server.store = Store(tmp_path / "fy.db", events_keep=100)
        assert (
            post(server, *signed(AgentEventBatch(node="gpu-01", events=events[180:])))[1]["duplicates"] == 10
        )
        assert store.events(limit=10_000) == first
        # new events still go in
        assert (
            post(server, *signed(AgentEventBatch(node="gpu-01", events=[event("new", fatal=False)])))[0]
            == 202
        )
        assert [e["data"]["event_id"] for e in store.events(limit=1)] == ["new"]
    finally:
        server.stop()
        store.close()


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "TRACE", "PROPFIND", "PUT"])
def test_every_other_method_is_405_like_the_api(ingest, method):
    # issue #27 item 12: the push port answered 501 (the stdlib's default) where the API says 405
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=5)
    try:
        conn.request(method, EVENTS_PATH, body=b"" if method == "PUT" else None)
        resp = conn.getresponse()
        resp.read()
        assert (resp.status, resp.getheader("Allow")) == (405, "POST")
    finally:
        conn.close()
    assert ingest.store.pending() == []


def test_a_client_gone_mid_reply_prints_no_traceback(ingest, capsys):
    # issue #27 item 12: broken-pipe tracebacks on stderr (socketserver's handle_error prints them)
    from rig import reset_mid_request

    body = b'{"events": []}'
    head = f"POST {EVENTS_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    reset_mid_request(ingest.port, head + body)
    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=5)
    try:
        conn.request("GET", EVENTS_PATH)
        assert conn.getresponse().status == 405
    finally:
        conn.close()
    assert capsys.readouterr().err == ""
