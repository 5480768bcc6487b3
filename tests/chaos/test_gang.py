"""The gang A/B's plan and ledger (chaos/gang.py), the job script's gang mode, the driver's commands."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_fleetyield.chaos import ab, gang, gang_ab
from slurm_fleetyield.chaos.gang_ab import POLL_S
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
    assert r.drained_s == 1.5 and r.requeued_s == 0.6  # sacct's End of the REQUEUED attempt
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
    assert r.requeued_s == 67.0  # the NHC emulation's requeue after the timeout


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


# ---- the driver on a fake cluster (virtual clock) -----------------------------------------------------


class GangFake:
    """exec for ``run_gang_arm``: prepare/reset answered as a quiet cluster; the gang runs on the three
    lightest nodes from its submit; ``fy``: the faulted node is drained 0.5 s after the XID and the gang
    requeued 1 s after it, running again 12 s later on the other three; else (bare) the gang FAILS at the
    collective timeout and nobody requeues it. ``never_ends``: the gang runs past any deadline."""

    NODES = ("gpu-h100-1", "gpu-h100-2", "gpu-l40s-1", "gpu-l40s-2")

    def __init__(self, fy: bool, never_ends: bool = False) -> None:
        self.t = 2_000_000_000.0
        self.fy, self.never_ends = fy, never_ends
        self.calls: list[tuple[str, ...]] = []
        self.submitted: float | None = None
        self.fault_t: float | None = None
        self.fault_node = ""
        self.cancelled = False

    def _attempts(self) -> list[tuple[float, float, str, tuple[str, ...]]]:
        assert self.submitted is not None
        first = ("gpu-h100-1", "gpu-l40s-1", "gpu-l40s-2")
        s0 = self.submitted + 2.0
        long = 1e9 if self.never_ends else 120.0
        if self.fault_t is None:
            return [(s0, s0 + long, "RUNNING", first)]
        if not self.fy:
            return [(s0, self.fault_t + 60.0, "FAILED", first)]
        others = tuple(n for n in self.NODES if n != self.fault_node)
        s1 = self.fault_t + 13.0
        return [(s0, self.fault_t + 1.0, "REQUEUED", first), (s1, s1 + long, "COMPLETED", others)]

    def exec(self, argv):  # type: ignore[no-untyped-def]
        argv = tuple(argv)
        self.calls.append(argv)
        text = " ".join(argv)
        if "sbatch" in argv:
            self.submitted = self.t
            return 0, "77"
        if argv[:2] == ("docker", "inspect"):
            return 0, "true"
        if "EPOCHREALTIME" in text:
            self.fault_node = text.split("/faults/")[1].split(".tmp")[0]
            self.fault_t = self.t
            return 0, f"{self.t:.6f}"
        if "fault" in argv and "inject" in argv:
            assert self.fault_t is not None, "the XID went in before the fault record"
            return 0, "{}"
        if argv[-3:-1] == ("job", "77"):
            if self.cancelled:
                return 0, "JobId=77 JobState=CANCELLED Reason=None NodeList=x"
            for start, end, state, nodes in reversed(self._attempts()):
                if start <= self.t:
                    st = state if self.t >= end else "RUNNING"
                    st = "PENDING" if st == "REQUEUED" else st
                    return 0, f"JobId=77 JobState={st} Reason=None NodeList={','.join(nodes)}"
            return 0, "JobId=77 JobState=PENDING Reason=BeginTime NodeList=(null)"
        if "show" in argv and "node" in argv:
            drained = self.fy and self.fault_t is not None and self.t >= self.fault_t + 0.5
            conf = ab.slurm_conf_nodes()  # bare: slurm.conf's; fleetyield: labelled green
            feats = {n: "x,fy_tier_green" if self.fy else conf[n]["features"] for n in self.NODES}
            weight = {n: "1" if self.fy else conf[n]["weight"] for n in self.NODES}
            return 0, "\n".join(
                f"NodeName={n} State={'IDLE+DRAIN' if drained and n == self.fault_node else 'IDLE'} "
                f"AvailableFeatures={feats[n]} ActiveFeatures={feats[n]} Weight={weight[n]}"
                for n in self.NODES
            )
        if "scancel" in argv and "77" in argv:
            self.cancelled = True
        if "squeue" in argv:
            return 0, ""
        if "sacct" in argv:
            iso = lambda x: time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(x))  # noqa: E731
            rows = ["JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Comment"]
            for start, end, state, nodes in self._attempts():
                st = "CANCELLED" if self.cancelled else state
                rows.append(
                    f"77|{st}|0:0|{iso(start)}|{iso(start)}|{iso(end)}|{','.join(nodes)}|gres/gpu=24|"
                )
            return 0, "\n".join(rows)
        if "77.events" in text:
            return 0, "\n".join(
                f"{s + 0.3:.3f} start 0 {i} a b c" for i, (s, *_) in enumerate(self._attempts())
            )
        return 0, ""

    def sleep(self, s: float) -> None:
        self.t += s


def test_driver_faults_the_planned_node_after_the_gang_runs_and_reads_the_fast_requeue(tmp_path: Path):
    fc = GangFake(fy=True)
    gp = gang.GangParams()
    p = gang.plan(0, gp)
    res = gang_ab.run_gang_arm(p, gp, "fleetyield", fc.exec, tmp_path, lambda: fc.t, fc.sleep)
    assert fc.submitted is not None and fc.fault_t is not None
    assert fc.fault_t - (fc.submitted + 2.0) == pytest.approx(p.fault_after_s, abs=POLL_S + 0.01)
    assert res["fault_node"] == sorted(res["nodes"])[p.node_index] == fc.fault_node
    (r,) = res["recoveries"]
    assert r["hit"] and r["drained_s"] is not None and r["drained_s"] <= 1.0 + POLL_S
    assert r["recovery_s"] == pytest.approx(13.0, abs=1.0) and not res["unfinished"]
    assert res["wall_s"] is not None and res["attempts"] == 2
    text = [" ".join(c) for c in fc.calls]
    assert any("nhc-gang.sh" in c for c in text[: text.index(next(c for c in text if "sbatch" in c))])
    # the gang A/B's own NHC, not the job-failure one (which drains every node of a failed job)
    assert not any("nhc-drain.sh" in c and " -d " in c for c in text)


def test_driver_stops_on_a_failed_gang_nobody_requeues_and_cancels_one_past_the_deadline(tmp_path: Path):
    fc = GangFake(fy=False)
    gp = gang.GangParams()
    res = gang_ab.run_gang_arm(gang.plan(0, gp), gp, "bare", fc.exec, tmp_path, lambda: fc.t, fc.sleep)
    (r,) = res["recoveries"]
    assert r["hit"] and r["recovery_s"] is None and not res["unfinished"] and not fc.cancelled
    assert fc.t >= fc.fault_t + 60.0 + gang_ab.FAILED_GRACE_S  # type: ignore[operator]
    fc = GangFake(fy=True, never_ends=True)
    res = gang_ab.run_gang_arm(
        gang.plan(0, gp), gp, "fleetyield", fc.exec, tmp_path, lambda: fc.t, fc.sleep, deadline_s=200.0
    )
    assert res["unfinished"] and fc.cancelled and fc.t <= fc.submitted + 200.0 + 2 * POLL_S  # type: ignore[operator]


def test_resettle_rebuilds_the_summary_from_the_logs_alone(tmp_path: Path):
    gp = gang.GangParams()
    p = gang.plan(0, gp)
    ran = {}
    for arm, fy in (("bare", False), ("fleetyield", True)):
        fc = GangFake(fy=fy)
        ran[arm] = gang_ab._arm_summary(
            gang_ab.run_gang_arm(p, gp, arm, fc.exec, tmp_path, lambda fc=fc: fc.t, fc.sleep)
        )
    (tmp_path / "ab-gang.json").write_text(
        '{"seeds": [0], "arms": {"bare": {}, "fleetyield": {}}, "command": "c"}'
    )
    summary = gang_ab.resettle(tmp_path)
    assert summary["arms"] == {a: {"0": ran[a]} for a in ran} and summary["command"] == "c"
    assert summary["resettled_at"]  # the commit whose ledger settled it
    assert summary["arms"]["fleetyield"]["0"]["recoveries"][0]["requeued_s"] is not None
    assert summary["arms"]["bare"]["0"]["recoveries"][0]["requeued_s"] is None  # failed, nobody requeued it
