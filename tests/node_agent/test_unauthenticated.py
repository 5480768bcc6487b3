"""The agent counts the requests it refuses for want of authentication (node_agent/unauthenticated.py): the
listener's basic auth (401) and the signed reset (401 bad signature, 403 signed for another node) show in
its own /metrics as ``fleetyield_agent_unauthenticated_requests_total{endpoint, reason}``, as the
controller's listeners count theirs. Before, ``on_unauthorized`` was never set on the agent and the reset
endpoint counted nothing: a flood of refused requests left no trace. A real agent (fake backend) on
127.0.0.1, its real HTTP listener."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import tempfile
from base64 import b64encode
from pathlib import Path

import bcrypt
import pytest
from rig import write_secret

from node_agent.config import build_config
from node_agent.control import call
from node_agent.exporter import Server
from node_agent.protocol import CONTROL_RESET_PATH, ResetRequest, signed_headers
from node_agent.unauthenticated import METRIC, Unauthenticated

SECRET = b"unauthenticated-secret-01"
NOBODY = 65534
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
            ("control", "peer_uid"): 0,
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
            ("control", "peer_uid"): 0,
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
        ("control", "peer_uid"): 0,
        ("quote", "something_new"): 1,
    }
    (family,) = counts.collect()
    assert family.name == METRIC and family.type == "counter" and len(family.samples) == 5


def _ping_as(uid: int, path: Path) -> bytes:
    """One control request from a forked child running as ``uid``: the line it got back (SO_PEERCRED
    records the uid at connect time, so the child drops root before it connects)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: plain syscalls only, then _exit
        code = 1
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(30)  # a loaded CI box: the server's thread may answer late
                c.connect(str(path))
                # the server refuses at accept: its answer may be written and its end closed first
                with contextlib.suppress(BrokenPipeError):
                    c.sendall(b'{"op": "ping"}\n')
                os.write(w, c.recv(4096))
            code = 0
        except BaseException as e:  # what went wrong, for the parent's assertion
            os.write(w, f"child failed: {e!r}".encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        line = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (status, line)
    return line


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the caller runs as another uid (nobody)")
def test_a_local_caller_of_another_uid_is_refused_and_counted() -> None:
    """The control socket's second check (the first is its mode, 0600): a caller that can open it but is
    neither root nor the agent's uid gets "permission denied", nothing runs, and the refusal shows on
    /metrics as ``{endpoint="control", reason="peer_uid"}``. The socket's directory and mode are loosened
    here so that such a caller can reach the uid check at all."""
    state = Path(tempfile.mkdtemp(prefix="fy-ctl-"))  # not under pytest's 0700 tmp root: nobody must reach it
    try:
        state.chmod(0o755)
        cfg = build_config(
            None, {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": state, "gpus": 2}
        )
        srv = Server(cfg)
        srv.start()
        try:
            sock = state / "agent.sock"
            sock.chmod(0o666)
            line = _ping_as(NOBODY, sock)
            assert json.loads(line) == {"ok": False, "error": f"permission denied for uid {NOBODY}"}
            assert srv.control is not None and srv.control.stats()["denied"] == 1
            assert srv.unauthenticated.read()[("control", "peer_uid")] == 1
            assert call(state, {"op": "ping"})["backend"] == "fake"  # root is still answered
        finally:
            srv.stop()
    finally:
        shutil.rmtree(state, ignore_errors=True)
