"""fleetyield-healthcheck (prolog_epilog/healthcheck.py): its rule, and the NHC check's ``--report`` mode run
as a subprocess against the agent's marker and a controller that answers, fails or is gone.

The HealthCheckProgram mode (``scontrol update``) runs against real Slurm in
tests/integration/test_healthcheck_program.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prolog_epilog.healthcheck import NHC_PREFIX, STATE_FILE, decide

REPO = Path(__file__).resolve().parents[2]

XID79 = {
    "kind": "xid",
    "gpu": 3,
    "xid": 79,
    "reset_fixes": True,
    "message": "XID 79: GPU has fallen off the bus",
}


def test_the_rule() -> None:
    inf = float("inf")
    # a fault while the controller answers: the controller drains
    assert decide([XID79], None, 120, "IDLE", "")[0] == "none"
    # a fault with the controller silent under the grace: a restart is not an outage
    assert decide([XID79], 30, 120, "IDLE", "")[0] == "none"
    # past the grace, or with no controller configured: drain here, NHC-style reason
    action, why = decide([XID79], 120, 120, "MIXED", "")
    assert action == "drain" and why == f"{NHC_PREFIX} XID 79: GPU has fallen off the bus on GPU 3", why
    assert decide([XID79], inf, 120, "IDLE", "")[0] == "drain"
    # a node Slurm has out already (anyone's mark, FleetYield's included) is not ours to change
    for state, reason in (
        ("IDLE+DRAIN", "fleetyield: XID 79"),
        ("DOWN", "Not responding"),
        ("IDLE+DRAIN", "ops"),
    ):
        assert decide([XID79], inf, 120, state, reason)[0] == "none", (state, reason)
    # no fault: lift only our own mark
    assert decide([], None, 120, "IDLE+DRAIN", f"{NHC_PREFIX} XID 79 on GPU 3")[0] == "resume"
    assert decide([], inf, 120, "IDLE+DRAIN", "fleetyield: XID 79 GPU 3")[0] == "none"
    assert decide([], inf, 120, "IDLE+DRAIN", "NHC: check_fs_mount: /scratch missing")[0] == "none"
    assert decide([], None, 120, "IDLE", "")[0] == "none"


def report(node, **conf: object) -> subprocess.CompletedProcess[str]:
    node.write_conf(**conf)
    env = {**node.env(), "PYTHONPATH": str(REPO)}  # this tree's hooks, whatever copy is installed
    env.pop("SLURM_JOB_ID")
    return subprocess.run(
        [sys.executable, "-m", "prolog_epilog.healthcheck", "--report"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def test_report_mode_without_a_controller_fails_on_a_pending_fault_and_passes_without(node) -> None:
    proc = report(node)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stderr
    node.write_fatal([XID79])
    proc = report(node)
    # NHC's die() marks "NHC: <this line>": the reason the HealthCheckProgram mode writes
    assert proc.returncode == 1 and proc.stdout == "fleetyield: XID 79: GPU has fallen off the bus on GPU 3\n"


def test_an_unreadable_marker_is_no_verdict(node) -> None:
    node.agent_dir.mkdir(parents=True)
    (node.agent_dir / "fatal.json").write_text("{corrupt")
    proc = report(node)
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stderr
    assert "unreadable" in proc.stderr


def test_the_grace_starts_at_the_first_silent_run_and_an_answer_or_a_clear_marker_ends_it(
    node, dead_port: int, gate
) -> None:
    node.write_fatal([XID79])
    state = node.spool / STATE_FILE
    # the controller is gone: the first run remembers when, and waits
    proc = report(node, controller_url=f"http://127.0.0.1:{dead_port}", healthcheck_grace_s=3600)
    # --report fails (NHC marks) only when this would drain: not yet
    assert (proc.returncode, proc.stdout) == (0, ""), proc.stderr
    since = json.loads(state.read_text())["controller_down_since"]
    # past the grace (the remembered time moved back an hour): now it marks
    state.write_text(json.dumps({"controller_down_since": since - 3600}))
    proc = report(node, controller_url=f"http://127.0.0.1:{dead_port}", healthcheck_grace_s=3600)
    assert proc.returncode == 1 and proc.stdout.startswith("fleetyield: XID 79"), proc.stderr
    # an unhealthy controller (HTTP 500) is as silent as a gone one: the remembered time stands
    gate.mode = "500"
    proc = report(node, controller_url=gate.url, healthcheck_grace_s=3600)
    assert proc.stdout.startswith("fleetyield: XID 79"), proc.stderr
    assert "/healthz" in gate.requests
    # it answers: it drains, and the outage is forgotten
    gate.mode = "allow"
    proc = report(node, controller_url=gate.url, healthcheck_grace_s=3600)
    assert (proc.returncode, proc.stdout) == (0, "") and not state.exists(), proc.stderr
    # no fault pending: no outage is timed either
    gate.mode = "500"
    report(node, controller_url=gate.url, healthcheck_grace_s=3600)
    assert state.exists()
    node.write_fatal([])
    proc = report(node, controller_url=gate.url, healthcheck_grace_s=3600)
    assert (proc.returncode, proc.stdout) == (0, "") and not state.exists(), proc.stderr


def test_with_two_controllers_one_healthy_is_a_controller_at_work(node, dead_port: int, gate) -> None:
    """High availability: the leader gone, the standby healthy: no outage is timed, nothing marks."""
    node.write_fatal([XID79])
    state = node.spool / STATE_FILE
    urls = f"http://127.0.0.1:{dead_port},{gate.url}"
    proc = report(node, controller_url=urls, healthcheck_grace_s=3600)
    assert (proc.returncode, proc.stdout) == (0, "") and not state.exists(), proc.stderr
    assert "/healthz" in gate.requests
    gate.mode = "500"  # both silent now: the outage is timed; past the grace it marks
    proc = report(node, controller_url=urls, healthcheck_grace_s=3600)
    assert (proc.returncode, proc.stdout) == (0, "") and state.exists(), proc.stderr
    since = json.loads(state.read_text())["controller_down_since"]
    state.write_text(json.dumps({"controller_down_since": since - 3600}))
    proc = report(node, controller_url=urls, healthcheck_grace_s=3600)
    assert proc.returncode == 1 and proc.stdout.startswith("fleetyield: XID 79"), proc.stderr


def test_a_controller_that_refuses_the_probe_is_a_loud_configuration_error(node, protected_api) -> None:
    """/healthz behind the API's basic auth: hooks.conf's controller_basic_auth_* get the answer; without
    them the probe is refused, said at ERROR as a configuration error, and the controller counts as not at
    work to us (the grace starts: with a fatal event pending this node is marked after it)."""
    url = protected_api.start()
    node.write_fatal([XID79])
    state = node.spool / STATE_FILE
    conf = {"controller_url": url, "timeout_ms": 3000, "healthcheck_grace_s": 3600}
    proc = report(
        node,
        **conf,
        controller_basic_auth_username="prolog",
        controller_basic_auth_password_file=protected_api.password_file(),
    )
    assert (proc.returncode, proc.stdout) == (0, "") and not state.exists(), proc.stderr  # it drains
    assert "AUTH REFUSED" not in proc.stderr and protected_api.refused() == 0
    proc = report(node, **conf)
    assert (proc.returncode, proc.stdout) == (0, "") and state.exists(), proc.stderr
    line = next(line for line in proc.stderr.splitlines() if "AUTH REFUSED" in line)
    assert " ERROR " in line and "configuration error" in line and "HTTP 401" in line, line
    assert protected_api.refused() == 1


@pytest.mark.parametrize("args", [["--bogus"], ["--report", "x"]])
def test_unexpected_arguments_change_nothing(node, args: list[str]) -> None:
    node.write_fatal([XID79])
    proc = subprocess.run(
        [sys.executable, "-m", "prolog_epilog.healthcheck", *args],
        env=node.env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and "unexpected arguments" in proc.stderr
    assert not node.spool.exists()


NHC_CHECK = Path(__file__).parents[2] / "contrib" / "nhc" / "fleetyield.nhc"


def test_the_nhc_check_dies_with_the_reason_the_healthcheck_program_writes(node, tmp_path: Path) -> None:
    # NHC sources its scripts into one bash and calls the check; ``die`` is NHC's (here: print what it gets)
    cmd = tmp_path / "fleetyield-healthcheck"
    cmd.write_text(f'#!/bin/sh\nexec {sys.executable} -m prolog_epilog.healthcheck "$@"\n')
    cmd.chmod(0o755)
    script = f'die() {{ echo "die $1 $2"; }}; source {NHC_CHECK}; check_fleetyield; echo rc=$?'
    env = {**node.env(), "FLEETYIELD_HEALTHCHECK": str(cmd)}
    env.pop("SLURM_JOB_ID")

    def nhc() -> str:
        return subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30
        ).stdout

    assert nhc() == "rc=0\n"
    node.write_fatal([XID79])
    assert nhc() == "die 1 fleetyield: XID 79: GPU has fallen off the bus on GPU 3\nrc=1\n"
