"""redfish_reboot.py: the RebootProgram (node -> controller -> BMC) and Suspend/Resume through the adapter."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from bmc_rig import Emulator, RecordingAudit, make_config, make_controller
from click.testing import CliRunner

from slurm_fleetyield import redfish_reboot as rr
from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket
from slurm_fleetyield.adapters.redfish import PowerOp, slurm_is_rebooting, slurm_safety
from slurm_fleetyield.core.model import JobView, SlurmNode
from slurm_fleetyield.gate.audit import AuditLog

SECRET = b"shared-agent-push-secret-0123456789"


class FakeSlurm:
    def __init__(self) -> None:
        self.nodes = {
            "gpu-05": SlurmNode(
                "gpu-05", frozenset({"IDLE", "DRAIN", "REBOOT_ISSUED"}), "fleetyield: XID 79"
            ),
            "gpu-06": SlurmNode("gpu-06", frozenset({"MIXED"})),
            "gpu-07": SlurmNode("gpu-07", frozenset({"IDLE", "REBOOT_ISSUED"})),
        }
        self.jobs: list[JobView] = [JobView(77, "RUNNING", ("gpu-06",))]

    def read_nodes(self) -> dict[str, SlurmNode]:
        return self.nodes

    def read_jobs(self) -> list[JobView]:
        return self.jobs


def _handler(endpoint: rr.RebootEndpoint) -> type[BaseHTTPRequestHandler]:
    """``POST REBOOT_PATH`` answered by ``endpoint``, as the push listener will mount it."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            import time

            status, answer = endpoint.handle(dict(self.headers), body, time.time())
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def controller(
    emulator: Emulator, creds_file: Path
) -> Iterator[tuple[str, RecordingAudit, rr.RebootEndpoint]]:
    """The controller's listener with the endpoint mounted at REBOOT_PATH (as the push listener will)."""
    audit = RecordingAudit()
    safety = slurm_safety(FakeSlurm(), lambda n: False, initiated=slurm_is_rebooting)
    power = make_controller(make_config(emulator, creds_file), safety=safety, audit=audit)
    endpoint = rr.RebootEndpoint(power, SECRET, run_async=lambda fn: fn())  # inline: deterministic tests
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(endpoint))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", audit, endpoint
    server.shutdown()
    server.server_close()


def node_config(url: str, tmp_path: Path, **kw: Any) -> rr.NodeRebootConfig:
    secret = tmp_path / "push.secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    return rr.NodeRebootConfig(controller_url=url, secret_file=str(secret), **kw)


def test_reboot_program_end_to_end(controller, tmp_path: Path) -> None:
    url, audit, _ = controller
    fallback: list[list[str]] = []
    cfg = node_config(url, tmp_path, node="gpu-05")
    assert rr.reboot_program(cfg, ["gpu_a100"], run=lambda argv: fallback.append(argv) or 0) == rr.EXIT_OK
    assert audit.results("gpu-05") == ["started", "ok"]
    assert audit.entries[0]["data"]["operation"] == "force_restart"
    assert audit.entries[0]["data"]["reason"].startswith("slurm RebootProgram ")
    assert fallback == []


def test_a_node_slurm_is_not_rebooting_is_refused(controller, tmp_path: Path) -> None:
    url, audit, _ = controller
    cfg = node_config(url, tmp_path, node="gpu-06")  # running job 77, no reboot pending
    status, answer = rr.request_reboot(cfg, SECRET, "gpu-06")
    assert status == 409 and answer["rule"] == "safety" and "77" in answer["error"]
    ran: list[list[str]] = []
    assert rr.reboot_program(cfg, [], run=lambda argv: ran.append(argv) or 0) == rr.EXIT_REFUSED
    assert ran == []  # a refusal is never overridden by the local fallback
    assert audit.results("gpu-06") == ["refused:safety", "refused:safety"]


def test_bad_signature_and_node_mismatch(controller, tmp_path: Path) -> None:
    url, _, _ = controller
    cfg = node_config(url, tmp_path)
    assert rr.request_reboot(cfg, b"wrong-secret-wrong-secret-wrong", "gpu-05")[0] == 401

    from node_agent.protocol import signed_headers

    body = rr.RebootRequest(node="gpu-07", request_id="abcdefgh1").model_dump_json().encode()
    _, _, endpoint = controller
    status, answer = endpoint.handle(signed_headers(SECRET, "gpu-05", 1000, body), body, 1000.0)
    assert status == 401 and "mismatch" in answer["error"]


