"""The attestation hand-over posts to the push listener; when that listener asks for basic auth (its
web-config file), the agent's push client (push_basic_auth, push_tls_config: node_agent/httpclient.py) is
sent with the hand-over too, as with pushes. Real listener and AttestService on localhost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import bcrypt
import pytest
from attest_rig import Clock, make_attestor, make_controller

from node_agent.attest.service import AttestError
from node_agent.httpclient import BasicAuthConfig, HttpClient, HttpClientConfig
from node_agent.webconfig import load_web_config
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.gate.keys import format_public_line

SECRET = b"handover-auth-secret-0123"


def test_the_handover_authenticates_to_a_basic_auth_push_listener(tmp_path: Path) -> None:
    ctl = make_controller(tmp_path)
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  agent: '{bcrypt.hashpw(b'pw-1234', bcrypt.gensalt(4)).decode()}'\n")
    store = Store(tmp_path / "fy.db")
    ingest = IngestServer(
        "127.0.0.1", 0, SECRET, store, threading.Event(), attest=ctl.service, web=load_web_config(web)
    )
    ingest.start()
    try:
        pub = tmp_path / "fy-attest.pub"
        pub.write_text(format_public_line("fy-attest", ctl.key.public_key()) + "\n")
        attestor = make_attestor(
            tmp_path,
            Clock(time.time()),
            controller_url=f"http://127.0.0.1:{ingest.port}",
            controller_pubkey=pub,
        )
        attestor.secret = SECRET
        ctl.enroll(attestor)
        ctl.learn_from(attestor, time.time())
        with pytest.raises(AttestError, match="HTTP 401"):
            attestor.handover("7")  # no client: locked out, as pushes were
        password = tmp_path / "pw"
        password.write_text("pw-1234\n")
        attestor.client = HttpClient(
            HttpClientConfig(basic_auth=BasicAuthConfig(username="agent", password_file=str(password))),
            "push_",
        )
        assert attestor.handover("8")["status"] == "pass"
    finally:
        ingest.stop()
        store.close()
        ctl.store.close()
