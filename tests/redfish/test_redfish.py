"""adapters/redfish.py against a real Redfish implementation (sushy-emulator, fake driver, basic auth)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from bmc_rig import (
    PASSWORD,
    STUCK,
    USER,
    Emulator,
    RecordingAudit,
    make_config,
    make_controller,
    write_credentials,
)

from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket
from slurm_fleetyield.adapters.redfish import (
    BmcAuthError,
    BmcNode,
    BmcProtocolError,
    BmcTimeout,
    BmcUnreachable,
    Credentials,
    PowerOp,
    PowerRefused,
    RedfishExecutor,
    SafetyContext,
)
from slurm_fleetyield.core.plan import PowerCycle
from slurm_fleetyield.gate.audit import AuditLog

SECRETS = Credentials(USER, PASSWORD).secrets()


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # sushy, urllib3 and ours: everything a real deployment could log


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def test_status_reads_power_state_and_health(emulator: Emulator, creds_file: Path) -> None:
    pc = make_controller(make_config(emulator, creds_file))
    status = pc.status("gpu-01")
    assert status.power_state == "On"
    assert status.health == "OK"
    assert status.system.endswith(emulator.systems["gpu-01"])


def test_force_restart_comes_back_on_and_is_audited(emulator: Emulator, creds_file: Path, caplog) -> None:
    audit = RecordingAudit()
    pc = make_controller(make_config(emulator, creds_file), audit=audit)
    result = pc.act("gpu-02", PowerOp.FORCE_RESTART, reason="fleetyield: XID 79; remediation 2/3")
    assert result.power_state == "On"
    assert [e["data"]["result"] for e in audit.entries] == ["started", "ok"]
    entry = audit.entries[-1]
    assert (entry["actor"], entry["kind"], entry["subject"]) == (
        "fleetyield-redfish",
        "power_action",
        "gpu-02",
    )
    assert entry["data"]["operation"] == "force_restart"
    assert entry["data"]["duration_s"] > 0
    assert entry["data"]["reason"].startswith("fleetyield: XID 79")
    assert_no_secret(caplog.text, repr(audit.entries))


def test_power_cycle_goes_off_then_on(emulator: Emulator, creds_file: Path) -> None:
    config = make_config(emulator, creds_file)
    observer = make_controller(config)
    seen: list[str] = []

    def sleep(s: float) -> None:  # every wait (polls, the off dwell) also looks at the emulated system
        seen.append(observer.status("gpu-03").power_state)
        import time

        time.sleep(s)

    pc = make_controller(config, sleep=sleep)
    result = pc.act("gpu-03", "power_cycle")
    assert "Off" in seen, seen  # the dwell ran with the system off
    assert result.power_state == "On"
    assert pc.status("gpu-03").power_state == "On"


def test_power_off_then_on(emulator: Emulator, creds_file: Path) -> None:
    pc = make_controller(make_config(emulator, creds_file))
    assert pc.act("gpu-04", PowerOp.POWER_OFF).power_state == "Off"
    assert pc.status("gpu-04").power_state == "Off"
    assert pc.act("gpu-04", PowerOp.POWER_ON).power_state == "On"


def test_system_that_never_comes_back_times_out(emulator: Emulator, creds_file: Path, caplog) -> None:
    audit = RecordingAudit()
    pc = make_controller(make_config(emulator, creds_file, on_timeout_s=2.0), audit=audit)
    with pytest.raises(BmcTimeout) as err:
        pc.act(STUCK, PowerOp.POWER_CYCLE)
    assert (err.value.node, err.value.operation) == (STUCK, "power_cycle")
    assert "did not reach power On within 2s" in str(err.value)
    assert audit.results() == ["started", "error:BmcTimeout"]
    assert pc.status(STUCK).power_state == "Off"  # left off: the lifecycle escalates, a human looks
    assert_no_secret(str(err.value), caplog.text)


def test_unreachable_bmc_is_retried_with_backoff_then_typed(creds_file: Path, caplog) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    emu = Emulator(creds_file.parent / "none", port=port)
    emu.systems = {"gpu-dead": "x"}
    sleeps: list[float] = []
    audit = RecordingAudit()
    pc = make_controller(make_config(emu, creds_file, retries=3), audit=audit, sleep=sleeps.append)
    with pytest.raises(BmcUnreachable) as err:
        pc.act("gpu-dead", PowerOp.POWER_CYCLE)
    assert sleeps == [0.5, 1.0, 2.0]  # doubling, capped at backoff_max_s
    assert pc.bmc_calls == 4
    assert err.value.node == "gpu-dead" and err.value.operation == "power_cycle"
    assert f"127.0.0.1:{port}" in str(err.value)
    assert audit.results() == ["started", "error:BmcUnreachable"]
    assert_no_secret(str(err.value), caplog.text)


def test_wrong_credentials_are_an_auth_error_never_retried(
    emulator: Emulator, tmp_path: Path, caplog
) -> None:
    wrong = write_credentials(tmp_path / "wrong.creds", password="not-the-" + PASSWORD)
    sleeps: list[float] = []
    audit = RecordingAudit()
    pc = make_controller(make_config(emulator, wrong), audit=audit, sleep=sleeps.append)
    with pytest.raises(BmcAuthError) as err:
        pc.act("gpu-05", PowerOp.FORCE_RESTART)
    assert sleeps == [] and pc.bmc_calls == 1  # BMCs lock accounts after repeated failures
    assert "401" in str(err.value) and "gpu-05" in str(err.value)
    assert audit.results() == ["started", "error:BmcAuthError"]
    wrong_secrets = Credentials(USER, "not-the-" + PASSWORD).secrets()
    for text in (str(err.value), caplog.text, repr(audit.entries)):
        assert all(s not in text for s in (*SECRETS, *wrong_secrets))


@pytest.mark.parametrize("auth", ["auto", "basic"])
def test_auth_modes_against_basic_only_bmc(emulator: Emulator, creds_file: Path, auth: str) -> None:
    pc = make_controller(make_config(emulator, creds_file, auth=auth))
    assert pc.status("gpu-06").power_state == "On"


def test_credentials_file_readable_by_others_is_refused(emulator: Emulator, tmp_path: Path, caplog) -> None:
    loose = write_credentials(tmp_path / "loose.creds", mode=0o644)
    pc = make_controller(make_config(emulator, loose))
    with pytest.raises(PowerRefused) as err:
        pc.act("gpu-06", PowerOp.FORCE_RESTART)
    assert err.value.rule == "config" and "644" in str(err.value) and "chmod 600" in str(err.value)
    assert pc.bmc_calls == 0
    assert_no_secret(str(err.value), caplog.text)


def test_first_system_refuses_a_bmc_with_several(emulator: Emulator, creds_file: Path) -> None:
    nodes = {"gpu-07": BmcNode(address=emulator.url, system_id="first")}
    pc = make_controller(make_config(emulator, creds_file, nodes=nodes))
    with pytest.raises(BmcProtocolError, match="exactly one"):
        pc.status("gpu-07")


def test_rate_limit_refuses_and_audits_without_touching_the_bmc(emulator: Emulator, creds_file: Path) -> None:
    t = [1000.0]
    audit = RecordingAudit()
    config = make_config(emulator, creds_file, rate_limit_actions=2, rate_limit_window_s=600)
    bucket = TokenBucket(2, 600, clock=lambda: t[0])
    pc = make_controller(config, audit=audit, bucket=bucket)
    pc.act("gpu-08", PowerOp.POWER_ON)  # already on: cheap
    pc.act("gpu-09", PowerOp.POWER_ON)
    calls = pc.bmc_calls
    with pytest.raises(PowerRefused) as err:
        pc.act("gpu-10", PowerOp.POWER_ON)
    assert err.value.rule == "rate_limit" and "2 power actions per 600s" in str(err.value)
    assert pc.bmc_calls == calls
    assert audit.entries[-1]["data"]["result"] == "refused:rate_limit"
    t[0] += 300  # one token back (2 per 600 s)
    pc.act("gpu-10", PowerOp.POWER_ON)


def test_running_jobs_refuse_unless_quarantined(emulator: Emulator, creds_file: Path) -> None:
    audit = RecordingAudit()
    busy = SafetyContext("gpu-11", running_jobs=(41, 42), drained_by_us=True)
    pc = make_controller(make_config(emulator, creds_file), audit=audit, safety=lambda n, op: busy)
    with pytest.raises(PowerRefused) as err:
        pc.act("gpu-11", PowerOp.POWER_CYCLE)
    assert err.value.rule == "safety" and "41, 42" in str(err.value)
    assert pc.bmc_calls == 0
    assert (
        audit.entries[-1]["data"] | {"running_jobs": [41, 42], "result": "refused:safety"}
        == (audit.entries[-1]["data"])
    )
    quarantined = SafetyContext("gpu-11", running_jobs=(41,), quarantined=True)
    pc.safety = lambda n, op: quarantined
    assert pc.act("gpu-11", PowerOp.FORCE_RESTART).power_state == "On"


def test_power_on_needs_no_safety(emulator: Emulator, creds_file: Path) -> None:
    pc = make_controller(make_config(emulator, creds_file), safety=lambda n, op: SafetyContext(n, (7,)))
    assert pc.act("gpu-12", PowerOp.POWER_ON).power_state == "On"


def test_unconfigured_node_is_refused(emulator: Emulator, creds_file: Path) -> None:
    pc = make_controller(make_config(emulator, creds_file))
    with pytest.raises(PowerRefused, match="no BMC configured") as err:
        pc.act("cpu-01", PowerOp.POWER_CYCLE)
    assert err.value.rule == "no_bmc"


def test_audit_goes_to_the_gates_hash_chained_log(
    emulator: Emulator, creds_file: Path, tmp_path: Path
) -> None:
    log = AuditLog.open(tmp_path / "gate.db", tmp_path / "audit.head")
    pc = make_controller(make_config(emulator, creds_file), audit=log)
    pc.act("gpu-01", PowerOp.POWER_ON)
    with pytest.raises(PowerRefused):
        pc.act("cpu-x", PowerOp.POWER_ON)  # no BMC: not audited (nothing was attempted)
    entries = list(log.entries())
    assert [(e.actor, e.kind, e.subject, e.data["result"]) for e in entries] == [
        ("fleetyield-redfish", "power_action", "gpu-01", "started"),
        ("fleetyield-redfish", "power_action", "gpu-01", "ok"),
    ]
    assert log.verify().ok


def test_audit_unavailable_fails_closed(emulator: Emulator, creds_file: Path) -> None:
    class Broken:
        def append(self, **kw):  # type: ignore[no-untyped-def]
            raise RuntimeError("disk full")

    pc = make_controller(make_config(emulator, creds_file), audit=Broken())
    with pytest.raises(PowerRefused) as err:
        pc.act("gpu-01", PowerOp.FORCE_RESTART)
    assert err.value.rule == "audit" and pc.bmc_calls == 0


def test_emulator_stopped_mid_cycle(tmp_path: Path, creds_file: Path, caplog) -> None:
    emu = Emulator(tmp_path / "emu").start(["gpu-mid"])
    audit = RecordingAudit()
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        if s == 0.2 and len(sleeps) and emu.proc and emu.proc.poll() is None:
            emu.stop()  # the first wait after ForceOff: the BMC disappears

    try:
        pc = make_controller(make_config(emu, creds_file, retries=1), audit=audit, sleep=sleep)
        with pytest.raises(BmcUnreachable):
            pc.act("gpu-mid", PowerOp.POWER_CYCLE)
    finally:
        emu.stop()
    assert audit.results() == ["started", "error:BmcUnreachable"]
    assert_no_secret(caplog.text)


def test_executor_maps_power_cycle_to_action_results(emulator: Emulator, creds_file: Path) -> None:
    ok = RedfishExecutor(make_controller(make_config(emulator, creds_file)))
    r = ok.run(PowerCycle("gpu-02", "fleetyield: XID 79; remediation 2/3 (power_cycle)"))
    assert r.ok and r.command == ("redfish", "power_cycle", "gpu-02", emulator.url)
    assert r.detail.startswith("power cycled in")
    stuck = RedfishExecutor(make_controller(make_config(emulator, creds_file, on_timeout_s=1.0)))
    r = stuck.run(PowerCycle(STUCK, "r"))
    assert not r.ok and r.detail.startswith("BmcTimeout: power_cycle on gpu-stuck")
    assert r.action.kind == "power_cycle"  # the tick turns this into REMEDIATION_FAILED
    dry = RedfishExecutor(make_controller(make_config(emulator, creds_file)), dry_run=True)
    r = dry.run(PowerCycle("gpu-02", "r"))
    assert r.ok and r.detail == "dry-run: not executed" and dry.power.bmc_calls == 0
    off = RedfishExecutor(make_controller(make_config(emulator, creds_file, enabled=False)))
    assert not off.run(PowerCycle("gpu-02", "r")).ok


def test_daemon_executor_routes_power_cycle_to_the_bmc(
    emulator: Emulator, creds_file: Path, tmp_path: Path
) -> None:
    """The plan's PowerCycle reaches the BMC through the daemon's executor (the Slurm port never sees it);
    without a Redfish adapter it fails cleanly, which the next tick turns into REMEDIATION_FAILED."""
    from slurm_fleetyield.adapters.store import Store
    from slurm_fleetyield.core.plan import Plan
    from slurm_fleetyield.executor import Executor
    from slurm_fleetyield.ports import ApplyReport

    class NoSlurm:
        seen: list[Plan] = []

        def apply(self, plan: Plan) -> ApplyReport:
            self.seen.append(plan)
            return ApplyReport()

    store = Store(tmp_path / "fy.db")
    action = PowerCycle("gpu-03", "fleetyield: XID 79; remediation 2/3 (power_cycle)")
    wired = Executor(
        NoSlurm(), store, redfish=RedfishExecutor(make_controller(make_config(emulator, creds_file)))
    )
    report = wired.apply(Plan((action,)), 0.0)
    assert [r.ok for r in report.results] == [True] and report.results[0].command[0] == "redfish"
    assert report.results[0].detail.startswith("power cycle started off the tick")
    assert NoSlurm.seen == []  # only routed actions: the Slurm port is not called at all
    assert wired.redfish is not None and wired.redfish.close(timeout_s=60) == frozenset()
    in_flight, done = wired.background()
    assert in_flight == frozenset() and [(r.ok, r.action) for r in done] == [(True, action)]
    assert done[0].detail.startswith("power cycled in")
    bare = Executor(NoSlurm(), store).apply(Plan((action,)), 0.0)
    assert [(r.ok, r.detail) for r in bare.results] == [(False, "no Redfish adapter configured")]
    store.close()


class QueuedSpawn:
    """The worker-thread seam: keeps the work instead of starting a thread; the test runs it when it likes."""

    def __init__(self) -> None:
        self.work: list = []

    def __call__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.work.append(fn)

    def run_all(self) -> None:
        work, self.work = self.work, []
        for fn in work:
            fn()


def test_start_admits_without_touching_the_bmc_and_reports_through_collect(
    emulator: Emulator, creds_file: Path
) -> None:
    audit = RecordingAudit()
    spawn = QueuedSpawn()
    ex = RedfishExecutor(make_controller(make_config(emulator, creds_file), audit=audit), spawn=spawn)
    action = PowerCycle("gpu-13", "fleetyield: XID 79 gpu 3; remediation 1/2 (power_cycle)")
    r = ex.start(action)
    # admitted (safety, rate limit, audit) in the caller's thread, but not one request to the BMC yet
    assert r.ok and r.detail.startswith("power cycle started off the tick")
    assert ex.power.bmc_calls == 0 and audit.results("gpu-13") == ["started"]
    assert ex.collect() == (frozenset({"gpu-13"}), ())
    second = ex.start(PowerCycle("gpu-13", "again"))
    assert not second.ok and second.detail == "a power action on gpu-13 is still in flight"
    assert len(spawn.work) == 1 and audit.results("gpu-13") == ["started"]  # the second one never admitted
    spawn.run_all()  # the worker: ForceOff, wait Off, dwell, On, wait On
    assert ex.power.bmc_calls > 0 and audit.results("gpu-13") == ["started", "ok"]
    in_flight, done = ex.collect()
    assert in_flight == frozenset() and [(d.ok, d.action) for d in done] == [(True, action)]
    assert ex.collect() == (frozenset(), ())  # handed over once


def test_start_failures_refused_at_once_or_reported_when_done(emulator: Emulator, creds_file: Path) -> None:
    spawn = QueuedSpawn()

    def busy(node: str, op: PowerOp) -> SafetyContext:
        return SafetyContext(node, running_jobs=(42,))

    refused = RedfishExecutor(make_controller(make_config(emulator, creds_file), safety=busy), spawn=spawn)
    r = refused.start(PowerCycle("gpu-14", "r"))
    assert not r.ok and "refused (safety)" in r.detail and "42" in r.detail
    assert spawn.work == [] and refused.in_flight() == frozenset()  # nothing left behind
    stuck = RedfishExecutor(make_controller(make_config(emulator, creds_file, on_timeout_s=1.0)), spawn=spawn)
    assert stuck.start(PowerCycle(STUCK, "r")).ok
    spawn.run_all()
    _, (done,) = stuck.collect()
    assert not done.ok and done.detail.startswith("BmcTimeout: power_cycle on gpu-stuck")
    assert done.action.kind == "power_cycle"  # the daemon feeds it back: REMEDIATION_FAILED
    assert stuck.close(timeout_s=0) == frozenset()


def test_start_records_that_it_is_sent_before_any_worker_runs_and_sends_nothing_without(
    emulator: Emulator, creds_file: Path
) -> None:
    """``sent`` (the executor marks the intent) runs once admitted, before the worker may reach the BMC; a
    record that fails sends nothing (a replay would start it again: it must not have run)."""
    audit = RecordingAudit()
    spawn = QueuedSpawn()
    ex = RedfishExecutor(make_controller(make_config(emulator, creds_file), audit=audit), spawn=spawn)
    marks: list[int] = []
    assert ex.start(PowerCycle("gpu-09", "r"), lambda: marks.append(len(spawn.work))).ok
    assert marks == [0] and len(spawn.work) == 1  # recorded before the worker was handed over

    def full() -> None:
        raise OSError("disk full")

    r = ex.start(PowerCycle("gpu-10", "r"), full)
    assert not r.ok and r.detail == "cannot record the start: disk full"
    assert len(spawn.work) == 1 and ex.in_flight() == frozenset({"gpu-09"})  # gpu-10: nothing left behind
    assert audit.results("gpu-10") == ["started", "error:NotStarted"] and ex.power.bmc_calls == 0
