"""Read-only API over real HTTP on 127.0.0.1, reading a committed tick from the real store."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel
from slurm_fleetyield.adapters.metrics import ControllerStats, TickSnapshot, make_registry
from slurm_fleetyield.adapters.store import LogRow, Store
from slurm_fleetyield.adapters.views import render_result


@pytest.fixture
def api(tmp_path, tick_parts, now):
    NOW = now
    result, report, samples = tick_parts
    store = Store(tmp_path / "fy.db")
    view = render_result(3, NOW, result, report, samples, dry_run=False, duration_s=0.5)
    rows = [LogRow(NOW, e.kind, e.node, e.message) for e in result.events]
    store.commit_tick(3, NOW, result.state, (), rows, view)
    stats = ControllerStats()
    stats.record_tick(TickSnapshot(3, NOW, 0.5, result, report, True, 0))
    clock = {"now": NOW + 1}
    server = ApiServer(
        "127.0.0.1",
        0,
        StoreReadModel(store, lambda: {"slurm_ok": True}),
        make_registry(stats),
        stale_after_s=60,
        clock=lambda: clock["now"],
    )
    server.start()
    server.clock_box = clock
    yield server
    server.stop()
    store.close()


def get(server, path, method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read()
            ctype = resp.headers["Content-Type"]
            return resp.status, json.loads(body) if ctype.startswith("application/json") else body.decode()
    except urllib.error.HTTPError as err:
        body = err.read()
        return err.code, json.loads(body) if body else None


def test_status_nodes_and_node(api):
    status, doc = get(api, "/v1/status")
    assert (
        status == 200
        and doc["tick"] == 3
        and doc["summary"]["nodes"] == 4
        and doc["live"] == {"slurm_ok": True}
    )
    assert doc["inbox"] == {"pending": 0, "processed": 0} and doc["apply"]["failed"]
    status, rows = get(api, "/v1/nodes")
    assert status == 200 and {r["node"] for r in rows} == {"cpu-01", "gpu-01", "gpu-02", "gpu-03"}
    assert set(rows[0]) == {
        "node",
        "tier",
        "health",
        "risk",
        "features",
        "weight",
        "slurm_state",
        "reason",
        "scrape_error",
    }
    status, node = get(api, "/v1/nodes/gpu-02")
    assert (
        status == 200
        and node["tier"] == "quarantined"
        and set(node["slurm_state"].split("+")) == {"MIXED", "DRAIN"}
    )
    assert get(api, "/v1/nodes/nope")[0] == 404


def test_explain_and_gate(api):
    status, doc = get(api, "/v1/nodes/gpu-01/explain")
    assert status == 200 and doc["text"].startswith("node gpu-01:") and doc["explain"]["node"] == "gpu-01"
    assert get(api, "/v1/nodes/gpu-02/gate") == (
        200,
        {"allow": False, "reason": get(api, "/v1/nodes/gpu-02/gate")[1]["reason"]},
    )
    assert get(api, "/v1/nodes/gpu-02/gate")[1]["reason"].startswith("fleetyield: node quarantined")
    assert get(api, "/v1/nodes/gpu-01/gate")[1]["allow"] is True  # red/unknown still runs jobs
    assert get(api, "/v1/nodes/gpu-03/gate")[1]["allow"] is True  # drained by someone else: not our call
    assert get(api, "/v1/nodes/unknown-node/gate")[1] == {
        "allow": True,
        "reason": "unknown-node is not managed by fleetyield",
    }


def test_events_limit_and_validation(api):
    status, rows = get(api, "/v1/events?limit=1")
    assert status == 200 and len(rows) == 1
    assert get(api, "/v1/events?limit=0")[0] == 400
    assert get(api, "/v1/events?limit=abc")[0] == 400


def test_healthz_fresh_then_stale(api, now):
    assert get(api, "/healthz") == (200, {"ok": True, "tick": 3, "last_tick_age_s": 1.0})
    api.clock_box["now"] = now + 61
    assert get(api, "/healthz")[0] == 503


def test_metrics_endpoint(api):
    status, text = get(api, "/metrics")
    assert status == 200 and 'fleetyield_nodes{tier="quarantined"} 1.0' in text


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_writes_are_405(api, method):
    assert get(api, "/v1/nodes/gpu-01", method=method)[0] == 405


def test_healthz_before_first_tick(tmp_path):
    store = Store(tmp_path / "empty.db")
    server = ApiServer("127.0.0.1", 0, StoreReadModel(store))
    assert server.route("/healthz", {})[0] == 503
    assert server.route("/v1/nodes", {}) == (200, [])
    assert server.route("/v1/nodes/x/gate", {})[1]["allow"] is True
    server._httpd.server_close()
    store.close()


def test_proposals_ledger_calibration(tmp_path, tick_parts, now):
    from slurm_fleetyield.gate import Gatekeeper, Proposal

    result, report, samples = tick_parts
    store = Store(tmp_path / "fy.db")
    store.commit_tick(
        3,
        now,
        result.state,
        (),
        [],
        render_result(3, now, result, report, samples, dry_run=False, duration_s=0.1),
    )
    gate_dir = tmp_path / "gate"
    with Gatekeeper.open(gate_dir) as gk:
        gk.propose(
            Proposal.new(
                id="p-00000000000a", node="gpu-01", gpus=(1,), risk=0.9, evidence="e", now=now, ttl_s=60
            )
        )
        gk.propose(
            Proposal.new(
                id="p-00000000000b", node="gpu-02", gpus=(), risk=0.9, evidence="e", now=now - 10, ttl_s=5
            )
        )
        gk.expire(now)
    server = ApiServer("127.0.0.1", 0, StoreReadModel(store, gate_dir=str(gate_dir), clock=lambda: now + 1))
    status, doc = server.route("/v1/proposals", {})
    assert status == 200 and [p["id"] for p in doc["pending"]] == ["p-00000000000a"]
    assert [p["status"] for p in doc["recent"]] == ["expired"]
    assert server.route("/v1/proposals/p-00000000000a", {})[1]["gpus"] == [1]
    assert server.route("/v1/proposals/p-0000000000ff", {})[0] == 404
    assert server.route("/v1/ledger", {"by": ["node"]}) == (200, {"by": "node", "since": None, "groups": []})
    assert server.route("/v1/ledger", {"by": ["user"]})[0] == 400
    status, doc = server.route("/v1/calibration", {})
    assert status == 200 and doc["tick"] == 3 and "brier" in doc
    server._httpd.server_close()
    store.close()
