"""prolog_epilog/attest_gate: the wipe never leaves its roots; the Prolog's verdict check."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from attest_rig import NODE, Clock, Controller

from node_agent.attest.service import Attestor, implant_module
from prolog_epilog import attest_gate as gate
from slurm_fleetyield.gate.keys import format_public_line


def _far() -> float:
    return time.monotonic() + 30


@pytest.fixture
def areas(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    tmp_root, scratch = tmp_path / "tmp", tmp_path / "scratch"
    tmp_root.mkdir()
    scratch.mkdir()
    return tmp_root, scratch, [f"{tmp_root}/fy-job-{{job_id}}", f"{scratch}/{{user}}/{{job_id}}"]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "etc"
    victim.mkdir()
    (victim / "passwd").write_text("root:x:0:0\n")
    return victim


def test_wipe_removes_the_job_areas_only(tmp_path: Path, areas: tuple[Path, Path, list[str]]) -> None:
    tmp_root, scratch, templates = areas
    job = tmp_root / "fy-job-42"
    (job / "a/b").mkdir(parents=True)
    (job / "a/b/f").write_text("secret")
    (job / "top").write_text("x")
    (scratch / "alice/42/deep").mkdir(parents=True)
    (scratch / "alice/42/deep/ckpt").write_text("w")
    neighbours = [tmp_root / "fy-job-421", scratch / "alice/43", scratch / "bob/42"]
    for n in neighbours:
        n.mkdir(parents=True)
    report = gate.wipe("42", templates, _far(), user="alice")
    assert [a["status"] for a in report["areas"]] == ["removed", "removed"] and report["ok"]
    assert report["areas"][0]["files"] == 2 and not job.exists() and not (scratch / "alice/42").exists()
    assert all(n.exists() for n in neighbours) and (scratch / "alice").is_dir()


def test_wipe_absent_areas_are_fine(areas: tuple[Path, Path, list[str]]) -> None:
    report = gate.wipe("7", areas[2], _far(), user="alice")
    assert [a["status"] for a in report["areas"]] == ["absent", "absent"] and report["ok"]


def test_symlinked_area_is_unlinked_not_followed(tmp_path: Path, areas: tuple[Path, Path, list[str]]) -> None:
    tmp_root, _, templates = areas
    victim = _victim(tmp_path)
    os.symlink(victim, tmp_root / "fy-job-42")
    report = gate.wipe("42", templates[:1], _far())
    assert report["areas"][0]["status"] == "removed"
    assert not (tmp_root / "fy-job-42").is_symlink() and (victim / "passwd").read_text() == "root:x:0:0\n"


def test_symlinked_user_dir_is_refused(tmp_path: Path, areas: tuple[Path, Path, list[str]]) -> None:
    """/scratch/alice -> /etc: /scratch/alice/42 would be /etc/42. Refused, nothing touched."""
    _, scratch, templates = areas
    victim = _victim(tmp_path)
    (victim / "42").mkdir()
    (victim / "42/keep").write_text("k")
    os.symlink(victim, scratch / "alice")
    report = gate.wipe("42", templates[1:], _far(), user="alice")
    assert report["areas"][0]["status"] == "refused" and not report["ok"]
    assert (victim / "42/keep").exists()


def test_links_inside_the_area_are_not_followed(tmp_path: Path, areas: tuple[Path, Path, list[str]]) -> None:
    tmp_root, _, templates = areas
    victim = _victim(tmp_path)
    job = tmp_root / "fy-job-42"
    job.mkdir()
    os.symlink(victim, job / "dirlink")
    os.symlink(victim / "passwd", job / "filelink")
    (job / "sub").mkdir()
    os.symlink("../../../etc", job / "sub/rel")
    report = gate.wipe("42", templates[:1], _far())
    assert report["areas"][0]["status"] == "removed" and not job.exists()
    assert (victim / "passwd").read_text() == "root:x:0:0\n"


@pytest.mark.parametrize(
    ("job_id", "user"),
    [("../etc", "alice"), ("42", "../../etc"), ("42", "a/b"), ("42", ".."), ("42", ""), ("4 2", "alice")],
)
def test_hostile_ids_are_refused(areas: tuple[Path, Path, list[str]], job_id: str, user: str) -> None:
    report = gate.wipe(job_id, areas[2], _far(), user=user)
    assert not report["ok"] and any(a["status"] == "refused" for a in report["areas"])


@pytest.mark.parametrize(
    "template", ["relative/{job_id}", "/{job_id}", "/tmp/no-placeholder", "/tmp/../{job_id}"]
)
def test_bad_templates_are_refused(template: str) -> None:
    assert gate.wipe("42", [template], _far())["areas"][0]["status"] == "refused"


def test_wipe_stops_at_the_deadline(areas: tuple[Path, Path, list[str]]) -> None:
    tmp_root, _, templates = areas
    job = tmp_root / "fy-job-42"
    job.mkdir()
    for i in range(50):
        (job / f"f{i}").write_text("x")
    report = gate.wipe("42", templates[:1], time.monotonic() - 1)
    assert report["areas"][0]["status"] == "incomplete" and not report["ok"]


def test_scrub_request_reaches_the_agent(
    tmp_path: Path, areas: tuple[Path, Path, list[str]], attestor: Attestor
) -> None:
    """Through a unix socket speaking the agent's control protocol, dispatching to ``control_op``."""
    import socketserver

    from node_agent.attest.service import control_op

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            req = json.loads(self.rfile.readline())
            try:
                doc = {"ok": True, "result": control_op(attestor, req["op"], req)}
            except ValueError as exc:
                doc = {"ok": False, "error": str(exc)}
            self.wfile.write(json.dumps(doc).encode() + b"\n")

    sock_dir = tmp_path / "agentsock"
    sock_dir.mkdir()
    server = socketserver.UnixStreamServer(str(sock_dir / "agent.sock"), Handler)
    import threading

    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        report = gate.wipe("42", areas[2], _far(), user="alice", gpus=[1], agent_state_dir=str(sock_dir))
    finally:
        server.shutdown()
        server.server_close()
    assert report["ok"] and report["scrub"]["gpus"] == [1] and report["scrub"]["method"] == "fake"
    log = (attestor.state_dir / "scrub.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["gpus"] == [1]


def test_scrub_with_no_agent_is_reported_not_raised(
    tmp_path: Path, areas: tuple[Path, Path, list[str]]
) -> None:
    report = gate.wipe("42", areas[2], _far(), user="alice", agent_state_dir=str(tmp_path / "none"))
    assert "error" in report["scrub"] and not report["ok"]


def test_wipe_drops_the_hpc_job_mapping(tmp_path: Path, areas: tuple[Path, Path, list[str]]) -> None:
    mapping = tmp_path / "hpc"
    mapping.mkdir()
    (mapping / "0").write_text("42\n")
    (mapping / "1").write_text("43\n")
    report = gate.wipe("42", areas[2], _far(), user="alice", hpc_job_dir=str(mapping))
    assert report["mapping_removed"] == [0] and (mapping / "1").exists()


# ------------------------------------------------------------------------------------------ check_verdict
@pytest.fixture
def pub(tmp_path: Path, ctl: Controller) -> str:
    path = tmp_path / "ctl.pub"
    path.write_text(format_public_line("fy-attest", ctl.key.public_key()) + "\n")
    return str(path)


def _write(path: Path, verdict: dict) -> str:
    path.write_text(json.dumps(verdict))
    os.chmod(path, 0o644)
    return str(path)


def test_fresh_pass_verdict_allows(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock, pub: str
) -> None:
    v = ctl.handover(attestor, clock.now)
    allow, reason = gate.check_verdict(_write(tmp_path / "v.json", v), NODE, clock.now + 5, 3600, pub)
    assert allow and reason.startswith("attested 5s ago")


def test_failed_verdict_denies_naming_records(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock, pub: str
) -> None:
    implant_module(attestor.state_dir, "rootkit_x")
    (attestor.spec.root / "etc/ld.so.preload").write_text("/x.so\n")
    v = ctl.handover(attestor, clock.now)
    allow, reason = gate.check_verdict(_write(tmp_path / "v.json", v), NODE, clock.now, 3600, pub)
    assert not allow and reason == "fleetyield: attestation failed (kernel/modules, /etc/ld.so.preload)"


def test_missing_stale_foreign_edited_or_unsafe_verdicts_deny(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock, pub: str
) -> None:
    v = ctl.handover(attestor, clock.now)
    path = tmp_path / "v.json"
    assert not gate.check_verdict(str(path), NODE, clock.now, 3600, pub)[0]  # missing
    _write(path, v)
    allow, reason = gate.check_verdict(str(path), NODE, clock.now + 3601, 3600, pub)
    assert not allow and "stale" in reason
    allow, reason = gate.check_verdict(str(path), "gpu-h100-2", clock.now, 3600, pub)
    assert not allow and "not 'gpu-h100-2'" in reason
    _write(path, {**v, "time": clock.now + 1000})  # edited to look fresh later
    allow, reason = gate.check_verdict(str(path), NODE, clock.now + 1000, 3600, pub)
    assert not allow and "signature invalid" in reason
    _write(path, v)
    os.chmod(path, 0o666)
    allow, reason = gate.check_verdict(str(path), NODE, clock.now, 3600, pub)
    assert not allow and "writable" in reason


def test_verdict_signed_by_another_controller_denies(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    other = tmp_path / "other.pub"
    other.write_text(format_public_line("fy-other", Ed25519PrivateKey.generate().public_key()) + "\n")
    path = _write(tmp_path / "v.json", ctl.handover(attestor, clock.now))
    allow, reason = gate.check_verdict(path, NODE, clock.now, 3600, str(other))
    assert not allow and "signature invalid" in reason


def test_invalidate_keeps_the_old_verdict_aside(tmp_path: Path) -> None:
    path = tmp_path / "v.json"
    path.write_text("{}")
    assert gate.invalidate_verdict(str(path)) and not path.exists() and (tmp_path / "v.json.prev").exists()
    assert not gate.invalidate_verdict(str(path))


def test_gate_module_imports_only_the_stdlib() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import prolog_epilog.attest_gate; "
        "bad = [m for m in sys.modules"
        " if m.split('.')[0] in ('cryptography', 'pydantic', 'node_agent', 'click')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ------------------------------------------------------------------------------------------ recheck
def test_recheck_follows_what_changed_since_the_verdict(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    root = attestor.spec.root
    v = ctl.handover(attestor, clock.now)
    assert v["status"] == "pass" and set(v["digests"]) >= {"kernel/modules", "/etc/ld.so.preload"}
    path = _write(tmp_path / "v.json", v)
    names = ["kernel/modules", "kernel/tainted", "kernel/knobs", "/etc/ld.so.preload"]
    assert gate.recheck(path, str(root), names, str(attestor.state_dir))[0]
    modules = (root / "proc/modules").read_text()
    (root / "proc/modules").write_text(modules + "rootkit_x 16384 0 - Live 0x0\n")
    allow, reason = gate.recheck(path, str(root), names, str(attestor.state_dir))
    assert (
        not allow and reason == "fleetyield: attestation failed (kernel/modules changed since the hand-over)"
    )
    (root / "proc/modules").write_text(modules)
    assert gate.recheck(path, str(root), names, str(attestor.state_dir))[0]  # undone: passes again
    implant_module(attestor.state_dir, "rootkit_y")  # the fake backend's implant counts, as in the agent
    assert not gate.recheck(path, str(root), names, str(attestor.state_dir))[0]
    assert "unknown/record" in gate.recheck(path, str(root), ["unknown/record"], None)[1]
    old = {k: val for k, val in v.items() if k != "digests"}
    assert not gate.recheck(_write(tmp_path / "old.json", old), str(root), names, None)[0]  # fail-closed
