"""The agent counts the requests it refuses for want of authentication (node_agent/unauthenticated.py): the
listener's basic auth (401) and the signed reset (401 bad signature, 403 signed for another node) show in
its own /metrics as ``fleetyield_agent_unauthenticated_requests_total{endpoint, reason}``, as the
controller's listeners count theirs. Before, ``on_unauthorized`` was never set on the agent and the reset
endpoint counted nothing: a flood of refused requests left no trace. A real agent (fake backend) on
127.0.0.1, its real HTTP listener."""

from __future__ import annotations

import http.client
import re
from base64 import b64encode
from pathlib import Path

import bcrypt
from rig import write_secret

from node_agent.config import build_config
from node_agent.exporter import Server
from node_agent.protocol import CONTROL_RESET_PATH, ResetRequest, signed_headers
from node_agent.unauthenticated import METRIC, Unauthenticated

SECRET = b"unauthenticated-secret-01"
AUTH = "prometheus:s3cret"


def _request(port: int, method: str, path: str, auth: str | None, body: bytes = b"", **headers: str):  # type: ignore[no-untyped-def]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    if auth is not None:
        headers["Authorization"] = "Basic " + b64encode(auth.encode()).decode()
    try:
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def _counts(metrics: str) -> dict[tuple[str, str], int]:
    pattern = rf'^{METRIC}_total\{{endpoint="(\w+)",reason="(\w+)"\}} (\d+)$'
    return {(e, r): int(n) for e, r, n in re.findall(pattern, metrics, re.MULTILINE)}


def test_refused_requests_are_counted_on_the_agents_metrics(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(
        f"basic_auth_users:\n  prometheus: '{bcrypt.hashpw(b's3cret', bcrypt.gensalt(4)).decode()}'\n"
    )
    cfg = build_config(
        None,
        {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": tmp_path / "st", "gpus": 2,
         "web_config_file": web, "push_secret_file": write_secret(tmp_path / "secret", SECRET)},
    )  # fmt: skip
    srv = Server(cfg)
    srv.start()
    try:
        assert srv.agent is not None
        status, metrics = _request(srv.port, "GET", "/metrics", AUTH)
        assert status == 200 and _counts(metrics) == {
            ("metrics", "basic_auth"): 0,
            ("reset", "bad_signature"): 0,
            ("reset", "wrong_node"): 0,
        }  # every known pair from 0: rate() has a series before the first refusal
        assert _request(srv.port, "GET", "/metrics", None)[0] == 401
        assert _request(srv.port, "GET", "/metrics", "prometheus:wrong")[0] == 401
        assert _request(srv.port, "POST", CONTROL_RESET_PATH, "nobody:s3cret", b"{}")[0] == 401

        def reset(node: str, secret: bytes, request_id: str) -> int:
            body = ResetRequest(node=node, gpus=[1], request_id=request_id).model_dump_json().encode()
            headers = signed_headers(secret, node, int(srv.clock()), body)
            return _request(srv.port, "POST", CONTROL_RESET_PATH, AUTH, body, **headers)[0]

        assert reset(srv.agent.node, b"not-the-secret-000000000", "rst-forged-0001") == 401
        assert reset("gpu-other", SECRET, "rst-other-0001") == 403
        assert reset("gpu-other", SECRET, "rst-other-0002") == 403
        status, metrics = _request(srv.port, "GET", "/metrics", AUTH)
        assert status == 200 and _counts(metrics) == {
            ("metrics", "basic_auth"): 3,
            ("reset", "bad_signature"): 1,
            ("reset", "wrong_node"): 2,
        }, metrics
        assert not (cfg.state_dir / "control_nonces.json").exists()  # none of them changed anything
    finally:
        srv.stop()


def test_counts_start_at_zero_and_take_new_reasons() -> None:
    counts = Unauthenticated()
    counts.add("reset", "wrong_node")
    counts.add("quote", "something_new")
    assert counts.read() == {
        ("metrics", "basic_auth"): 0,
        ("reset", "bad_signature"): 0,
        ("reset", "wrong_node"): 1,
        ("quote", "something_new"): 1,
    }
    (family,) = counts.collect()
    assert family.name == METRIC and family.type == "counter" and len(family.samples) == 4
