"""Alertmanager webhook: payload v4 parsing, bearer auth, mapping to FatalEvent, and the real listener.

The listener tests run the push listener (``IngestServer``) in-process on 127.0.0.1 with a real SQLite
store; the fuzz test throws thousands of malformed bodies and headers at it and requires zero inbox rows,
no wake-up and no 5xx.
"""

from __future__ import annotations

import contextlib
import copy
import http.client
import json
import os
import threading
import time
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slurm_fleetyield.adapters.alertmanager import (
    WEBHOOK_PATH,
    AlertmanagerWebhook,
    WebhookError,
    bearer_ok,
    event_id,
    parse_webhook,
    read_token,
    to_fatal_events,
)
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.config import ConfigError, from_mapping

TOKEN = b"am-token-for-tests"
AUTH = {"Authorization": "Bearer am-token-for-tests"}
NOW = time.time()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alert(
    node: str = "gpu-01",
    status: str = "firing",
    fp: str = "4c1a2b3c4d5e6f70",
    starts: float | None = None,
    **labels: str,
) -> dict:
    base = {
        "alertname": "FleetYieldFatalXid",
        "node": node,
        "gpu": "3",
        "xid": "79",
        "UUID": "GPU-1",
        "severity": "critical",
        "fleetyield_action": "quarantine",
    }
    base.update(labels)
    return {
        "status": status,
        "labels": {k: v for k, v in base.items() if v is not None},
        "annotations": {"summary": "Fatal XID"},
        "startsAt": iso(NOW - 5 if starts is None else starts),
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else iso(NOW),
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fp,
    }


def payload(*alerts: dict, status: str = "firing") -> dict:
    return {
        "version": "4",
        "groupKey": '{}/{fleetyield_action="quarantine"}:{}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "fleetyield",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
    }


def body(doc: dict) -> bytes:
    return json.dumps(doc).encode()


# -- pure parsing and mapping ---------------------------------------------------------------------------


def test_firing_quarantine_alert_becomes_one_fatal_event():
    mapped = to_fatal_events(parse_webhook(body(payload(alert()))), now=NOW)
    (ev,) = mapped.events
    assert (ev.node, ev.kind, ev.source, ev.gpu, ev.xid, ev.uuid) == (
        "gpu-01",
        "alert",
        "alertmanager",
        3,
        79,
        "GPU-1",
    )
    assert ev.message == "FleetYieldFatalXid XID 79 gpu 3"
    assert abs(ev.time - (NOW - 5)) < 1e-3
    assert ev.event_id == event_id(
        "4c1a2b3c4d5e6f70", parse_webhook(body(payload(alert()))).alerts[0].startsAt
    )


def test_event_id_is_stable_per_alert_instance():
    first = to_fatal_events(parse_webhook(body(payload(alert()))), now=NOW).events[0].event_id
    again = to_fatal_events(parse_webhook(body(payload(alert()))), now=NOW).events[0].event_id
    refired = to_fatal_events(parse_webhook(body(payload(alert(starts=NOW)))), now=NOW).events[0].event_id
    other = to_fatal_events(parse_webhook(body(payload(alert(fp="99")))), now=NOW).events[0].event_id
    assert first == again and len({first, refired, other}) == 3


def test_resolved_and_unlabelled_alerts_are_ignored():
    doc = payload(
        alert(status="resolved"),
        alert(fp="aa", fleetyield_action=None),
        alert(fp="bb", fleetyield_action="page"),
    )
    mapped = to_fatal_events(parse_webhook(body(doc)), now=NOW)
    assert mapped.events == () and mapped.ignored == 3


def test_node_label_fallbacks_and_stale_replays():
    doc = payload(alert(node=None, Hostname="gpu-07"), alert(fp="cc", node=None, hostname="gpu-08"))
    assert [e.node for e in to_fatal_events(parse_webhook(body(doc)), now=NOW).events] == ["gpu-07", "gpu-08"]
    old = alert(fp="dd")
    old["endsAt"] = iso(NOW - 7200)
    mapped = to_fatal_events(parse_webhook(body(payload(old))), now=NOW, stale_after_s=3600)
    assert mapped.events == () and mapped.stale == 1