def test_replayed_request_is_refused(controller) -> None:
    from node_agent.protocol import signed_headers

    _, audit, endpoint = controller
    body = rr.RebootRequest(node="gpu-07", request_id="replay-me-1").model_dump_json().encode()
    headers = signed_headers(SECRET, "gpu-07", 2000, body)
    assert endpoint.handle(headers, body, 2000.0)[0] == 202
    status, answer = endpoint.handle(headers, body, 2001.0)
    assert status == 409 and "replay" in answer["error"]
    assert audit.results("gpu-07") == ["started", "ok"]


def test_rate_limited_request_is_429(controller) -> None:
    from node_agent.protocol import signed_headers

    _, _, endpoint = controller
    endpoint.power.bucket = TokenBucket(1, 3600.0, clock=lambda: 0.0)
    endpoint.power.bucket.take()
    body = rr.RebootRequest(node="gpu-05", request_id="limited-01").model_dump_json().encode()
    status, answer = endpoint.handle(signed_headers(SECRET, "gpu-05", 3000, body), body, 3000.0)
    assert status == 429 and answer["rule"] == "rate_limit"


def test_unreachable_controller_falls_back_to_a_local_reboot(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = node_config(f"http://127.0.0.1:{port}", tmp_path, node="gpu-05", timeout_s=2)
    ran: list[list[str]] = []
    assert rr.reboot_program(cfg, [], run=lambda argv: ran.append(argv) or 0) == rr.EXIT_OK
    assert ran == [["systemctl", "reboot"]]
    none = cfg.model_copy(update={"fallback_command": None})
    assert rr.reboot_program(none, [], run=lambda argv: 0) == rr.EXIT_UNREACHABLE


def test_loose_secret_file_is_a_config_error(tmp_path: Path) -> None:
    cfg = node_config("http://127.0.0.1:9", tmp_path, node="gpu-05")
    Path(cfg.secret_file).chmod(0o644)
    assert rr.reboot_program(cfg, [], run=lambda argv: 0) == rr.EXIT_CONFIG


def test_cli_reboot_mode_accepts_slurm_feature_arguments(controller, tmp_path: Path, monkeypatch) -> None:
    url, audit, _ = controller
    cfg = tmp_path / "redfish-reboot.toml"
    secret = tmp_path / "s"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    cfg.write_text(f'controller_url = "{url}"\nsecret_file = "{secret}"\nnode = "gpu-05"\n')
    monkeypatch.setenv(rr.NODE_CONFIG_ENV, str(cfg))
    result = CliRunner().invoke(rr.main, ["gpu_a100,nvlink"])
    assert result.exit_code == 0, result.output
    assert audit.results("gpu-05")[-1] == "ok"
    bad = CliRunner().invoke(rr.main, ["--reboot-config", str(tmp_path / "missing.toml")])
    assert bad.exit_code == 1 and "cannot read" in bad.output


def test_suspend_resume_through_the_controller_config(
    emulator: Emulator, creds_file: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    toml = tmp_path / "fleetyield.toml"
    toml.write_text(
        f'[gate]\nstate_dir = "{gate}"\n\n[redfish]\nenabled = true\nauth = "basic"\n'
        f'credentials_file = "{creds_file}"\npoll_interval_s = 0.2\noff_dwell_s = 0.0\n\n'
        f'[redfish.nodes.gpu-08]\naddress = "{emulator.url}"\nsystem_id = "{emulator.systems["gpu-08"]}"\n'
    )
    slurm = FakeSlurm()
    slurm.nodes["gpu-08"] = SlurmNode("gpu-08", frozenset({"IDLE", "POWERING_DOWN"}))
    safety = slurm_safety(slurm, lambda n: False, initiated=lambda v: True)
    power = rr.open_controller_power(toml, safety=safety, power_save=True)
    assert rr.power_save(power, ["gpu-08"], PowerOp.POWER_OFF) == rr.EXIT_OK
    assert power.status("gpu-08").power_state == "Off"
    assert rr.power_save(power, ["gpu-08", "cpu-no-bmc"], PowerOp.POWER_ON) == rr.EXIT_REFUSED  # one failed
    assert power.status("gpu-08").power_state == "On"
    log = AuditLog.open(gate / "gate.db", gate / "audit.head")
    results = [(e.subject, e.data["operation"], e.data["result"]) for e in log.entries()]
    assert results == [
        ("gpu-08", "power_off", "started"),
        ("gpu-08", "power_off", "ok"),
        ("gpu-08", "power_on", "started"),
        ("gpu-08", "power_on", "ok"),
    ]
    assert log.verify().ok
    assert (gate / "bmc-ratelimit-powersave.json").exists()
    slurm.jobs.append(JobView(9, "RUNNING", ("gpu-08",)))
    assert rr.power_save(power, ["gpu-08"], PowerOp.POWER_OFF) == rr.EXIT_REFUSED  # a job landed: refused


def test_endpoint_drives_the_bmc_in_a_worker_thread_with_its_own_audit_connection(
    emulator: Emulator, creds_file: Path, tmp_path: Path
) -> None:
    from node_agent.protocol import signed_headers
    from slurm_fleetyield.adapters.redfish import PerThreadAudit

    gate = tmp_path / "gate"
    gate.mkdir()
    audit = PerThreadAudit(lambda: AuditLog.open(gate / "gate.db", gate / "audit.head"))
    safety = slurm_safety(FakeSlurm(), lambda n: False, initiated=slurm_is_rebooting)
    power = make_controller(make_config(emulator, creds_file), safety=safety, audit=audit)
    workers: list[threading.Thread] = []

    def run_async(fn) -> None:  # type: ignore[no-untyped-def]
        workers.append(threading.Thread(target=fn))
        workers[-1].start()

    endpoint = rr.RebootEndpoint(power, SECRET, run_async=run_async)
    body = rr.RebootRequest(node="gpu-07", request_id="threaded-01").model_dump_json().encode()
    assert endpoint.handle(signed_headers(SECRET, "gpu-07", 4000, body), body, 4000.0)[0] == 202
    workers[0].join(timeout=30)
    log = AuditLog.open(gate / "gate.db", gate / "audit.head")
    assert [e.data["result"] for e in log.entries()] == ["started", "ok"]
    assert log.verify().ok


def test_a_listener_behind_basic_auth_takes_the_request_with_controller_basic_auth(
    controller, tmp_path: Path, caplog
) -> None:
    """The endpoint on the controller's listener machinery served with a web-config (basic auth): the
    reboot config's controller_basic_auth gets the request through; without it the listener's 401 is a
    refusal said as a credentials problem (never the local fallback); an unreadable password file is a
    config error before anything is sent."""
    import bcrypt

    from node_agent.webconfig import load_web_config
    from slurm_fleetyield.adapters.listener import BackgroundServer

    _, audit, endpoint = controller
    web = tmp_path / "web.yml"
    web.write_text(
        f"basic_auth_users:\n  nodes: '{bcrypt.hashpw(b'node-pass', bcrypt.gensalt(4)).decode()}'\n"
    )
    password = tmp_path / "node.password"
    password.write_text("node-pass\n")
    password.chmod(0o600)
    server = BackgroundServer("127.0.0.1", 0, _handler(endpoint), "fy-test-push", web=load_web_config(web))
    server.start()
    url = f"http://127.0.0.1:{server.port}"
    ran: list[list[str]] = []
    try:
        cfg = node_config(url, tmp_path, node="gpu-05")
        assert rr.reboot_program(cfg, [], run=lambda argv: ran.append(argv) or 0) == rr.EXIT_REFUSED
        assert "refused our credentials" in caplog.text and "controller_basic_auth" in caplog.text
        assert ran == [] and audit.results("gpu-05") == []
        auth = {"username": "nodes", "password_file": str(tmp_path / "nope")}
        cfg = node_config(url, tmp_path, node="gpu-05", controller_basic_auth=auth)
        assert rr.reboot_program(cfg, [], run=lambda argv: ran.append(argv) or 0) == rr.EXIT_CONFIG
        assert "controller_basic_auth.password_file: cannot read" in caplog.text
        cfg = node_config(
            url, tmp_path, node="gpu-05", controller_basic_auth={**auth, "password_file": str(password)}
        )
        assert rr.reboot_program(cfg, ["gpu_a100"], run=lambda argv: ran.append(argv) or 0) == rr.EXIT_OK
        assert audit.results("gpu-05") == ["started", "ok"] and ran == []
    finally:
        server.stop()


def test_controller_tls_config_needs_an_https_url(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="controller_tls_config is set but controller_url is not https://"):
        node_config("http://ctl:9402", tmp_path, controller_tls_config={"ca_file": str(tmp_path / "ca.crt")})
