"""The hooks with ``attest = true``: the Prolog denies on a missing / failed / stale / badly signed verdict
and allows on a fresh pass; the Epilog invalidates, wipes within its deadline, asks for the scrub and the
hand-over, and always exits 0. Hooks run as subprocesses, as slurmd runs them."""

from __future__ import annotations

import json
import os
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from wiring_rig import NODE, hook_conf, hook_env, passed_digests, run_hook

from slurm_fleetyield.attest import verdict as vd
from slurm_fleetyield.gate.keys import format_public_line


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    d = tmp_path / "agent"
    d.mkdir()
    return d


@pytest.fixture
def conf(tmp_path: Path, agent_dir: Path, key: Ed25519PrivateKey) -> Path:
    pub = tmp_path / "ctl.pub"
    pub.write_text(format_public_line("fy-attest", key.public_key()) + "\n")
    return hook_conf(tmp_path / "hooks.conf", agent_dir, tmp_path, attest_controller_pubkey=pub)


def write_verdict(agent_dir: Path, key: Ed25519PrivateKey, status: str = "pass", age_s: float = 5.0,
                  differences: tuple[str, ...] = ()) -> Path:  # fmt: skip
    doc = {"node": NODE, "status": status, "time": time.time() - age_s, "quote_pcr": "ab" * 32,
           "nonce": "cd" * 32, "reasons": [] if status == "pass" else ["1 record(s) outside the policy"],
           "differences": [{"name": d} for d in differences],
           "digests": passed_digests(agent_dir.parent) if status == "pass" else {}}  # fmt: skip
    path = agent_dir / "attest-verdict.json"
    path.write_text(json.dumps(vd.sign(doc, key)))
    path.chmod(0o644)
    return path


# ---------------------------------------------------------------------------------------------- Prolog
def test_prolog_denies_without_a_verdict(conf: Path) -> None:
    rc, err, _ = run_hook("prolog", hook_env(conf, "11"))
    assert rc == 1 and "DENY: fleetyield: no attestation verdict" in err


def test_prolog_allows_on_a_fresh_pass(conf: Path, agent_dir: Path, key: Ed25519PrivateKey) -> None:
    write_verdict(agent_dir, key)
    rc, err, _ = run_hook("prolog", hook_env(conf, "12"))
    assert rc == 0 and "allow user=alice" in err, err


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"status": "fail", "differences": ("/etc/ld.so.preload", "kernel/modules")},
         "fleetyield: attestation failed (/etc/ld.so.preload, kernel/modules)"),
        ({"age_s": 7200.0}, "fleetyield: attestation verdict stale (7200s old, max 3600s)"),
    ],
)  # fmt: skip
def test_prolog_denies_a_failed_or_stale_verdict(
    conf: Path, agent_dir: Path, key: Ed25519PrivateKey, kwargs: dict[str, Any], reason: str
) -> None:
    write_verdict(agent_dir, key, **kwargs)
    rc, err, _ = run_hook("prolog", hook_env(conf, "13"))
    assert rc == 1 and f"DENY: {reason}" in err, err


def test_prolog_denies_a_verdict_signed_by_another_key(conf: Path, agent_dir: Path) -> None:
    write_verdict(agent_dir, Ed25519PrivateKey.generate())
    rc, err, _ = run_hook("prolog", hook_env(conf, "14"))
    assert rc == 1 and "DENY: fleetyield: attestation verdict signature invalid" in err


def test_prolog_max_age_is_configurable(tmp_path: Path, agent_dir: Path, key: Ed25519PrivateKey) -> None:
    conf = hook_conf(tmp_path / "h.conf", agent_dir, tmp_path, attest_max_age_s=60)
    write_verdict(agent_dir, key, age_s=120)
    rc, err, _ = run_hook("prolog", hook_env(conf, "15"))
    assert rc == 1 and "stale (120s old, max 60s)" in err


def test_prolog_without_attest_ignores_verdicts(tmp_path: Path, agent_dir: Path) -> None:
    conf = hook_conf(tmp_path / "h.conf", agent_dir, tmp_path, attest="false")
    rc, _, _ = run_hook("prolog", hook_env(conf, "16"))
    assert rc == 0


