"""Takeover mid-approval: two real controller processes (``fleetyield run``) on one real PostgreSQL, one real
``fleetyield-agent serve --backend fake``, and a Slurm stand-in (``scontrol``/``squeue`` scripts in
``slurm.bin_dir`` answering from a node file that a drain rewrites, every call logged). The leader raises a
drain proposal, is kill -9'd, the admin's signed approval (``fleetyield approve``) goes to the survivor,
which executes the drain exactly once; the audit chain verifies across both leaders
(``fleetyield audit verify`` on either host) with one ``proposed`` and one ``approved`` entry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from rig import AgentProcess, free_port, node_line, wait_for

from slurm_fleetyield.adapters.proposals import read_proposals
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.gate import Gatekeeper

BIN = Path(sys.executable).parent
FAKE_SLURM = """#!{python}
import fcntl, json, os, re, sys
state = {state!r}
name, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
with open(os.path.join(state, "lock"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(os.path.join(state, "calls.log"), "a") as log:
        log.write(json.dumps([name, *argv]) + "\\n")
    nodes = os.path.join(state, "nodes.txt")
    if name == "scontrol" and argv[:1] == ["--version"]:
        print("slurm-wlm 22.05.8")
    elif name == "scontrol" and argv[:2] == ["show", "node"]:
        print(open(nodes).read().strip())
    elif name == "scontrol" and argv[:2] in (["show", "hostnames"], ["show", "hostlist"]):
        print("\\n".join(argv[2].split(",")) if argv[1] == "hostnames" else argv[2])
    elif name == "squeue":
        print(json.dumps({{"jobs": []}}))
    elif name == "scontrol" and argv[:1] == ["update"] and "State=DRAIN" in argv:
        reason = next(a for a in argv if a.startswith("Reason=")).removeprefix("Reason=")
        line = open(nodes).read().strip()
        line = re.sub(r"State=\\S+", "State=IDLE+DRAIN", line)
        line += f" Reason={{reason}} [root@2026-01-12T10:00:00]"
        open(nodes, "w").write(line + "\\n")
"""


def _fake_slurm(tmp: Path) -> Path:
    bin_dir, state = tmp / "slurm-bin", tmp / "slurm-state"
    bin_dir.mkdir()
    state.mkdir()
    (state / "nodes.txt").write_text(node_line("gpu-01") + "\n")
    for name in ("scontrol", "squeue", "sacct", "sbatch", "sinfo"):
        script = bin_dir / name
        script.write_text(FAKE_SLURM.format(python=sys.executable, state=str(state)))
        script.chmod(0o755)
    return bin_dir


def _calls(tmp: Path) -> list[list[str]]:
    path = tmp / "slurm-state" / "calls.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _drains(tmp: Path, pid: str) -> list[list[str]]:
    return [
        c
        for c in _calls(tmp)
        if c[:2] == ["scontrol", "update"] and "State=DRAIN" in c and f"#{pid}" in " ".join(c)
    ]


def _controller(
    tmp: Path, name: str, url: str, agent_port: int, bin_dir: Path, auth: Path
) -> tuple[subprocess.Popen[str], Path, int]:
    (tmp / name).mkdir()
    secret = tmp / "push.secret"
    if not secret.exists():
        secret.write_bytes(b"ha-approval-test-secret")
        secret.chmod(0o600)
    cfg, api_port = tmp / name / "fy.toml", free_port()
    cfg.write_text(
        f'[store]\nurl = "{url}"\npath = "{tmp / name / "unused.db"}"\ncontroller_id = "{name}"\n'
        f"[api]\nport = {api_port}\n[loop]\ninterval_s = 1\nseed = 1\n"
        f'[slurm]\nbin_dir = "{bin_dir}"\n'
        f'[sense]\nurl_template = "http://127.0.0.1:{agent_port}/metrics?node={{node}}"\ntimeout_s = 5\n'
        f'[gate]\nstate_dir = "{tmp / name / "gate"}"\nauthorized_keys = "{auth}"\n'
        f'[push]\nhost = "127.0.0.1"\nport = {free_port()}\nsecret_file = "{secret}"\n'
        "[outcomes]\nsacct_state = false\n"
        # thresholds so low that a healthy node is red: a proposal on the first look (tests/test_daemon.py)
        "[core.risk]\nyellow_threshold = 1e-9\nred_threshold = 2e-9\n[core.stake]\nenabled = false\n"
    )
    proc = subprocess.Popen(
        [str(BIN / "fleetyield"), "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / name / "stderr.log", "w"),  # noqa: SIM115 (the child holds it)
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    return proc, cfg, api_port


def _status(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def _fy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "fleetyield"), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def admin(tmp_path):
    from slurm_fleetyield.gate import keygen

    key, pub = keygen("alice", tmp_path / "keys")
    auth = tmp_path / "authorized_keys"
    auth.write_text(pub.read_text())
    auth.chmod(0o644)
    return key, auth


def test_the_survivor_finishes_a_proposal_the_killed_leader_raised(tmp_path, pg_url, admin):
    key, auth = admin
    agent = AgentProcess(tmp_path, "gpu-01")
    bin_dir = _fake_slurm(tmp_path)
    store = Store(pg_url)
    a = b = None
    try:
        a, _, _ = _controller(tmp_path, "ctl-a", pg_url, agent.port, bin_dir, auth)
        wait_for(
            lambda: store.leader_status(time.time()).get("leader") == "ctl-a", timeout_s=30, what="a leads"
        )

        def pending() -> list[dict]:
            try:
                return read_proposals(tmp_path, url=pg_url, status="pending")
            except Exception:
                return []

        (proposal,) = wait_for(pending, timeout_s=30, what="a's drain proposal")
        pid = proposal["id"]
        b, cfg_b, b_port = _controller(tmp_path, "ctl-b", pg_url, agent.port, bin_dir, auth)
        doc = wait_for(lambda: _status(b_port), timeout_s=30, what="b's API (standby)")
        assert doc["live"]["lease"]["leading"] is False
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(10)
        wait_for(
            lambda: store.leader_status(time.time()).get("leader") == "ctl-b", timeout_s=15, what="b leads"
        )
        assert not _drains(tmp_path, pid)  # nothing drained before the approval
        done = _fy("approve", pid, "--key", str(key), "--config", str(cfg_b))
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(lambda: _drains(tmp_path, pid), timeout_s=20, what="the approved drain")
        wait_for(lambda: pid in store.gate_marked("executed"), timeout_s=20, what="the executed mark")
        tick = store.load_state().tick
        wait_for(lambda: store.load_state().tick >= tick + 3, timeout_s=20, what="three more ticks")
        assert len(_drains(tmp_path, pid)) == 1, _drains(tmp_path, pid)  # exactly once
        for host in ("ctl-b", "ctl-a"):  # each host's head file, and the head row
            verified = _fy("audit", "verify", "--config", str(tmp_path / host / "fy.toml"))
            assert verified.returncode == 0, verified.stdout + verified.stderr
        with Gatekeeper.open(tmp_path / "check", url=pg_url) as gk:
            mine = [(e.kind, e.actor) for e in gk.audit.entries() if e.subject == pid]
            assert gk.get(pid).status.value == "approved"
        assert [k for k, _ in mine] == ["proposed", "approved"], mine
        b.send_signal(signal.SIGTERM)
        assert b.wait(20) == 0
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        agent.close()
        store.close()
