"""The daemon's tick end to end: real SQLite store, real scraper against a real ``fleetyield-agent serve
--backend fake`` on 127.0.0.1, real push listener, and the Slurm adapter with a recording command runner
(the subprocess seam). Slurm's answers are scontrol/squeue text the test rewrites to show what the
recorded commands did. No sleeps: everything polls with a deadline.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rig import AgentProcess, FakeCommands, damage_btree_page, free_port, node_line, wait_for

from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.metrics import make_registry
from slurm_fleetyield.adapters.scrape import AgentScraper
from slurm_fleetyield.adapters.slurm import SlurmCli
from slurm_fleetyield.adapters.store import Store, StoreError
from slurm_fleetyield.config import from_mapping
from slurm_fleetyield.daemon import Backoff, Daemon

SECRET = b"daemon-test-secret"


def config(tmp: Path, agent_port: int, **loop):
    return from_mapping(
        {
            "store": {"path": str(tmp / "fy.db")},
            "sense": {"url_template": f"http://127.0.0.1:{agent_port}/metrics?node={{node}}", "timeout_s": 5},
            "loop": {"interval_s": 30, "seed": 1, **loop},
            "api": {"enabled": False},
        }
    )


@pytest.fixture
def agent(tmp_path):
    a = AgentProcess(tmp_path, "gpu-01")
    yield a
    a.close()


def make_daemon(tmp: Path, cmds: FakeCommands, agent_port: int, store: Store | None = None) -> Daemon:
    cfg = config(tmp, agent_port)
    store = store or Store(cfg.store.path)
    scraper = AgentScraper(cfg.sense.url_template, cfg.sense.timeout_s, 8)
    return Daemon(cfg, SlurmCli(runner=cmds), scraper, store)


def test_tick_labels_a_healthy_node_and_then_has_nothing_to_do(tmp_path, agent):
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = make_daemon(tmp_path, cmds, agent.port)
    out = daemon.tick_once()
    assert out.slurm_ok and out.samples["gpu-01"].error is None and len(out.samples["gpu-01"].gpus) == 8
    decision = out.result.nodes["gpu-01"]
    writes = cmds.writes()
    assert len(writes) == 1 and writes[0][:3] == ("scontrol", "update", "NodeName=gpu-01")
    features = ",".join(decision.features)
    assert writes[0][3:] == (
        f"AvailableFeatures={features}",
        f"ActiveFeatures={features}",
        f"Weight={decision.weight}",
    )
    assert any(f.startswith("fy_tier_") for f in decision.features) and decision.features[:2] == (
        "h100",
        "ib",
    )
    # committed: state, log and the rendered result the CLI/API read
    assert daemon.store.load_state().tick == 1
    view = daemon.store.last_result()
    assert (
        view["nodes"]["gpu-01"]["tier"] == decision.tier.value and "explain_text" in view["nodes"]["gpu-01"]
    )
    assert daemon.store.events(limit=5)[0]["kind"] == "applied"
    # Slurm now shows what the update did: the diff is empty, nothing is written again
    cmds.nodes["gpu-01"] = node_line("gpu-01", features=features, weight=decision.weight)
    daemon.tick_once()
    assert len(cmds.writes()) == 1
    daemon.store.close()


def test_slurm_read_failure_applies_nothing_and_keeps_events(tmp_path, agent):
    from slurm_fleetyield.core.model import FatalEvent

    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = make_daemon(tmp_path, cmds, agent.port)
    daemon.store.put_events([FatalEvent("ev-1", "gpu-01", time.time(), "xid", gpu=2, xid=79)])
    cmds.fail_reads = True
    out = daemon.tick_once()
    assert not out.slurm_ok and out.result.plan.actions == () and cmds.writes() == []
    assert [e.event_id for e in daemon.store.pending()] == ["ev-1"]  # taken again when Slurm is back
    assert daemon.store.last_result() is None
    cmds.fail_reads = False
    out = daemon.tick_once()
    drains = [c for c in cmds.writes() if "State=DRAIN" in c]
    assert drains and drains[0][2] == "NodeName=gpu-01" and daemon.store.pending() == []
    daemon.store.close()


def test_crash_between_apply_and_commit_converges(tmp_path, agent):
    """kill -9 after Slurm was changed but before the store commit: the restart recomputes the same diff
    against what Slurm shows, so the already-applied drain is not issued twice and the event is consumed."""
    from slurm_fleetyield.core.model import FatalEvent

    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = make_daemon(tmp_path, cmds, agent.port)
    daemon.tick_once()
    daemon.store.put_events([FatalEvent("ev-9", "gpu-01", time.time(), "xid", gpu=5, xid=48)])

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill -9 before commit")

    daemon.store.commit_tick = crash
    with pytest.raises(KeyboardInterrupt):
        daemon.tick_once()
    drain = [c for c in cmds.writes() if "State=DRAIN" in c]
    assert len(drain) == 1
    daemon.store.close()
    # Slurm kept what was applied; the controller restarts from the last committed tick
    reason = drain[0][4].removeprefix("Reason=")
    applied = [c for c in cmds.writes() if c[1] == "update" and "AvailableFeatures" in c[3]][-1]
    features = applied[3].removeprefix("AvailableFeatures=")
    weight = int(applied[5].removeprefix("Weight="))
    cmds.nodes["gpu-01"] = node_line("gpu-01", "IDLE+DRAIN", features, weight, reason)
    restarted = make_daemon(tmp_path, cmds, agent.port)
    assert restarted.tick_no == 1 and [e.event_id for e in restarted.store.pending()] == ["ev-9"]
    before = len(cmds.writes())
    out = restarted.tick_once()
    assert not [a for a in out.result.plan.actions if a.kind == "drain"]
    assert not [c for c in cmds.writes()[before:] if "State=DRAIN" in c]
    assert restarted.store.pending() == [] and restarted.tick_no == 2
    restarted.store.close()


def test_pushed_fatal_xid_drains_within_a_second(tmp_path):
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    store = Store(tmp_path / "fy.db")
    ingest_port = free_port()
    agent = AgentProcess(
        tmp_path, "gpu-01", push_url=f"http://127.0.0.1:{ingest_port}/v1/agent/events", secret=SECRET
    )
    daemon = make_daemon(tmp_path, cmds, agent.port, store=store)
    ingest = IngestServer("127.0.0.1", ingest_port, SECRET, store, daemon.wake)
    ingest.start()
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: daemon.tick_no >= 1, what="first tick")
        t0 = time.monotonic()
        agent.inject(gpu=3, xid=79)
        drain = wait_for(lambda: [c for c in cmds.writes() if "State=DRAIN" in c], what="drain")
        latency = time.monotonic() - t0
        assert drain[0][2] == "NodeName=gpu-01" and "79" in drain[0][4]
        print(f"fault-to-drain {latency:.3f}s")
        assert latency < 3.0, f"fault-to-drain took {latency:.2f}s"  # goal p50 <= 1 s; slack for CI
        wait_for(lambda: store.pending() == [] and daemon.store.load_state().tick >= 2, what="commit")
    finally:
        daemon.stop()
        runner.join(10)
        ingest.stop()
        agent.close()
        store.close()
    assert not runner.is_alive()


def test_run_backs_off_on_errors_and_resets(tmp_path):
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    cfg = config(tmp_path, free_port(), backoff_initial_s=0.01, backoff_max_s=0.02)
    store = Store(cfg.store.path)
    daemon = Daemon(cfg, SlurmCli(runner=cmds), AgentScraper(cfg.sense.url_template, 1.0, 2), store)
    failures = {"n": 0}
    real = daemon.tick_once

    def flaky(push=False):
        if failures["n"] < 3:
            failures["n"] += 1
            raise RuntimeError("store is on fire")
        out = real(push)
        daemon.stop()
        return out

    daemon.tick_once = flaky
    runner = threading.Thread(target=daemon.run, daemon=True)
    runner.start()
    runner.join(15)
    assert not runner.is_alive() and failures["n"] == 3
    _, counts = daemon.stats.read()
    assert counts["ticks_failed"] == 3 and counts["ticks_ok"] == 1
    assert daemon.live()["consecutive_failures"] == 0
    # the unreachable agent made the node UNKNOWN; the tick still ran
    assert store.last_result()["nodes"]["gpu-01"]["scrape_error"].startswith("connection failed")
    store.close()


def test_the_loop_ticks_with_the_collector_paused_and_collects_after(tmp_path):
    """gcpolicy.collect_after around every tick of the loop: no collection inside a tick."""
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    cfg = config(tmp_path, free_port())
    store = Store(cfg.store.path)
    daemon = Daemon(cfg, SlurmCli(runner=cmds), AgentScraper(cfg.sense.url_template, 1.0, 2), store)
    real = daemon.tick_once
    enabled_in_tick = []

    def observed(push=False):
        enabled_in_tick.append(gc.isenabled())
        out = real(push)
        daemon.stop()
        return out

    daemon.tick_once = observed
    was = gc.isenabled()
    gc.enable()
    try:
        runner = threading.Thread(target=daemon.run, daemon=True)
        runner.start()
        runner.join(15)
        assert not runner.is_alive()
        assert enabled_in_tick == [False] and gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
        store.close()


def test_backoff_sequence():
    b = Backoff(1.0, 5.0, 2.0)
    assert [b.failure() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    b.success()
    assert b.failure() == 1.0


def test_cli_run_once_and_sigterm(tmp_path):
    """``fleetyield run`` as a process: a SIGTERM stops it cleanly (exit 0) after it has ticked."""
    cfg = tmp_path / "fy.toml"
    cfg.write_text(
        f'[store]\npath = "{tmp_path / "fy.db"}"\n[api]\nport = {free_port()}\n[loop]\ninterval_s = 3600\n'
        f'[slurm]\nbin_dir = "{tmp_path}/no-slurm-here"\n'
    )
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "fleetyield"), "run", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:

        def ticked() -> bool:
            db = tmp_path / "fy.db"
            if not db.exists() or db.stat().st_size == 0:  # created, schema not written yet
                return False
            try:
                return bool(Store(db).load_state())
            except StoreError:  # caught between creation and the schema's commit
                return False

        wait_for(ticked, what="a tick")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert '"msg": "stopped"' in err and "slurm unreadable" in err


# --------------------------------------------------------------------------------------------------------
# The human gate, job outcomes and the ledger through the daemon
# --------------------------------------------------------------------------------------------------------


def gate_config(tmp: Path, agent_port: int, auth: Path):
    """Thresholds so low that a healthy node is 'red': the tick proposes a drain on its first look."""
    return from_mapping(
        {
            "store": {"path": str(tmp / "fy.db")},
            "sense": {"url_template": f"http://127.0.0.1:{agent_port}/metrics?node={{node}}", "timeout_s": 5},
            "loop": {"interval_s": 30, "seed": 1},
            "api": {"enabled": False},
            "gate": {"state_dir": str(tmp / "gate"), "authorized_keys": str(auth)},
            "outcomes": {"sacct_state": False},
            # no stake pay test (core/stake.py drain_pays): a proposal at red, as the gate tests need
            "core": {"risk": {"yellow_threshold": 1e-9, "red_threshold": 2e-9}, "stake": {"enabled": False}},
        }
    )


def gate_daemon(tmp: Path, cmds: FakeCommands, agent_port: int, auth: Path) -> Daemon:
    from slurm_fleetyield.executor import GateAccess

    cfg = gate_config(tmp, agent_port, auth)
    scraper = AgentScraper(cfg.sense.url_template, cfg.sense.timeout_s, 8)
    return Daemon(cfg, SlurmCli(runner=cmds), scraper, Store(cfg.store.path), gate=GateAccess(cfg.gate_dir))


@pytest.fixture
def admin(tmp_path):
    from slurm_fleetyield.gate import keygen

    key, pub = keygen("alice", tmp_path / "keys")
    auth = tmp_path / "authorized_keys"
    auth.write_text(pub.read_text())
    auth.chmod(0o644)
    return key, auth


def test_proposal_approval_drains_once_and_survives_restart(tmp_path, agent, admin):
    from slurm_fleetyield.gate import Gatekeeper, sign_statement

    key, auth = admin
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = gate_daemon(tmp_path, cmds, agent.port, auth)
    out = daemon.tick_once()
    proposals = [a for a in out.result.plan.actions if a.kind == "propose_drain"]
    assert len(proposals) == 1 and not [c for c in cmds.writes() if "State=DRAIN" in c]
    pid = proposals[0].proposal_id
    with Gatekeeper.open(tmp_path / "gate") as gk:
        assert [p.id for p in gk.pending()] == [pid]  # recorded with the core's id and deadline
        assert gk.get(pid).expires_at == proposals[0].expires_at
    # the admin approves through the real listener
    ingest = IngestServer(
        "127.0.0.1",
        0,
        SECRET,
        daemon.store,
        daemon.wake,
        gate_dir=str(tmp_path / "gate"),
        authorized_keys=str(auth),
    )

    class Ref:
        id, node = pid, "gpu-01"

    status, doc = ingest.handle_approval(sign_statement(key, Ref(), "approve").encode())
    assert status == 200 and doc["status"] == "approved"
    ingest._httpd.server_close()
    out = daemon.tick_once()
    assert [a.cause for a in out.result.plan.actions if a.kind == "drain"] == ["approved"]
    drains = [c for c in cmds.writes() if "State=DRAIN" in c]
    assert len(drains) == 1 and drains[0][2] == "NodeName=gpu-01" and f"#{pid}" in drains[0][4]
    # Slurm now shows the approved drain: the approval is marked executed, no second drain
    reason = drains[0][4].removeprefix("Reason=")
    cmds.nodes["gpu-01"] = node_line("gpu-01", "IDLE+DRAIN", reason=reason)
    daemon.tick_once()
    assert pid in daemon.store.gate_marked("executed")
    daemon.store.close()
    daemon.gate.close()
    # kill -9 and restart: the approval, the proposal and the mark are all still there; no double drain
    restarted = gate_daemon(tmp_path, cmds, agent.port, auth)
    restarted.tick_once()
    restarted.tick_once()
    # one drain for the approval; the lifecycle then only rewrites its own reason (remediation rung)
    assert len([c for c in cmds.writes() if "State=DRAIN" in c and f"#{pid}" in c[4]]) == 1
    print("\n".join(" ".join(c) for c in cmds.calls if c[1] in ("update", "reboot") or c[0] == "sbatch"))
    with Gatekeeper.open(tmp_path / "gate") as gk:
        assert gk.get(pid).status.value == "approved" and gk.verify_audit().ok
    restarted.store.close()
    restarted.gate.close()


def test_admin_drain_naming_a_proposal_settles_it(tmp_path, agent, admin):
    from slurm_fleetyield.gate import Gatekeeper

    _, auth = admin
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = gate_daemon(tmp_path, cmds, agent.port, auth)
    out = daemon.tick_once()
    pid = next(a.proposal_id for a in out.result.plan.actions if a.kind == "propose_drain")
    cmds.nodes["gpu-01"] = node_line("gpu-01", "IDLE+DRAIN", reason=f"bad fan, see #{pid}")
    daemon.tick_once()
    with Gatekeeper.open(tmp_path / "gate") as gk:
        p = gk.get(pid)
        assert p.status.value == "settled_by_admin" and p.settled_by == "slurm:root"
    assert not [c for c in cmds.writes() if "State=DRAIN" in c]
    daemon.store.close()
    daemon.gate.close()


def test_outcomes_are_delivered_once_and_land_in_the_ledger(tmp_path, agent):
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = make_daemon(tmp_path, cmds, agent.port)
    daemon.config = daemon.config.model_copy(
        update={"outcomes": daemon.config.outcomes.model_copy(update={"sacct_state": False})}
    )
    now = time.time()
    base = {"user": "alice", "gpus": [0, 1], "declared_class": "batch", "exit_code": 0, "exit_signal": 0}
    daemon.store.put_outcomes(
        "gpu-01", [{**base, "job_id": "41", "node": "gpu-01", "start_time": now - 600, "end_time": now - 5}]
    )
    out = daemon.tick_once()
    assert out.result.ledger and out.result.ledger[0].job_id == 41
    # a late record of the same attempt from another node: merged, not delivered again
    daemon.store.put_outcomes(
        "gpu-02", [{**base, "job_id": "41", "node": "gpu-02", "start_time": now - 598, "end_time": now - 4}]
    )
    out = daemon.tick_once()
    assert not out.result.ledger and daemon.store.pending_outcomes() == []
    rows = daemon.store.ledger()
    assert [r["job_id"] for r in rows] == [41] and rows[0]["workload"] == "batch"
    assert daemon.stats.read_extra()[1]["jobs"] == 1
    daemon.store.close()


# --------------------------------------------------------------------------------------------------------
# issue #27 item 8: damaged files stop the start with a clear error, never a silent fresh start
# --------------------------------------------------------------------------------------------------------


def _run_once(tmp_path: Path):  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from slurm_fleetyield.cli import main

    cfg = tmp_path / "fy.toml"
    cfg.write_text(
        f'[store]\npath = "{tmp_path / "fy.db"}"\n[api]\nenabled = false\n'
        f'[slurm]\nbin_dir = "{tmp_path}/no-slurm-here"\n'
    )
    return CliRunner().invoke(main, ["run", "--config", str(cfg), "--once"])


def test_run_refuses_an_empty_store_file(tmp_path):
    (tmp_path / "fy.db").write_bytes(b"")
    out = _run_once(tmp_path)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), repr(out.exception)
    assert str(tmp_path / "fy.db") in out.output and "empty" in out.output
    assert (tmp_path / "fy.db").read_bytes() == b""


def _gate_with_proposals(gate_dir: Path, n: int = 3) -> None:
    """A gate state dir holding ``n`` pending proposals (and their ``n`` audit rows)."""
    from slurm_fleetyield.gate import Gatekeeper, Proposal

    with Gatekeeper.open(gate_dir) as gk:
        for i in range(n):
            gk.propose(
                Proposal.new(
                    id=f"p-00000000000{i}",
                    node=f"gpu-0{i}",
                    gpus=(1,),
                    risk=0.8,
                    evidence="e",
                    affected_jobs=(),
                    now=time.time(),
                    ttl_s=3600,
                )
            )


def test_run_refuses_a_gate_whose_audit_chain_was_edited(tmp_path):
    import sqlite3

    from slurm_fleetyield.gate import Gatekeeper

    gate_dir = tmp_path / "gate"
    _gate_with_proposals(gate_dir)
    conn = sqlite3.connect(gate_dir / "gate.db", isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS audit_no_update")
    conn.execute("""UPDATE audit SET actor = 'mallory' WHERE seq = 2""")  # an edited middle row
    conn.close()
    out = _run_once(tmp_path)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), repr(out.exception)
    assert "audit" in out.output and "seq 2" in out.output and str(gate_dir) in out.output
    with Gatekeeper.open(gate_dir) as gk:  # nothing appended to the tampered log
        assert [e.seq for e in gk.audit.entries()] == [1, 2, 3]


def test_run_refuses_a_gate_db_with_a_damaged_page(tmp_path):
    # issue #27: header and schema intact, one b-tree page damaged: the file opened, the chain (other pages)
    # verified, and `run --once` ticked; only a later read of that table said "malformed"
    db = tmp_path / "gate" / "gate.db"
    _gate_with_proposals(db.parent)
    damage_btree_page(db, page=4)
    damaged = db.read_bytes()
    out = _run_once(tmp_path)
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), (repr(out.exception), out.output)
    assert str(db) in out.output and "integrity check failed" in out.output, out.output
    assert "tick 1" not in out.output and db.read_bytes() == damaged  # refused before any write


def test_a_capacity_breaker_is_logged_stored_and_exported(tmp_path, agent, monkeypatch, caplog):
    # the core emits stake_breaker when withholding a class would pass stake.withhold_cap_fraction
    # (tests/core/test_stake.py); here: the daemon's log, the events table, the status view and /metrics
    from dataclasses import replace

    from slurm_fleetyield import daemon as daemon_mod
    from slurm_fleetyield.core.model import LogEvent

    real_tick = daemon_mod.tick
    data = {"class": "pretrain", "withheld_gpus": 0, "would_withhold_gpus": 8, "service_gpus": 8}

    def tick_with_breaker(state, obs, params, now, rng):
        r = real_tick(state, obs, params, now, rng)
        msg = "fy_ok_train: withholding it from 8 of 8 in-service GPUs would exceed the cap (20%) ..."
        return replace(r, events=(*r.events, LogEvent(now, "", "stake_breaker", msg, data)))

    monkeypatch.setattr(daemon_mod, "tick", tick_with_breaker)
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    daemon = make_daemon(tmp_path, cmds, agent.port)
    with caplog.at_level("WARNING", logger=daemon_mod.log.name):
        daemon.tick_once()
    (rec,) = [r for r in caplog.records if r.getMessage().startswith("stake capacity breaker: fy_ok_train")]
    assert rec.levelname == "WARNING" and rec.fy == {"tick": 1, **data}
    (ev,) = [e for e in daemon.store.events(limit=50) if e["kind"] == "stake_breaker"]
    assert ev["data"] == data
    assert daemon.store.last_result()["stake"]["breaker"][0]["would_withhold_gpus"] == 8
    from prometheus_client.exposition import generate_latest

    text = generate_latest(make_registry(daemon.stats)).decode()
    assert 'fleetyield_stake_breaker_tripped{class="pretrain"} 1.0' in text
    daemon.store.close()
