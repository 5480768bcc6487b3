"""The gang A/B's plan and ledger (chaos/gang.py), the job script's gang mode, the driver's commands."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_fleetyield.chaos import gang, gang_ab
from slurm_fleetyield.chaos.timeline import FAULT_XIDS

SCRIPT = Path(__file__).parents[2] / "contrib" / "chaos" / "fy-train-job.sh"


def test_same_seed_same_plan_within_bounds():
    gp = gang.GangParams()
    plans = [gang.plan(s, gp) for s in range(40)]
    assert gang.plan(3, gp) == plans[3] and len({(p.fault_after_s, p.node_index) for p in plans}) > 10
    for p in plans:
        assert 0.25 * gp.work_s <= p.fault_after_s <= 0.75 * gp.work_s
        assert 0 <= p.node_index < gp.nodes and 0 <= p.gpu < gp.gpus_per_node and p.xid in FAULT_XIDS
        assert 0 <= p.nhc_phase_s <= gp.health_check_interval_s
    assert {p.node_index for p in plans} == {0, 1, 2}
    assert gang.GangParams.from_dict(gp.to_dict()) == gp
    with pytest.raises(ValueError, match="fault_at"):
        gang.GangParams(fault_at=(0.5, 1.0))


# FleetYield arm, as the docker cluster records it: the attempt the fault hit is REQUEUED by the controller
# a second later, the next one starts 12 s after the fault on the three other nodes.
FY_SACCT = """JobID|State|ExitCode|Submit|Start|End|NodeList
2|REQUEUED|0:0|2026-01-01T00:00:00|2026-01-01T00:00:01|2026-01-01T00:00:26|gpu-h100-1,gpu-l40s-[1-2]
2|COMPLETED|0:0|2026-01-01T00:00:26|2026-01-01T00:00:38|2026-01-01T00:01:30|gpu-h100-[1-2],gpu-l40s-1
"""
# bare arm: the gang hangs to its timeout (60 s), the NHC emulation requeues it (sacct then shows the failed
# attempt as REQUEUED, End = the requeue); it lands on the dead node once before NHC drained it
BARE_SACCT = """JobID|State|ExitCode|Submit|Start|End|NodeList
7|REQUEUED|86:0|2026-01-01T00:00:00|2026-01-01T00:00:01|2026-01-01T00:01:28|gpu-h100-1,gpu-l40s-[1-2]
7|REQUEUED|86:0|2026-01-01T00:01:28|2026-01-01T00:01:40|2026-01-01T00:02:45|gpu-h100-1,gpu-l40s-[1-2]
7|COMPLETED|0:0|2026-01-01T00:02:45|2026-01-01T00:02:57|2026-01-01T00:04:00|gpu-h100-[1-2],gpu-l40s-1
"""


def _t(s: str) -> float:
    return gang.attempts(f"JobID|Start|End|State|NodeList\n1|{s}|{s}|X|n\n", "1")[0].start


def test_fast_requeue_recovery_and_progress_lost_from_sacct_and_the_job_logs():
    t0 = _t("2026-01-01T00:00:01")
    fault = t0 + 24.4
    steps = "\n".join(f"{t0 + 0.2 + i:.3f} {i}" for i in range(1, 25)) + f"\n{t0 + 40:.3f} 16\n"
    events = f"{t0 + 0.1:.3f} start 0 0 a b c\n{t0 + 38.5:.3f} start 15 1 d e f\n"
    (r,) = gang.recoveries(FY_SACCT, "2", steps, events, [("gpu-l40s-2", fault)], {"gpu-l40s-2": fault + 1.5})
    assert r.hit and r.attempt_state == "REQUEUED" and not r.hung and not r.timed_out
    assert r.work_at_fault_s == 24 and r.resumed_from_s == 15 and r.lost_s == 9
    assert r.recovery_s == pytest.approx(37 - 24.4, abs=0.01) and r.relanded == 0
    assert r.stalled_s == pytest.approx(25 - 24.4, abs=0.01)  # fault to the requeue (sacct's End)
    assert r.drained_s == 1.5
    assert gang.wall_s(FY_SACCT, "2") == 89.0


def test_a_hang_to_the_timeout_and_a_relanding_on_the_dead_node_count_against_the_recovery():
    t0 = _t("2026-01-01T00:00:01")
    fault = t0 + 20.0
    steps = "\n".join(f"{t0 + 0.5 + i:.3f} {i}" for i in range(1, 20))
    events = (
        f"{t0 + 0.2:.3f} start 0 0 a b c\n{fault + 0.6:.3f} hang 19 gpu-l40s-2 6 79\n"
        f"{fault + 60.3:.3f} timeout 19 gpu-l40s-2\n"
        f"{t0 + 99.5:.3f} start 10 1 a b c\n{t0 + 99.6:.3f} hang 10 gpu-l40s-2 6 79\n"
        f"{t0 + 159.7:.3f} timeout 10 gpu-l40s-2\n{t0 + 176.4:.3f} start 10 2 d e f\n"
    )
    (r,) = gang.recoveries(BARE_SACCT, "7", steps, events, [("gpu-l40s-2", fault)], {})
    assert r.hung and r.timed_out and r.stalled_s == 60.3  # the job's timeout, not sacct's End (requeue)
    assert r.relanded == 1 and r.recovery_s == pytest.approx(176 - 20, abs=0.01)
    assert r.work_at_fault_s == 19 and r.resumed_from_s == 10 and r.lost_s == 9 and r.drained_s is None


def test_a_fault_on_a_node_outside_the_gang_hits_nothing():
    t0 = _t("2026-01-01T00:00:01")
    (r,) = gang.recoveries(FY_SACCT, "2", "", "", [("gpu-h100-2", t0 + 5)], {"gpu-h100-2": t0 + 3})
    assert not r.hit and r.recovery_s is None and r.lost_s is None and r.drained_s is None


def test_never_running_again_leaves_the_recovery_open():
    sacct = FY_SACCT.splitlines()[:2]
    t0 = _t("2026-01-01T00:00:01")
    (r,) = gang.recoveries("\n".join(sacct), "2", "", "", [("gpu-l40s-1", t0 + 10)])
    assert r.hit and r.recovery_s is None and r.lost_s is None and gang.wall_s("\n".join(sacct), "2") is None


def test_driver_commands_submit_a_requeueable_exclusive_gang_and_record_then_inject_the_fault():
    gp = gang.GangParams()
    p = gang.plan(0, gp)
    sub = " ".join(gang_ab.submit_command("gang-bare-s0", gp))
    parts = (
        "-N3",
        "--exclusive",
        "--gres=gpu:8",
        "--requeue",
        "--comment=fy:pretrain",
        "FY_GANG=1",
        "FY_COLLECTIVE_TIMEOUT_S=60",
        "FY_FAULT_DIR=/shared/fy-chaos/runs/gang-bare-s0/faults",
    )
    for part in parts:
        assert part in sub, part
    record, inject = gang_ab.fault_commands("t", "gpu-l40s-1", p)
    assert record[2] == "slurmctld" and "mv /shared/fy-chaos/runs/t/faults/gpu-l40s-1.tmp" in record[-1]
    assert inject[2] == "gpu-l40s-1" and inject[-4:] == ("--gpu", str(p.gpu), "--xid", str(p.xid))
    nhc = [c for c in gang_ab.setup_commands("t", gp, p) if "nhc-gang.sh" in " ".join(c) and "-d" in c]
    assert nhc and nhc[0][-3:] == ("30", f"{p.nhc_phase_s:g}", "/shared/fy-chaos/runs/t/nhc.log")


# ---- the job script in gang mode, under a fake scontrol -----------------------------------------------


def _fake_scontrol(tmp: Path, boot: str = "2020-01-01T00:00:00") -> Path:
    f = tmp / "scontrol"
    f.write_text(
        "#!/bin/sh\n"
        'case "$1 $2" in\n'
        '  "show hostnames") echo gpu-a; echo gpu-b; echo gpu-c ;;\n'
        f'  "show node") echo "NodeName=$3 State=ALLOCATED BootTime={boot} SlurmdStartTime=x" ;;\n'
        f'  *) echo "$@" >> {tmp}/scontrol.log ;;\n'
        "esac\n"
    )
    f.chmod(0o755)
    return f


def _start(tmp: Path, scontrol: Path, work: int = 60) -> subprocess.Popen[str]:
    env = {
        "PATH": os.environ["PATH"], "SLURM_JOB_ID": "51", "SLURM_JOB_NODELIST": "gpu-[a-c]",
        "FY_GANG": "1", "FY_STEP_S": "1", "FY_WORK_S": str(work), "FY_CKPT_S": "1",
        "FY_COLLECTIVE_TIMEOUT_S": "2", "FY_PROGRESS_DIR": str(tmp / "prog"),
        "FY_CKPT_DIR": str(tmp / "ckpt"), "FY_FATAL_FILE": str(tmp / "fatal.json"),
        "FY_FAULT_DIR": str(tmp / "faults"), "FY_SCONTROL": str(scontrol),
    }  # fmt: skip
    (tmp / "faults").mkdir(exist_ok=True)
    return subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def _wait_for(cond, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _steps(tmp: Path) -> list[str]:
    f = tmp / "prog" / "51.steps"
    return f.read_text().splitlines() if f.exists() else []


def test_gang_job_hangs_on_a_dead_gpu_anywhere_in_its_allocation_then_fails_at_the_collective_timeout(
    tmp_path: Path,
):
    p = _start(tmp_path, _fake_scontrol(tmp_path))
    try:
        _wait_for(lambda: len(_steps(tmp_path)) >= 2, "no steps")
        # a dead GPU on a node outside the allocation changes nothing; the local fatal marker neither (gang
        # mode: the hang, not the marker, is what stops a gang)
        (tmp_path / "faults" / "gpu-z").write_text(f"{time.time():.6f} 1 79\n")
        (tmp_path / "fatal.json").write_text('{"pending": [{"gpu": null, "xid": 79}]}')
        n = len(_steps(tmp_path))
        _wait_for(lambda: len(_steps(tmp_path)) >= n + 2, "stopped on a fault outside the gang")
        fault_t = time.time()
        (tmp_path / "faults" / "gpu-c.tmp").write_text(f"{fault_t:.6f} 6 48\n")
        (tmp_path / "faults" / "gpu-c.tmp").rename(tmp_path / "faults" / "gpu-c")
        rc = p.wait(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
    _, err = p.communicate()
    assert rc == 86 and "collective hung" in err and "collective timeout" in err
    assert max(float(s.split()[0]) for s in _steps(tmp_path)) <= fault_t + 1.5  # at most the step in flight
    kinds = [ln.split()[1] for ln in (tmp_path / "prog" / "51.events").read_text().splitlines()]
    assert kinds == ["start", "hang", "timeout"]
    timeout_t = float((tmp_path / "prog" / "51.events").read_text().splitlines()[-1].split()[0])
    assert fault_t + 2 <= timeout_t <= fault_t + 4
    # requeued onto the same nodes, the node still dead (never rebooted): it hangs from its start
    p = _start(tmp_path, _fake_scontrol(tmp_path))
    assert p.wait(timeout=15) == 86
    out = (tmp_path / "prog" / "51.events").read_text().splitlines()
    assert [ln.split()[1] for ln in out[-3:]] == ["start", "hang", "timeout"]
    assert out[-3].split()[2] == out[-2].split()[2]  # no step between its start and the hang


def test_a_node_rebooted_since_its_fault_is_repaired(tmp_path: Path):
    (tmp_path / "faults").mkdir()
    (tmp_path / "faults" / "gpu-b").write_text(f"{time.time() - 100:.6f} 2 79\n")
    later = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 50))
    p = _start(tmp_path, _fake_scontrol(tmp_path, boot=later), work=3)
    assert p.wait(timeout=15) == 0
    kinds = [ln.split()[1] for ln in (tmp_path / "prog" / "51.events").read_text().splitlines()]
    assert kinds == ["start", "done"] and len(_steps(tmp_path)) == 3
