"""Outcome forwarding (Epilog spool -> real agent process -> real controller listener) and the signed GPU
reset endpoint, against real processes and sockets; no sleeps, every wait polls with a deadline."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from receiver import wait_for
from rig import AGENT, AgentProcess, free_port

from node_agent.protocol import CONTROL_RESET_PATH, signed_headers
from slurm_fleetyield.adapters.agent_control import AgentControl, AgentControlError
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.store import Store

SECRET = b"outcome-test-secret-0123"


def record(job_id: str, node: str = "gpu-01", **kw) -> dict:
    doc = {
        "version": 1,
        "job_id": job_id,
        "node": node,
        "user": "alice",
        "gpus": [0, 1],
        "start_time": 1000.0,
        "end_time": 2000.0,
        "exit_code": 0,
        "exit_signal": 0,
        "declared_class": "batch",
        "last_checkpoint": 1800.0,
    }
    doc.update(kw)
    return doc


class AgentProc(AgentProcess):
    def __init__(self, tmp: Path, push_port: int, node: str = "gpu-01") -> None:
        self.outcomes = tmp / "outcomes"
        self.outcomes.mkdir()
        push_url = f"http://127.0.0.1:{push_port}/v1/agent/events"
        super().__init__(
            tmp,
            node,
            gpus=4,
            model=None,
            seed=None,
            state_dir=tmp / "agent",
            push_url=push_url,
            secret=SECRET,
            extra_args=("--outcomes-dir", str(self.outcomes)),
        )

    def spool(self, rec: dict, name: str | None = None) -> Path:
        path = self.outcomes / (name or f"{rec['job_id']}.json")
        tmp = path.with_name("." + path.name + ".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.rename(path)
        return path


def test_outcomes_survive_a_down_listener_and_arrive_exactly_once(tmp_path: Path) -> None:
    push_port = free_port()
    agent = AgentProc(tmp_path, push_port)
    store = Store(tmp_path / "fy.db")
    try:
        first = agent.spool(record("101"))
        agent.spool(record("102", exit_code=1))
        # the listener is down: the files stay, nothing is lost
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert first.exists()
            time.sleep(0.05)
        ingest = IngestServer("127.0.0.1", push_port, SECRET, store, threading.Event())
        ingest.start()
        try:
            assert wait_for(lambda: not list(agent.outcomes.glob("*.json")), timeout=90)
            rows = store.pending_outcomes()
            assert sorted(r.job_id for r in rows) == ["101", "102"]
            assert {r.node for r in rows} == {"gpu-01"} and rows[0].record["last_checkpoint"] == 1800.0
            # the same record forwarded again (agent crashed after the 2xx, before the unlink): a duplicate
            agent.spool(record("101"), name="101-again.json")
            assert wait_for(lambda: not list(agent.outcomes.glob("*.json")), timeout=90)
            assert sorted(r.job_id for r in store.pending_outcomes()) == ["101", "102"]
        finally:
            ingest.stop()
    finally:
        agent.close()
        store.close()


def test_outcome_listener_rejects_bad_signatures_and_foreign_records(tmp_path: Path) -> None:
    store = Store(tmp_path / "fy.db")
    ingest = IngestServer("127.0.0.1", 0, SECRET, store, threading.Event())
    body = json.dumps({"node": "gpu-01", "records": [record("7")]}).encode()
    ok = ingest.handle_outcomes(signed_headers(SECRET, "gpu-01", int(time.time()), body), body)
    assert ok == (202, {"accepted": 1, "duplicates": 0})
    forged = ingest.handle_outcomes(
        signed_headers(b"wrong-secret-000000", "gpu-01", int(time.time()), body), body
    )
    assert forged[0] == 401
    other = json.dumps({"node": "gpu-01", "records": [record("8", node="gpu-02")]}).encode()
    assert ingest.handle_outcomes(signed_headers(SECRET, "gpu-01", int(time.time()), other), other)[0] == 400
    assert [r.job_id for r in store.pending_outcomes()] == ["7"]
    ingest._httpd.server_close()
    store.close()


def test_signed_reset_resets_and_refuses_replays_and_forgeries(tmp_path: Path) -> None:
    agent = AgentProc(tmp_path, free_port())
    try:
        subprocess.run(
            [AGENT, "fault", "inject", "--state-dir", str(agent.state_dir), "--gpu", "2", "--xid", "48"],
            check=True,
            capture_output=True,
            timeout=30,
        )
        fatal = agent.state_dir / "fatal.json"
        assert json.loads(fatal.read_text())["pending"]
        control = AgentControl(f"http://127.0.0.1:{agent.port}/?node={{node}}", SECRET, timeout_s=10)
        answer = control.reset("gpu-01", [2], request_id="rst-test-000001")
        assert answer["gpus"] == [2] and answer["results"][0]["fatal_entries_dropped"] >= 1
        assert not json.loads(fatal.read_text())["pending"]
        # the same request id again: a replay, refused
        try:
            control.reset("gpu-01", [2], request_id="rst-test-000001")
            raise AssertionError("replay accepted")
        except AgentControlError as exc:
            assert exc.status == 409
        # signed for another node, or with another secret: refused
        forger = AgentControl(f"http://127.0.0.1:{agent.port}/?node={{node}}", b"not-the-secret-0000")
        for ctl, node, status in (
            (control, "gpu-02", 403),
            (forger, "gpu-01", 401),
        ):
            try:
                ctl.reset(node, [], request_id=f"rst-test-{status}x")
                raise AssertionError("accepted")
            except AgentControlError as exc:
                assert exc.status == status, exc
        # and the control endpoint is the only POST: fault injection is not reachable over the network
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{agent.port}/v1/control/inject", data=b"{}", method="POST"
        )
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("inject reachable")
        except urllib.error.HTTPError as err:
            assert err.code == 404
        assert CONTROL_RESET_PATH == "/v1/control/reset"
    finally:
        agent.close()


def test_outcomes_go_to_whichever_controller_answers_and_stay_with_it(tmp_path: Path) -> None:
    """Two controllers (high availability): the first URL's is dead; each record still lands once, in the
    live one's store, and the next chunk goes straight to it (no timeout paid per chunk)."""
    from node_agent.outcomes import OutcomeForwarder

    store = Store(tmp_path / "fy.db")
    live = IngestServer("127.0.0.1", 0, SECRET, store, threading.Event())
    live.start()
    dead = f"http://127.0.0.1:{free_port()}/v1/agent/outcomes"
    up = f"http://127.0.0.1:{live.port}/v1/agent/outcomes"
    spool = tmp_path / "outcomes"
    spool.mkdir()
    (spool / "201.json").write_text(json.dumps(record("201")))
    fwd = OutcomeForwarder(spool, "gpu-01", [dead, up], SECRET, timeout_s=0.5)
    try:
        assert fwd.flush_once() is True
        assert [r.job_id for r in store.pending_outcomes()] == ["201"] and not list(spool.glob("*.json"))
        assert (fwd.url, fwd.failures) == (up, 1)
        (spool / "202.json").write_text(json.dumps(record("202")))
        assert fwd.flush_once() is True
        assert sorted(r.job_id for r in store.pending_outcomes()) == ["201", "202"] and fwd.failures == 1
    finally:
        live.stop()
        store.close()
    (spool / "203.json").write_text(json.dumps(record("203")))
    assert fwd.flush_once() is False and (spool / "203.json").exists()  # neither answers: kept
    assert fwd.url == dead  # back to the first for the next round


def test_outcome_urls_default_to_the_endpoint_beside_each_push_url(tmp_path: Path) -> None:
    from node_agent.config import build_config

    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    base = {"state_dir": str(tmp_path / "st"), "push_secret_file": str(secret)}
    push = ["http://c1:9402/v1/agent/events", "http://c2:9402/v1/agent/events"]
    assert build_config(None, {**base, "push_url": push}).outcome_urls() == [
        "http://c1:9402/v1/agent/outcomes",
        "http://c2:9402/v1/agent/outcomes",
    ]
    explicit = build_config(None, {**base, "push_url": push, "outcomes_url": "http://vip:9402/o"})
    assert explicit.outcome_urls() == ["http://vip:9402/o"]
    with pytest.raises(ValueError, match="twice"):
        build_config(None, {**base, "outcomes_url": ["http://c1/o", "http://c1/o"]})
