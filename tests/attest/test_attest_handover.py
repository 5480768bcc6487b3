"""The whole hand-over over real HTTP: agent -> controller listener -> verdict file -> Prolog check."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from attest_rig import NODE, Clock, Controller, make_attestor

from node_agent.attest.service import AttestError, Attestor, http_quote, implant_module
from prolog_epilog import attest_gate as gate
from slurm_fleetyield.gate.keys import format_public_line

SECRET = b"s" * 32


@pytest.fixture
def listener(ctl: Controller, clock: Clock) -> Iterator[str]:
    """A stand-in for the controller's push listener with the one-line attest hook."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            answer = ctl.service.route(self.path, dict(self.headers.items()), body, clock.now, SECRET)
            status, doc = answer if answer is not None else (404, {"error": "not found"})
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def wired(tmp_path: Path, ctl: Controller, clock: Clock, listener: str) -> tuple[Attestor, str]:
    pub = tmp_path / "ctl.pub"
    pub.write_text(format_public_line("fy-attest", ctl.key.public_key()) + "\n")
    att = make_attestor(tmp_path, clock, controller_url=listener, controller_pubkey=pub)
    return att, str(pub)


def test_handover_writes_a_verified_verdict_the_prolog_accepts(
    wired: tuple[Attestor, str], clock: Clock
) -> None:
    att, pub = wired
    summary = att.handover("42", SECRET)
    assert summary["status"] == "pass" and summary["differences"] == []
    assert att.verdict_path.stat().st_mode & 0o777 == 0o644
    assert gate.check_verdict(str(att.verdict_path), NODE, clock.now + 1, 3600, pub)[0]


def test_two_handovers_in_one_second_each_get_their_own_nonce(
    wired: tuple[Attestor, str], ctl: Controller
) -> None:
    # the nonce request carries a random request_id, the controller's replay key: two hand-overs of one job
    # in one clock second sign the same timestamp and body apart from it, and each must still get its own
    att, _ = wired
    assert att.handover("42", SECRET)["status"] == "pass"
    assert att.handover("42", SECRET)["status"] == "pass"
    rows = ctl.service.store.db.execute("SELECT request FROM nonce WHERE request IS NOT NULL").fetchall()
    assert len(rows) == 2 and len({r[0] for r in rows}) == 2


def test_implant_then_handover_denies_the_next_prolog(wired: tuple[Attestor, str], clock: Clock) -> None:
    att, pub = wired
    implant_module(att.state_dir, "rootkit_x")
    summary = att.handover("42", SECRET)
    assert summary["status"] == "fail" and summary["differences"] == ["kernel/modules"]
    allow, reason = gate.check_verdict(str(att.verdict_path), NODE, clock.now, 3600, pub)
    assert not allow and reason == "fleetyield: attestation failed (kernel/modules)"


def test_handover_with_a_wrong_secret_is_refused(wired: tuple[Attestor, str]) -> None:
    att, _ = wired
    with pytest.raises(AttestError, match="HTTP 401"):
        att.handover("42", b"x" * 32)
    assert not att.verdict_path.exists()


def test_verdict_from_an_impostor_controller_is_not_written(
    tmp_path: Path, wired: tuple[Attestor, str]
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    att, _ = wired
    other = tmp_path / "other.pub"
    other.write_text(format_public_line("fy-x", Ed25519PrivateKey.generate().public_key()) + "\n")
    att.cfg = att.cfg.model_copy(update={"controller_pubkey": other})
    with pytest.raises(AttestError, match="signature does not verify"):
        att.handover("42", SECRET)
    assert not att.verdict_path.exists()


def test_epilog_sequence_invalidate_wipe_handover(
    tmp_path: Path, wired: tuple[Attestor, str], clock: Clock
) -> None:
    """What the Epilog does: invalidate, wipe, hand over; a failed hand-over leaves no verdict at all."""
    att, pub = wired
    att.handover("41", SECRET)
    assert gate.invalidate_verdict(str(att.verdict_path))
    assert not gate.check_verdict(str(att.verdict_path), NODE, clock.now, 3600, pub)[0]
    att.cfg = att.cfg.model_copy(update={"controller_url": "http://127.0.0.1:9"})  # controller down
    with pytest.raises(AttestError):
        att.handover("42", SECRET)
    allow, reason = gate.check_verdict(str(att.verdict_path), NODE, clock.now, 3600, pub)
    assert not allow and "no attestation verdict" in reason


def test_agent_http_quote_route(attestor: Attestor) -> None:
    status, doc = http_quote(attestor, "nonce=" + "ab" * 32)
    assert status == 200 and doc["nonce"] == "ab" * 32
    assert http_quote(attestor, "nonce=xyz")[0] == 400


def test_periodic_loop_reattests_and_survives_a_down_controller(wired: tuple[Attestor, str]) -> None:
    from node_agent.attest.service import HandoverLoop

    att, _ = wired
    loop = HandoverLoop(att, SECRET, interval_s=3600)
    loop.run_once()
    assert loop.last is not None and loop.last["status"] == "pass" and att.verdict_path.exists()
    att.cfg = att.cfg.model_copy(update={"controller_url": "http://127.0.0.1:9"})
    loop.run_once()
    assert loop.last["status"] == "error"
    loop.start()
    loop.stop()


def test_loop_retries_a_failed_exchange_soon_with_backoff(wired: tuple[Attestor, str]) -> None:
    """A node that boots while its controller is away must not wait the full interval for a verdict."""
    from node_agent.attest.service import HandoverLoop

    att, _ = wired
    loop = HandoverLoop(att, SECRET, interval_s=900, retry_initial_s=1, retry_max_s=60)
    assert [loop.next_delay(False, n) for n in (1, 2, 3, 7, 8, 20)] == [1, 2, 4, 60, 60, 60]
    assert loop.next_delay(True, 0) == 900
    assert HandoverLoop(att, SECRET, interval_s=5).next_delay(False, 10) == 5  # never beyond the interval
    down = att.cfg.model_copy(update={"controller_url": "http://127.0.0.1:9"})
    up, att.cfg = att.cfg, down
    assert loop.run_once() is False and loop.last["status"] == "error"
    att.cfg = up
    assert loop.run_once() is True and loop.last["status"] == "pass"
    implant_module(att.state_dir, "rootkit_y")
    assert loop.run_once() is True and loop.last["status"] == "fail"  # a failed verdict is an answer


def test_epilog_asks_the_agent_over_its_socket(
    tmp_path: Path, wired: tuple[Attestor, str], clock: Clock
) -> None:
    """The Epilog's last step: ``request_handover`` over the unix socket -> the agent's exchange."""
    from attest_rig import ControlStub

    att, pub = wired
    att.secret = SECRET
    with ControlStub(att, tmp_path / "sock") as stub:
        summary = gate.request_handover(str(stub.dir), "42", 5.0)
        assert summary["status"] == "pass"
        implant_module(att.state_dir, "rootkit_x")
        assert gate.request_handover(str(stub.dir), "43", 5.0)["differences"] == ["kernel/modules"]
    allow, reason = gate.check_verdict(str(att.verdict_path), NODE, clock.now, 3600, pub)
    assert not allow and reason == "fleetyield: attestation failed (kernel/modules)"