def test_fatal_marker_is_still_checked_first(conf: Path, agent_dir: Path, key: Ed25519PrivateKey) -> None:
    write_verdict(agent_dir, key)
    (agent_dir / "fatal.json").write_text(
        json.dumps({"pending": [{"kind": "xid", "gpu": 1, "message": "79"}]})
    )
    rc, err, _ = run_hook("prolog", hook_env(conf, "17"))
    assert rc == 1 and "pending fatal GPU event" in err


# ---------------------------------------------------------------------------------------------- Epilog
class StubAgent:
    """The agent's control socket: records requests; ``handover`` writes a fresh verdict (or hangs)."""

    def __init__(self, agent_dir: Path, key: Ed25519PrivateKey, hang: bool = False) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        stub = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                req = json.loads(self.rfile.readline())
                stub.requests.append(req)
                if req["op"] == "handover":
                    if hang:
                        stub.release.wait(10)
                        return
                    write_verdict(agent_dir, key, age_s=0)
                    result: Any = {"status": "pass", "differences": []}
                else:
                    result = {"gpus": req.get("gpus"), "method": "fake", "scrubbed": True}
                self.wfile.write(json.dumps({"ok": True, "result": result}).encode() + b"\n")

        self.server = socketserver.ThreadingUnixStreamServer(str(agent_dir / "agent.sock"), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def job_area(tmp_path: Path) -> Path:
    area = tmp_path / "scratch" / "fy-job-21"
    (area / "sub").mkdir(parents=True)
    (area / "sub" / "weights.bin").write_bytes(b"tenant data")
    (tmp_path / "scratch" / "fy-job-22").mkdir()  # another job's area: untouched
    return area


@pytest.fixture
def stub(agent_dir: Path, key: Ed25519PrivateKey) -> Iterator[StubAgent]:
    s = StubAgent(agent_dir, key)
    yield s
    s.close()


def test_epilog_invalidates_wipes_scrubs_and_hands_over(
    conf: Path, agent_dir: Path, key: Ed25519PrivateKey, job_area: Path, stub: StubAgent, tmp_path: Path
) -> None:
    old = write_verdict(agent_dir, key, age_s=600)
    old_doc = json.loads(old.read_text())
    rc, err, wall = run_hook("epilog", hook_env(conf, "21", gpus="2,3"))
    assert rc == 0 and wall < 2.0, err
    assert json.loads((agent_dir / "attest-verdict.json.prev").read_text()) == old_doc  # kept for forensics
    assert not job_area.exists() and (tmp_path / "scratch" / "fy-job-22").is_dir()
    assert [r["op"] for r in stub.requests] == ["scrub", "handover"]
    assert stub.requests[0]["gpus"] == [2, 3] and stub.requests[1]["job_id"] == "21"
    assert "wipe ok" in err and "attestation hand-over: {'status': 'pass'" in err
    assert (tmp_path / "spool" / "outcomes" / "21.json").exists()  # the outcome is still written
    # and the next job starts on the fresh verdict
    rc, err, _ = run_hook("prolog", hook_env(conf, "22"))
    assert rc == 0, err


def test_epilog_without_an_agent_still_wipes_and_exits_0(
    conf: Path, agent_dir: Path, key: Ed25519PrivateKey, job_area: Path
) -> None:
    write_verdict(agent_dir, key)
    rc, err, _ = run_hook("epilog", hook_env(conf, "21"))
    assert rc == 0 and not job_area.exists()
    assert "wipe INCOMPLETE" in err and "attestation hand-over failed" in err
    assert not (agent_dir / "attest-verdict.json").exists()  # the next Prolog denies: fail-closed
    rc, err, _ = run_hook("prolog", hook_env(conf, "22"))
    assert rc == 1 and "no attestation verdict" in err


def test_epilog_bounds_a_hung_hand_over_by_its_deadline(
    tmp_path: Path, agent_dir: Path, key: Ed25519PrivateKey, job_area: Path
) -> None:
    conf = hook_conf(tmp_path / "h.conf", agent_dir, tmp_path, hard_timeout_ms=1000)
    hung = StubAgent(agent_dir, key, hang=True)
    try:
        rc, err, wall = run_hook("epilog", hook_env(conf, "21"))
    finally:
        hung.close()
    assert rc == 0 and wall < 1.9, (wall, err)  # interpreter start + 1 s deadline, never the 10 s hang
    assert not job_area.exists() and "attestation hand-over failed (TimeoutError" in err
    assert os.path.exists(tmp_path / "spool" / "outcomes" / "21.json")