@pytest.mark.parametrize(
    "mutate, why",
    [
        (lambda d: d.update(version="3"), "version"),
        (lambda d: d.pop("alerts"), "alerts"),
        (lambda d: d["alerts"][0].update(status="maybe"), "status"),
        (lambda d: d["alerts"][0].update(startsAt="yesterday"), "startsAt"),
        (lambda d: d["alerts"][0].update(fingerprint="not-hex!"), "fingerprint"),
        (lambda d: d["alerts"][0]["labels"].update(gpu="three"), "gpu"),
        (lambda d: d["alerts"][0]["labels"].pop("node"), "no node label"),
        (lambda d: d["alerts"][0]["labels"].update(node="gpu-01; rm -rf /"), "not a node name"),
        (lambda d: d["alerts"][0]["labels"].update(node=7), "labels"),
        (lambda d: d.update(alerts={"a": 1}), "alerts"),
    ],
)
def test_malformed_payloads_are_rejected(mutate, why):
    doc = copy.deepcopy(payload(alert()))
    mutate(doc)
    with pytest.raises(WebhookError, match=why):
        to_fatal_events(parse_webhook(body(doc)), now=NOW)


@pytest.mark.parametrize("raw", [b"", b"null", b"[]", b"{", b"\xff\xfe", b"[" * 100_000])
def test_non_json_bodies_are_rejected(raw):
    with pytest.raises(WebhookError):
        parse_webhook(raw)


def test_bearer_check():
    assert bearer_ok("Bearer am-token-for-tests", TOKEN)
    assert bearer_ok("bearer  am-token-for-tests ", TOKEN)
    for bad in (None, "", "Bearer", "Bearer am-token-for-test", "Basic am-token-for-tests", "Bearer é"):
        assert not bearer_ok(bad, TOKEN)


def test_token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("  s3cret\n")
    os.chmod(path, 0o600)
    assert read_token(path) == b"s3cret"
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="group/world"):
        read_token(path)
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(tmp_path / "missing")
    path.write_text("\n")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError, match="empty"):
        read_token(path)


def test_config_keys():
    cfg = from_mapping(
        {"alertmanager": {"token_file": "/etc/fleetyield/am.token"}, "sense": {"mode": "prometheus"}}
    )
    assert cfg.alertmanager.active and not cfg.push.active and cfg.sense.mode == "prometheus"
    with pytest.raises(ConfigError, match="node_label"):
        from_mapping({"prometheus": {"node_label": "host-name"}})
    with pytest.raises(ConfigError, match="url"):
        from_mapping({"prometheus": {"url": "prometheus:9090"}})


def test_handle_status_codes():
    hook = AlertmanagerWebhook(TOKEN, max_body_bytes=2048)
    assert hook.handle({}, body(payload(alert())), NOW)[0] == 401
    assert hook.handle({"authorization": "Bearer nope"}, body(payload(alert())), NOW)[0] == 401
    assert hook.handle(AUTH, b"{", NOW)[0] == 400
    assert hook.handle(AUTH, b"x" * 4096, NOW)[0] == 413
    status, reply, events = hook.handle(AUTH, body(payload(alert())), NOW)
    assert status == 200 and len(events) == 1 and reply["events"] == 1


# -- over the real listener -----------------------------------------------------------------------------


class FailingStore(Store):
    def put_events(self, events, received_at=None):
        raise OSError("disk full")


@pytest.fixture
def listener(tmp_path):
    def make(store_cls=Store, secret=None):
        store = store_cls(tmp_path / "fy.db")
        wake = threading.Event()
        server = IngestServer(
            "127.0.0.1",
            0,
            secret,
            store,
            wake,
            alertmanager=AlertmanagerWebhook(TOKEN, max_body_bytes=64 * 1024),
        )
        server.start()
        made.append((server, store))
        return server, store, wake

    made: list = []
    yield make
    for server, store in made:
        server.stop()
        store.close()


