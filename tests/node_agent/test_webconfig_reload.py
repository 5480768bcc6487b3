"""Issue 27 item 1: certificates rotate without a restart. The agent's listener re-reads its web-config file
when the file or a certificate it names changes (node_agent/webconfig.py ``WebConfigWatcher``, checked by the
loop of node_agent/httpd.py); a bad new file keeps the old config and the error, naming file, field and
value, is logged and counted. Real TLS on localhost, CAs from tests/pki.py; everything polls."""

from __future__ import annotations

import http.client
import logging
import ssl
from base64 import b64encode
from pathlib import Path

import bcrypt
import pytest
from pki import issue
from rig import wait_for

from node_agent.config import build_config
from node_agent.exporter import Server

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def _status(port: int, ca: Path, user: str = "alice") -> int | str:
    """GET /metrics trusting only ``ca``: the status, or the kind of failure."""
    ctx = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    try:
        auth = {"Authorization": "Basic " + b64encode(f"{user}:s3cret".encode()).decode()}
        conn.request("GET", "/metrics", headers=auth)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    except ssl.SSLCertVerificationError:
        return "untrusted"
    finally:
        conn.close()


def _metrics(port: int, ca: Path) -> str:
    conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cafile=str(ca)))
    try:
        conn.request(
            "GET", "/metrics", headers={"Authorization": "Basic " + b64encode(b"bob:s3cret").decode()}
        )
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_rotated_certificates_and_users_load_and_a_bad_file_keeps_the_old_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old_ca, _, old_signer = issue(tmp_path, "old-ca")
    new_ca, _, new_signer = issue(tmp_path, "new-ca")
    _, key, _ = issue(tmp_path, "server", old_signer)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  alice: '{HASH}'\n")  # fmt: skip
    cfg = build_config(
        None,
        {
            "backend": "fake",
            "listen": "127.0.0.1",
            "port": 0,
            "state_dir": tmp_path / "st",
            "web_config_file": web,
        },
    )
    srv = Server(cfg)
    srv.start()
    try:
        assert srv.http is not None
        assert _status(srv.port, old_ca) == 200
        assert _status(srv.port, new_ca) == "untrusted"

        issue(tmp_path, "server", new_signer)  # the admin rotates the certificate and key in place
        wait_for(lambda: _status(srv.port, new_ca) == 200, what="the rotated certificate served")
        assert _status(srv.port, old_ca) == "untrusted"
        assert srv.http.stats()["web_config_reloads"] == 1

        caplog.set_level(logging.ERROR, logger="node_agent.webconfig")
        good = web.read_text()
        web.write_text(good.replace(HASH, "hunter2-in-plain-text"))  # a bad edit
        wait_for(lambda: srv.http.stats()["web_config_errors"] == 1, what="the bad file noticed")
        assert _status(srv.port, new_ca) == 200  # the previous config stays in force
        assert _status(srv.port, new_ca, "mallory") == 401
        (message,) = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
        assert message.startswith(f"{web}: basic_auth_users: alice: not a bcrypt hash (got 'hunter2")

        web.write_text(good.replace("alice", "bob"))  # fixed: now bob
        wait_for(lambda: _status(srv.port, new_ca, "bob") == 200, what="the fixed file loaded")
        assert _status(srv.port, new_ca, "alice") == 401
        assert srv.http.stats()["web_config_errors"] == 1
        assert srv.http.stats()["web_config_reloads"] == 2
        key.unlink()  # a certificate's key gone: refused, counted, the old context kept
        wait_for(lambda: srv.http.stats()["web_config_errors"] == 2, what="the missing key noticed")
        assert _status(srv.port, new_ca, "bob") == 200
        metrics = _metrics(srv.port, new_ca)
        assert 'fleetyield_agent_listener_web_config_errors_total{listener="metrics"} 2\n' in metrics
        assert 'fleetyield_agent_listener_web_config_reloads_total{listener="metrics"} 2\n' in metrics
        assert any("tls_server_config.key_file: no such file (got 'server.key')" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
    finally:
        srv.stop()
