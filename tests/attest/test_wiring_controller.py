"""The controller's wiring: /v1/attest/* on the real push listener, ``[attest]`` config and ``build``, the
daemon turning failed verdicts into drains through the core's fatal path, the API gate, ``fleetyield
attest``."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attest_rig import NODE, Clock, Controller
from click.testing import CliRunner
from rig import FakeCommands
from wiring_rig import SECRET, NoSense, secret_file

from node_agent.attest.service import Attestor, implant_module
from node_agent.protocol import signed_headers
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.slurm import SlurmCli
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.config import ConfigError, from_mapping
from slurm_fleetyield.daemon import Daemon, attestation_event, build
from slurm_fleetyield.gate.keys import keygen


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def wake() -> threading.Event:
    return threading.Event()


@pytest.fixture
def listener(tmp_path: Path, ctl: Controller, wake: threading.Event) -> Iterator[str]:
    store = Store(tmp_path / "fy.db")
    srv = IngestServer("127.0.0.1", 0, SECRET, store, wake, attest=ctl.service)
    srv.start()
    yield f"http://127.0.0.1:{srv.port}"
    srv.stop()
    store.close()


# ---------------------------------------------------------------------------------------------- ingest
def _exchange(listener: str, attestor: Attestor) -> tuple[dict[str, Any], dict[str, Any]]:
    now = time.time()
    body = json.dumps({"node": NODE}).encode()
    status, issued = _post(listener + "/v1/attest/nonce", body, signed_headers(SECRET, NODE, int(now), body))
    assert status == 200 and issued["node"] == NODE and len(issued["nonce"]) == 64
    quote = attestor.quote(issued["nonce"], now)
    status, verdict = _post(listener + "/v1/attest/quote", json.dumps(quote).encode())
    assert status == 200
    return quote, verdict


def test_listener_serves_the_exchange(listener: str, attestor: Attestor, wake: threading.Event) -> None:
    quote, verdict = _exchange(listener, attestor)
    assert verdict["status"] == "pass" and verdict["authenticated"], verdict
    status, again = _post(listener + "/v1/attest/quote", json.dumps(quote).encode())  # replay
    assert status == 200 and again["status"] == "fail" and "nonce replayed" in again["reasons"][0]
    assert not wake.is_set()  # an unauthenticated failure (replay) never wakes the daemon


def test_a_failed_verdict_wakes_the_daemon(listener: str, attestor: Attestor, wake: threading.Event) -> None:
    implant_module(attestor.state_dir, "rootkit_x")
    _, verdict = _exchange(listener, attestor)
    assert verdict["status"] == "fail" and verdict["authenticated"] and wake.is_set()


def test_a_failed_verdict_is_answered_after_the_drain_tick(
    tmp_path: Path, ctl: Controller, attestor: Attestor
) -> None:
    """The listener holds a failed verdict's answer until a tick that started after it committed (the
    Epilog waiting for it returns only once the node is drained); a pass is answered at once."""
    calls: list[tuple[float, float]] = []
    store = Store(tmp_path / "fy.db")
    srv = IngestServer(
        "127.0.0.1", 0, SECRET, store, threading.Event(), attest=ctl.service,
        settle=lambda since, timeout: calls.append((since, timeout)) is None,
    )  # fmt: skip
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        assert _exchange(url, attestor)[1]["status"] == "pass" and calls == []
        implant_module(attestor.state_dir, "rootkit_x")
        before = time.time()
        assert _exchange(url, attestor)[1]["status"] == "fail"
        ((since, timeout),) = calls
        assert since >= before and 0 < timeout < 1.5  # under the agent's request timeout
    finally:
        srv.stop()
        store.close()


def test_daemon_wait_tick_after(tmp_path: Path, ctl: Controller) -> None:
    daemon = _daemon(tmp_path, ctl, FakeCommands([NODE]))
    since = time.time()
    assert daemon.wait_tick_after(since, 0.05) is False  # no tick yet
    done = threading.Thread(target=daemon.tick_once)
    done.start()
    assert daemon.wait_tick_after(since, 30) is True
    done.join()
    assert daemon.wait_tick_after(time.time() + 3600, 0.05) is False  # a tick from the past does not count
    daemon.store.close()


def test_listener_refuses_what_it_must(listener: str) -> None:
    body = json.dumps({"node": NODE}).encode()
    assert _post(listener + "/v1/attest/nonce", body)[0] == 401  # unsigned
    bad = signed_headers(b"x" * 32, NODE, int(time.time()), body)
    assert _post(listener + "/v1/attest/nonce", body, bad)[0] == 401
    other = json.dumps({"node": "gpu-h100-9"}).encode()
    headers = signed_headers(SECRET, "gpu-h100-9", int(time.time()), other)
    status, doc = _post(listener + "/v1/attest/nonce", other, headers)
    assert (status, doc["error"]) == (403, "node 'gpu-h100-9' is not enrolled")
    assert _post(listener + "/v1/attest/quote", b"[]")[0] == 400
    assert _post(listener + "/v1/attest/other", b"{}")[0] == 404
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(listener + "/v1/attest/nonce", timeout=10)
    assert err.value.code == 405


def test_a_replayed_nonce_request_adds_no_row_and_cannot_evict_the_nodes_nonce(
    listener: str, ctl: Controller, attestor: Attestor
) -> None:
    # issue #27: every replay of one signed request inserted a nonce row; a cap alone would let the replays
    # push the node's own nonce out (its quote then fails "nonce unknown": a drain by replay)
    from slurm_fleetyield.attest.store import MAX_NONCES_PER_NODE

    rows0 = ctl.service.store.nonce_count(NODE)  # the golden quote's, spent
    now = time.time()

    def ask(request_id: str | None, ts: int = int(now)) -> tuple[int, dict[str, Any]]:
        doc = {"node": NODE, "job_id": "42"} | ({} if request_id is None else {"request_id": request_id})
        body = json.dumps(doc).encode()
        return _post(listener + "/v1/attest/nonce", body, signed_headers(SECRET, NODE, ts, body))

    answers = [ask("4f" * 16) for _ in range(MAX_NONCES_PER_NODE + 10)]  # one request, replayed
    assert {status for status, _ in answers} == {200} and len({doc["nonce"] for _, doc in answers}) == 1
    assert ctl.service.store.nonce_count(NODE) == rows0 + 1
    quote = attestor.quote(answers[0][1]["nonce"], now)
    status, verdict = _post(listener + "/v1/attest/quote", json.dumps(quote).encode())
    assert status == 200 and verdict["status"] == "pass", verdict
    # fresh requests (only a holder of the push secret signs these), with and without an id: capped
    for i in range(MAX_NONCES_PER_NODE + 10):
        assert ask(f"fresh-{i}")[0] == 200 and ask(None)[0] == 200
    assert ctl.service.store.nonce_count(NODE) == MAX_NONCES_PER_NODE
    assert ask("not an id!")[0] == 400 and ask("x" * 65)[0] == 400


def test_listener_without_attest_answers_404(tmp_path: Path) -> None:
    store = Store(tmp_path / "fy.db")
    srv = IngestServer("127.0.0.1", 0, SECRET, store, threading.Event())
    srv.start()
    try:
        status, doc = _post(f"http://127.0.0.1:{srv.port}/v1/attest/nonce", b"{}")
    finally:
        srv.stop()
        store.close()
    assert status == 404 and "not enabled" in doc["error"]


# ---------------------------------------------------------------------------------------------- daemon
def _daemon(tmp: Path, ctl: Controller, cmds: FakeCommands) -> Daemon:
    cfg = from_mapping(
        {
            "store": {"path": str(tmp / "fy.db")},
            "loop": {"interval_s": 30, "seed": 1},
            "api": {"enabled": False},
            "sense": {"timeout_s": 1},
        }
    )
    return Daemon(cfg, SlurmCli(runner=cmds), NoSense(), Store(cfg.store.path), attest=ctl.service)


def test_daemon_tick_turns_a_failed_verdict_into_one_drain(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    cmds = FakeCommands([NODE, "gpu-h100-2"])
    daemon = _daemon(tmp_path, ctl, cmds)
    assert ctl.handover(attestor, clock.now)["status"] == "pass"
    daemon.tick_once()
    assert cmds.drains() == [] and daemon.store.pending() == []
    implant_module(attestor.state_dir, "rootkit_x")
    assert ctl.handover(attestor, clock.now + 60)["status"] == "fail"
    out = daemon.tick_once()
    (drain,) = [a for a in out.result.plan.actions if a.kind == "drain"]
    assert drain.node == NODE and drain.reason == "fleetyield: attestation failed (kernel/modules)"
    (cmd,) = cmds.drains()
    assert cmd[2] == f"NodeName={NODE}" and cmd[4] == "Reason=fleetyield: attestation failed (kernel/modules)"
    # the same verdict is offered again every tick: a duplicate, never a second drain
    cmds.nodes[NODE] = cmds.nodes[NODE].replace("State=IDLE", "State=IDLE+DRAIN") + (
        " Reason=fleetyield: attestation failed (kernel/modules) [root@2026-01-12T10:00:00]"
    )
    again = daemon.tick_once()
    assert [a for a in again.result.plan.actions if a.kind == "drain" and a.cause == "fatal"] == []
    assert daemon.store.pending() == []
    # what follows is the lifecycle's (the same as after a fatal XID): the default ladder's first rung
    assert cmds.drains()[-1][4] == (
        "Reason=fleetyield: attestation failed (kernel/modules); quarantined, remediation 1/3 (reboot)"
    )
    daemon.store.close()


def test_a_passing_verdict_drops_the_node_from_the_candidates(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    implant_module(attestor.state_dir, "rootkit_x")
    ctl.handover(attestor, clock.now)
    assert [c[0] for c in ctl.service.quarantine_candidates()] == [NODE]
    (attestor.state_dir / "fake-modules").unlink()
    ctl.handover(attestor, clock.now + 1)
    assert ctl.service.quarantine_candidates() == []


def test_attestation_event_is_one_per_verdict() -> None:
    doc = {"node": NODE, "time": 1.5, "nonce": "ab" * 32, "status": "fail"}
    reason = "fleetyield: attestation failed (/etc/ld.so.preload, kernel/modules)"
    ev = attestation_event(NODE, reason, doc)
    assert ev.kind == "attestation_failed" and ev.message == "/etc/ld.so.preload, kernel/modules"
    assert ev.event_id == attestation_event(NODE, reason, dict(doc)).event_id
    assert ev.event_id != attestation_event(NODE, reason, {**doc, "time": 2.5}).event_id


# ---------------------------------------------------------------------------------------------- config, API
def _attest_config(tmp: Path, **attest: Any) -> dict[str, Any]:
    key, _pub = keygen("fy-attest", tmp / "keys")
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({"version": 1, "classes": {"h100": {"records": {"meta/time": ["*"]}}}}))
    return {
        "store": {"path": str(tmp / "fy.db")},
        "push": {"secret_file": str(secret_file(tmp)), "host": "127.0.0.1", "port": 0},
        "api": {"host": "127.0.0.1", "port": 0},
        "slurm": {"bin_dir": str(tmp / "no-slurm")},
        "attest": {
            "enabled": True,
            "db": str(tmp / "attest.db"),
            "policy": str(policy),
            "key": str(key),
            **attest,
        },
    }


def test_config_requires_policy_key_and_push(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="attest: Value error, enabled=true needs policy and key"):
        from_mapping({"attest": {"enabled": True}})
    data = _attest_config(tmp_path)
    del data["push"]
    with pytest.raises(ConfigError, match="push listener is off"):
        from_mapping(data)
    assert from_mapping({}).attest.enabled is False


def test_build_with_a_bad_policy_is_a_config_error(tmp_path: Path) -> None:
    data = _attest_config(tmp_path)
    Path(data["attest"]["policy"]).write_text("{not json")
    with pytest.raises(ConfigError, match=r"attest\.policy"):
        build(from_mapping(data))


def test_build_wires_listener_and_api_gate(tmp_path: Path, attestor: Attestor) -> None:
    cfg = from_mapping(_attest_config(tmp_path, max_age_s=600))
    runtime = build(cfg, slurm=SlurmCli(runner=FakeCommands([NODE])), sense=NoSense())
    for server in runtime.servers:
        server.start()
    gate = f"/v1/nodes/{NODE}/gate"
    try:
        ingest, api = runtime.servers
        assert ingest.attest is runtime.daemon.attest is not None
        assert api.route(gate, {}) == (200, {"allow": False, "reason": "fleetyield: no attestation verdict"})
        ctl = Controller(runtime.daemon.attest.store, runtime.daemon.attest.key, runtime.daemon.attest,
                         runtime.daemon.attest.policy)  # fmt: skip
        ctl.enroll(attestor)
        ctl.learn_from(attestor, time.time())
        ctl.handover(attestor, time.time())
        assert api.route(gate, {})[1] == {"allow": True, "reason": "fleetyield has no decision yet"}
        ctl.handover(attestor, time.time() - 3600)  # a verdict older than max_age_s
        assert api.route(gate, {})[1]["reason"].startswith("fleetyield: attestation verdict stale")
        implant_module(attestor.state_dir, "rootkit_x")
        ctl.handover(attestor, time.time())
        assert api.route(gate, {})[1] == {
            "allow": False,
            "reason": "fleetyield: attestation failed (kernel/modules)",
        }
    finally:
        runtime.close()


def test_fleetyield_attest_is_mounted(tmp_path: Path) -> None:
    from slurm_fleetyield.cli import main

    runner = CliRunner()
    assert "attest" in runner.invoke(main, ["--help"]).output
    out = runner.invoke(main, ["attest", "keygen", "--out", str(tmp_path / "k")])
    assert out.exit_code == 0 and json.loads(out.output)["public"].endswith("fy-attest.pub")