def send(
    server: IngestServer, data: bytes, headers: dict[str, str], path: str = WEBHOOK_PATH, method: str = "POST"
):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


def test_listener_stores_wakes_and_is_idempotent(listener):
    server, store, wake = listener()
    status, reply = send(server, body(payload(alert())), AUTH)
    assert status == 200 and reply["accepted"] == 1 and wake.is_set()
    (ev,) = store.pending()
    assert ev.source == "alertmanager" and ev.node == "gpu-01"
    wake.clear()
    # Alertmanager re-sends on every group_interval and retries: same alert, same event, no new wake-up
    status, reply = send(server, body(payload(alert())), AUTH)
    assert status == 200 and reply["accepted"] == 0 and reply["duplicates"] == 1 and not wake.is_set()
    assert len(store.pending()) == 1


def test_listener_rejections_change_nothing(listener):
    server, store, wake = listener()
    good = body(payload(alert()))
    assert send(server, good, {})[0] == 401
    assert send(server, good, {"Authorization": "Bearer wrong"})[0] == 401
    assert send(server, b"x" * (64 * 1024 + 1), AUTH)[0] == 413
    assert send(server, b"{}", AUTH)[0] == 400
    assert send(server, body(payload(alert(status="resolved"), status="resolved")), AUTH)[0] == 200
    assert send(server, good, AUTH, method="GET")[0] == 405
    # the agent path is off without a push secret
    assert send(server, good, AUTH, path="/v1/agent/events")[0] == 404
    assert store.pending() == [] and not wake.is_set()


def test_storage_failure_is_503_so_alertmanager_retries(listener):
    server, _store, wake = listener(FailingStore)
    status, reply = send(server, body(payload(alert())), AUTH)
    assert status == 503 and "disk full" in reply["error"] and not wake.is_set()


# Hypothesis: malformed bodies and headers from a hostile or broken sender.
_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def hostile_requests(draw):
    kind = draw(st.sampled_from(["bytes", "json", "mutated", "auth"]))
    headers = dict(AUTH)
    if kind == "bytes":
        data = draw(st.binary(max_size=300))
    elif kind == "json":
        data = json.dumps(draw(_json)).encode()
    elif kind == "mutated":  # a real payload with one field replaced by arbitrary JSON
        doc = payload(alert(), alert(fp="ab12", node="gpu-02"))
        target = draw(st.sampled_from(["top", "alert", "labels"]))
        where = (
            doc if target == "top" else doc["alerts"][0] if target == "alert" else doc["alerts"][0]["labels"]
        )
        key = draw(st.sampled_from(sorted(where)))
        where[key] = draw(_json.filter(lambda v, k=key, w=where: v != w[k]))
        data = json.dumps(doc).encode()
        # only malformed ones: a mutation that stays valid (a new node name, ...) is not hostile
        with contextlib.suppress(WebhookError):
            assume(not to_fatal_events(parse_webhook(data), now=time.time()).events)
    else:  # a valid body with a bad Authorization header
        data = body(payload(alert()))
        headers = {
            "Authorization": draw(
                st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
            )
        }
    return data, headers


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=hostile_requests())
def test_fuzz_listener_never_stores_never_5xx(hostile_listener, req):
    server, store, wake = hostile_listener
    data, headers = req
    status, _ = send(server, data, headers)
    if status == 200:  # a mutation that happened to stay valid: it may only be a no-op alert
        mapped = to_fatal_events(parse_webhook(data), now=time.time())
        assert not mapped.events
    assert status in (200, 400, 401, 413), status
    assert store.pending() == [] and not wake.is_set()


@pytest.fixture(scope="module")
def hostile_listener(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("fuzz") / "fy.db")
    wake = threading.Event()
    server = IngestServer(
        "127.0.0.1", 0, None, store, wake, alertmanager=AlertmanagerWebhook(TOKEN, max_body_bytes=64 * 1024)
    )
    server.start()
    yield server, store, wake
    server.stop()
    store.close()
