"""Two real controller processes (``fleetyield run``) on one real PostgreSQL: the standby serves the API
from the store, and leads within 10 s of a kill -9 of the leader. Slurm is absent (``bin_dir`` points
nowhere, as in tests/test_daemon.py): the ticks run and commit with Slurm unreadable, which is all the lease
needs; the drain-mid-flow takeover is the docker cluster's test (issue #30)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rig import free_port, wait_for

from slurm_fleetyield.adapters.store import Store

TAKEOVER_S = 10.0


def _controller(tmp: Path, name: str, url: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    (tmp / name).mkdir()
    cfg = tmp / name / "fy.toml"
    cfg.write_text(
        f'[store]\nurl = "{url}"\npath = "{tmp / name / "unused.db"}"\ncontroller_id = "{name}"\n'
        f"[api]\nport = {port}\n[loop]\ninterval_s = 1\n"
        f'[slurm]\nbin_dir = "{tmp}/no-slurm-here"\n'
    )
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "fleetyield"), "run", "--config", str(cfg)],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / name / "stderr.log", "w"),  # noqa: SIM115 (the child holds it)
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    return proc, port


def _status(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def test_the_standby_leads_within_10_s_of_a_kill_9_of_the_leader(tmp_path, pg_url):
    store = Store(pg_url)
    a, _ = _controller(tmp_path, "ctl-a", pg_url)
    b = None
    try:
        wait_for(
            lambda: store.leader_status(time.time()).get("leader") == "ctl-a", timeout_s=30, what="a leads"
        )
        b, b_port = _controller(tmp_path, "ctl-b", pg_url)
        # the standby serves the read-only API from the store, and says who leads
        doc = wait_for(lambda: _status(b_port), timeout_s=30, what="b's API")
        assert doc["leader"]["leader"] == "ctl-a" and doc["live"]["lease"]["leading"] is False
        token = doc["leader"]["token"]
        tick_before = store.load_state().tick
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(10)
        killed = time.monotonic()
        deadline = killed + TAKEOVER_S
        while store.leader_status(time.time()).get("leader") != "ctl-b":
            assert time.monotonic() < deadline, f"no takeover within {TAKEOVER_S} s"
            time.sleep(0.05)
        took = time.monotonic() - killed
        now = store.leader_status(time.time())
        assert now["token"] == token + 1, now
        # the new leader ticks and commits from the old leader's last state
        wait_for(lambda: store.load_state().tick > tick_before, timeout_s=10, what="a tick by b")
        assert _status(b_port)["live"]["lease"]["leading"] is True
        print(f"takeover in {took:.2f} s")
        b.send_signal(signal.SIGTERM)
        assert b.wait(20) == 0
        assert store.leader_status(time.time())["leader"] is None  # released at the clean stop
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        store.close()
