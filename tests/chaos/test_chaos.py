"""Chaos service without a cluster: timelines, log/replay, the job script, the ledger from sacct text."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from slurm_fleetyield.chaos import ab, ledger
from slurm_fleetyield.chaos import log as chaos_log
from slurm_fleetyield.chaos.log import ChaosLog
from slurm_fleetyield.chaos.runner import ChaosRunner, command
from slurm_fleetyield.chaos.timeline import Timeline, TimelineParams, generate

SCRIPT = Path(__file__).parents[2] / "contrib" / "chaos" / "fy-train-job.sh"


def test_same_seed_same_timeline_other_seed_differs():
    a, b = generate(7), generate(7)
    assert a == b and json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    assert generate(8) != a
    kinds = {e.kind for e in a.events}
    assert kinds == {"submit", "fault"}
    assert [e.at_s for e in a.events] == sorted(e.at_s for e in a.events)
    assert {e.workload for e in generate(1, TimelineParams(jobs=200)).events if e.kind == "submit"} == {
        "decode", "pretrain", "finetune", "batch"
    }  # fmt: skip


class FakeCluster:
    """exec for the driver's unit tests, on a virtual clock advanced by sleep: sbatch answers increasing job
    ids and each job runs ``job_s``; squeue/sacct/scontrol answer from that; the controller's restart labels
    every node green; ``held``: job ids that squeue shows held until released."""

    def __init__(self, job_s: float = 30.0, held: tuple[int, ...] = ()) -> None:
        self.t = 1_000.0
        self.calls: list[tuple[str, ...]] = []
        self.next_id = 100
        self.job_s = job_s
        self.jobs: dict[int, float] = {}  # id -> end
        self.held = set(held)
        self.cancelled: set[int] = set()
        self.nodes = {
            n: {"State": "IDLE+DRAIN", "AvailableFeatures": "h100,fy_tier_green", "Weight": "1100"}
            for n in ab.PREMIUM_NODES | {"gpu-l40s-1", "gpu-l40s-2"}
        }

    def _update(self, argv) -> None:  # type: ignore[no-untyped-def]
        kv = dict(a.split("=", 1) for a in argv if "=" in a)
        for n in kv["NodeName"].split(","):
            if kv.get("State") == "RESUME":
                self.nodes[n]["State"] = "IDLE"
            if "AvailableFeatures" in kv:
                self.nodes[n]["AvailableFeatures"] = kv["AvailableFeatures"]
            if "Weight" in kv:
                self.nodes[n]["Weight"] = kv["Weight"]

    def exec(self, argv):  # type: ignore[no-untyped-def]
        argv = tuple(argv)
        self.calls.append(argv)
        if "sbatch" in argv:
            self.next_id += 1
            self.jobs[self.next_id] = self.t + self.job_s
            return 0, str(self.next_id)
        if argv[:2] == ("docker", "inspect"):
            return 0, "true"
        if "show" in argv and "node" in argv:
            return 0, "\n".join(
                f"NodeName={n} State={f['State']} AvailableFeatures={f['AvailableFeatures']} "
                f"ActiveFeatures={f['AvailableFeatures']} Weight={f['Weight']} Reason=a b"
                for n, f in sorted(self.nodes.items())
            )
        if "update" in argv:
            self._update(argv)
        if "restart" in argv and "controller" in argv:
            for f in self.nodes.values():
                f["AvailableFeatures"] = "x,fy_tier_green"
        if "release" in argv:
            self.held.discard(int(argv[-1]))
        if "scancel" in argv:
            for j in argv[argv.index("scancel") + 1 :]:
                self.cancelled.add(int(j))
        if "squeue" in argv:
            for j in self.held & set(self.jobs):  # a held job does not run
                self.jobs[j] = max(self.jobs[j], self.t + self.job_s)
            live = [j for j, end in self.jobs.items() if end > self.t and j not in self.cancelled]
            return 0, "\n".join(
                f"{j}|PENDING|launch_failed_requeued_held" if j in self.held else f"{j}|RUNNING|None"
                for j in live
            )
        if "sacct" in argv:
            rows = [ledger.SACCT_FIELDS.replace(",", "|")]
            for j, end in self.jobs.items():
                st = "CANCELLED" if j in self.cancelled else "COMPLETED"
                rows.append(f"{j}|{st}|0:0|{end - 60}|{end - 30}|{end}|gpu-l40s-1|gres/gpu=1|fy:batch")
            return 0, "\n".join(rows)
        return 0, ""

    def sleep(self, s: float) -> None:
        self.t += s


def test_log_round_trip_and_replay_executes_the_same_commands(tmp_path: Path):
    tl = generate(3, TimelineParams(jobs=6, faults=2, implants=1))
    runs = []
    for name in ("first", "replay"):
        fc = FakeCluster()
        path = tmp_path / f"{name}.jsonl"
        with open(path, "w") as fh:
            log = ChaosLog(fh)
            src = tl if name == "first" else chaos_log.read(tmp_path / "first.jsonl")[0]
            log.header(src, "fleetyield", "test", fc.t)
            ChaosRunner(src, fc.exec, lambda fc=fc: fc.t, fc.sleep, log, "x").run()
        runs.append(fc.calls)
        read_tl, recs = chaos_log.read(path)
        assert read_tl == tl
        actions = [r for r in recs if r["type"] == "action"]
        assert [a["ref"] for a in actions] == [e.ref for e in tl.events]
        assert all(a["offset_s"] == e.at_s for a, e in zip(actions, tl.events, strict=True))  # virtual clock
    assert runs[0] == runs[1]


def test_commands_carry_class_requeue_and_fault():
    tl = generate(0, TimelineParams(jobs=20, faults=1))
    sub = next(e for e in tl.events if e.kind == "submit" and e.workload == "decode")
    argv = command(sub, "t")
    assert "--comment=fy:decode" in argv and "--no-requeue" in argv
    f = next(e for e in tl.events if e.kind == "fault")
    assert command(f, "t")[:5] == ("docker", "exec", f.node, "fleetyield-agent", "fault")


def test_precursors_precede_their_fault_on_its_gpu_and_move_nothing_else():
    tp = TimelineParams.for_duration(240, jobs=10, faults=6)
    plain = generate(4, tp)
    assert not any(e.kind == "precursor" for e in plain.events)
    every = generate(4, TimelineParams.for_duration(240, jobs=10, faults=6, precursor_share=1.0))
    half = generate(4, TimelineParams.for_duration(240, jobs=10, faults=6, precursor_share=0.5))
    for tl in (every, half):  # the jobs and faults of the seed stay where they were
        assert tuple(e for e in tl.events if e.kind != "precursor") == plain.events
        assert [e.at_s for e in tl.events] == sorted(e.at_s for e in tl.events)
    faults = {e.ref[1:]: e for e in plain.events if e.kind == "fault"}
    pre = [e for e in every.events if e.kind == "precursor"]
    assert len(pre) == len(faults) == 6
    lo, hi = every.params.precursor_lead_s
    assert (lo, hi) == (24.0, 60.0) and every.params.precursor_rate == 1.125  # the 1,800 s shape, scaled
    for p in pre:
        f = faults[p.ref[1:]]
        assert (p.node, p.gpu) == (f.node, f.gpu) and p.rate == 1.125
        assert p.at_s == 0.0 or lo - 0.1 <= f.at_s - p.at_s <= hi + 0.1, (p, f)
    assert 0 < sum(e.kind == "precursor" for e in half.events) < 6
    argv = command(pre[0], "t")
    assert argv[3:6] == ("fleetyield-agent", "fault", "degrade") and argv[2] == pre[0].node
    assert argv[argv.index("--gpu") + 1] == str(pre[0].gpu) and argv[argv.index("--mode") + 1] == "ecc"
    assert argv[argv.index("--rate") + 1] == "1.125"
    # A log written before precursors existed still reads (its params lack the precursor fields).
    old = plain.to_dict()
    for k in ("precursor_share", "precursor_lead_s", "precursor_rate"):
        del old["params"][k]
    for e in old["events"]:
        del e["rate"]
    back = Timeline.from_dict(old)
    assert back.events == plain.events and back.params.precursor_share == 0.0
    for bad in ({"precursor_share": 1.5}, {"precursor_share": -0.1}, {"precursor_lead_s": (0.0, 5.0)},
                {"precursor_lead_s": (9.0, 5.0)}, {"precursor_rate": 0.0}):  # fmt: skip
        try:
            TimelineParams(**bad)  # type: ignore[arg-type]
        except ValueError as exc:
            assert "precursor" in str(exc)
            continue
        raise AssertionError(f"{bad} accepted")


def _job(tmp: Path, job: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": job,
        "FY_STEP_S": "1",
        "FY_PROGRESS_DIR": str(tmp / "prog"),
        "FY_CKPT_DIR": str(tmp / "ckpt"),
        "FY_FATAL_FILE": str(tmp / "fatal.json"),
        "SLURM_JOB_GPUS": "2,3",
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], env={**base, **env}, capture_output=True, text=True, timeout=30
    )


def test_job_script_checkpoints_crashes_on_its_gpu_fault_and_resumes(tmp_path: Path):
    # a fault on another GPU of the node does not concern the job
    (tmp_path / "fatal.json").write_text(json.dumps({"pending": [{"gpu": 5, "xid": 79}]}))
    p = _job(tmp_path, "41", {"FY_WORK_S": "2", "FY_CKPT_S": "1"})
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ckpt" / "41").read_text().strip().isdigit()
    assert (tmp_path / "prog" / "41").read_text().split()[2] == "done"
    # progress at a checkpoint, then its GPU faults: exit 86; the requeued run resumes from the checkpoint
    (tmp_path / "prog" / "42").parent.mkdir(exist_ok=True)
    (tmp_path / "prog" / "42").write_text("2 0 running\n")
    (tmp_path / "fatal.json").write_text(json.dumps({"pending": [{"gpu": 3, "xid": 79}]}))
    p = _job(tmp_path, "42", {"FY_WORK_S": "4", "FY_CKPT_S": "1"})
    assert p.returncode == 86 and "GPU fault" in p.stderr
    assert "resuming at 2s" in p.stdout
    (tmp_path / "fatal.json").unlink()
    p = _job(tmp_path, "42", {"FY_WORK_S": "4", "FY_CKPT_S": "1"})
    assert p.returncode == 0 and "resuming at 2s" in p.stdout


SACCT = """JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Comment
101|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T00:00:10|2026-01-01T00:10:10|gpu-l40s-1|cpu=1,gres/gpu=2,node=1|fy:decode
102|REQUEUED|0:0|2026-01-01T00:00:00|2026-01-01T00:00:10|2026-01-01T00:05:10|gpu-h100-1|cpu=1,gres/gpu=8,node=1|fy:pretrain
102|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T00:06:00|2026-01-01T00:09:00|gpu-h100-2|cpu=1,gres/gpu=8,node=1|fy:pretrain
103|COMPLETED|0:0|2026-01-01T00:01:00|2026-01-01T00:06:00|2026-01-01T00:07:00|gpu-h100-1|cpu=1,gres/gpu=1,node=1|fy:batch
104|FAILED|86:0|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T00:05:00|gpu-h100-1|cpu=1,gres/gpu=2,node=1|fy:decode
"""


def test_ledger_from_recorded_sacct_uses_core_settle():
    from datetime import datetime

    t = lambda s: datetime.fromisoformat(f"2026-01-01T{s}").timestamp()  # noqa: E731
    fault = ("gpu-h100-1", t("00:05:00"))
    records = [{"job_id": "102", "last_checkpoint": t("00:04:10")}]
    entries, tot = ledger.ledger(SACCT, records, [fault], ab.PREMIUM_NODES)
    by = {(e.job_id, e.state): e for e in entries}
    assert by[(101, "COMPLETED")].useful_gpu_s == 2 * 600
    first = by[(102, "REQUEUED")]
    assert first.cause == "hardware" and first.useful_gpu_s == 8 * 240 and first.wasted_gpu_s == 8 * 60
    assert by[(104, "FAILED")].cause == "hardware" and by[(104, "FAILED")].wasted_gpu_s == 2 * 240
    # batch on premium while pretrain 102 was pending (00:00:00-00:00:10 and, requeued, until 00:06:00)
    assert by[(103, "COMPLETED")].premium_misuse_gpu_s == 0.0  # started 00:06:00: 102 was running
    assert tot["hardware_failures"] == 2 and tot["jobs"] == 5
    assert ab.table({a: {"0": tot} for a in ab.ARMS}, [0]).startswith("A/B on the docker cluster: MEASURED")


def test_a_requeue_by_premium_reclaim_is_wasted_work_but_no_hardware_failure():
    from datetime import datetime

    t = lambda s: datetime.fromisoformat(f"2026-01-01T{s}").timestamp()  # noqa: E731
    fault = ("gpu-h100-1", t("00:05:30"))  # an unrelated fault 20 s after the requeue, within fatal_slack_s
    records = [{"job_id": "102", "last_checkpoint": t("00:04:10")}]
    events = json.dumps(
        [
            {"kind": "reclaim", "time": t("00:05:09.6"), "node": "gpu-h100-1", "data": {"jobs": [102]}},
            {"kind": "reclaim", "time": "bad", "data": {"jobs": [7]}},
            {"kind": "tier_change", "time": 1.0, "data": {}},
        ]
    )
    reclaimed = ledger.reclaim_requeues(events)
    assert reclaimed == [(102, t("00:05:09.6"))] and ledger.reclaim_requeues("not json") == []
    junk = '["x", 3, {"kind": "reclaim"}, {"kind": "reclaim", "time": 1.0, "data": {"jobs": 7}}]'
    assert ledger.reclaim_requeues(junk) == []  # unreadable entries are skipped, never raise
    entries, tot = ledger.ledger(SACCT, records, [fault], ab.PREMIUM_NODES, reclaimed=reclaimed)
    first = {(e.job_id, e.state): e for e in entries}[(102, "REQUEUED")]
    assert first.cause == "reclaimed" and not first.failure
    assert first.useful_gpu_s == 8 * 240 and first.wasted_gpu_s == 8 * 60  # progress past the checkpoint
    assert tot["reclaimed"] == 1 and tot["hardware_failures"] == 1  # 104 still died of its GPU fault
    _, without = ledger.ledger(SACCT, records, [fault], ab.PREMIUM_NODES)
    assert without["hardware_failures"] == 2 and without["reclaimed"] == 0


SACCT_TWO_WAITING = """JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Comment
201|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T00:05:00|2026-01-01T00:06:00|gpu-h100-2|cpu=1,gres/gpu=8,node=1|fy:pretrain
202|COMPLETED|0:0|2026-01-01T00:00:30|2026-01-01T00:07:00|2026-01-01T00:08:00|gpu-h100-2|cpu=1,gres/gpu=8,node=1|fy:finetune
203|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T00:03:00|gpu-h100-1|cpu=1,gres/gpu=4,node=1|fy:batch
"""


def test_premium_misuse_counts_a_gpu_second_once_however_many_jobs_wait():
    # batch 203 holds 4 h100 GPUs 00:01-00:03 while BOTH 201 and 202 are pending: 4 x 120 s, not twice that
    entries, tot = ledger.ledger(SACCT_TWO_WAITING, [], [], ab.PREMIUM_NODES)
    by = {e.job_id: e for e in entries}
    assert by[203].premium_misuse_gpu_s == 4 * 120
    assert tot["premium_misuse_gpu_s"] == 4 * 120
    assert ledger.union([(0.0, 10.0), (5.0, 20.0), (30.0, None), (40.0, 50.0)]) == ((0.0, 20.0), (30.0, None))
    assert ledger.union([(3.0, 4.0), (0.0, 1.0)]) == ((0.0, 1.0), (3.0, 4.0))


def test_arm_setup_bare_disables_and_emulates_nhc_fleetyield_enables():
    bare = [" ".join(c) for c in ab.setup_commands("bare", ("gpu-h100-1",))]
    assert any("touch /etc/slurm/fleetyield.disabled" in c for c in bare)
    assert any("nhc-drain.sh" in c and "-d" in c for c in bare)
    # slurm.conf's own features and weight, and a Prolog that consults neither controller nor fatal marker
    assert any("AvailableFeatures=h100,nvlink" in c and "Weight=10" in c for c in bare)
    assert any("controller_url =" in c and ab.HOOKS_ORIG in c for c in bare)
    assert not any("pkill" in c or "killall" in c for c in bare)
    fy = [" ".join(c) for c in ab.setup_commands("fleetyield", ("gpu-h100-1",))]
    assert any("rm -f /etc/slurm/fleetyield.disabled" in c for c in fy)
    assert any("controller restart --wipe" in c for c in fy)  # no state carried over between arms
    assert any(f"mv -f {ab.HOOKS_ORIG} {ab.HOOKS_CONF}" in c for c in fy)
    try:
        ab.setup_commands("nope", ("gpu-h100-1",))
    except ValueError as exc:
        assert "unknown arm" in str(exc)
    else:
        raise AssertionError("an unknown arm was accepted")


def test_slurm_conf_nodes_and_node_info():
    conf = ab.slurm_conf_nodes()
    assert conf["gpu-h100-2"] == {"features": "h100,nvlink", "weight": "10"}
    assert conf["gpu-l40s-1"] == {"features": "l40s", "weight": "1"}
    info = ab.node_info("NodeName=a Arch=x State=IDLE+DRAIN AvailableFeatures=h100,fy_ok_batch Reason=x y z")
    assert info["a"]["State"] == "IDLE+DRAIN" and ab.has_fy_feature(info["a"])
    assert not ab.has_fy_feature({"AvailableFeatures": "h100,nvlink", "ActiveFeatures": "h100"})


def test_run_arm_on_a_fake_cluster_writes_log_and_result(tmp_path: Path):
    fc = FakeCluster()
    tl = generate(1, TimelineParams(jobs=3, faults=1, duration_s=60))
    res = ab.run_arm(tl, "bare", fc.exec, tmp_path, lambda: fc.t, fc.sleep, drain_timeout_s=60)
    assert res["type"] == "result" and set(res["job_ids"]) == {e.ref for e in tl.events if e.kind == "submit"}
    assert res["totals"]["completed"] == 3 and res["totals"]["unfinished"] == 0
    assert res["totals"]["refused"] == 0  # every sbatch returned a job id
    tl2, recs = chaos_log.read(tmp_path / "chaos-bare-s1.jsonl")
    assert tl2 == tl and recs[-1]["type"] == "result"
    assert isinstance(Timeline.from_dict(tl.to_dict()), Timeline)
    # the bare arm ran on slurm.conf's features and weights: the log shows the nodes as the run started
    nodes = next(r for r in recs if r["type"] == "nodes")["nodes"]
    assert nodes["gpu-h100-1"] == {"State": "IDLE", "AvailableFeatures": "h100,nvlink", "Weight": "10"}
    # reset came first: controller stopped, agents wiped (fresh fake GPUs), drained nodes resumed
    text = [" ".join(c) for c in fc.calls]
    first_sbatch = next(i for i, c in enumerate(text) if "sbatch" in c)
    for what in ("controller stop", "agent restart --wipe", "State=RESUME"):
        assert any(what in c for c in text[:first_sbatch]), what


def test_fleetyield_arm_waits_for_labels_releases_held_jobs_and_cancels_at_the_deadline(tmp_path: Path):
    fc = FakeCluster(job_s=30.0, held=(101,))
    tl = generate(2, TimelineParams(jobs=2, faults=0, duration_s=60))
    res = ab.run_arm(tl, "fleetyield", fc.exec, tmp_path, lambda: fc.t, fc.sleep, drain_timeout_s=120)
    recs = list(chaos_log.records(tmp_path / "chaos-fleetyield-s2.jsonl"))
    assert any(r["type"] == "wait" and "labelling" in r["what"] for r in recs)
    assert any(r["type"] == "operator_release" and r["command"][-1] == "101" for r in recs)
    assert res["unfinished"] == [] and res["totals"]["completed"] == 2
    # a job that never ends is cancelled at the deadline and counted as it stands
    fc = FakeCluster(job_s=10_000.0)
    res = ab.run_arm(tl, "fleetyield", fc.exec, tmp_path, lambda: fc.t, fc.sleep, drain_timeout_s=30)
    assert res["unfinished"] == ["101", "102"] and res["totals"]["unfinished"] == 2
    assert fc.cancelled == {101, 102}


def test_ab_restores_the_cluster_even_when_an_arm_fails(tmp_path: Path):
    fc = FakeCluster()
    real = fc.exec

    def broken(argv):  # type: ignore[no-untyped-def]
        if "nhc-drain.sh" in " ".join(argv) and "-d" in argv:
            fc.calls.append(tuple(argv))
            return 1, "boom"
        return real(argv)

    try:
        ab.ab([0], broken, tmp_path, TimelineParams(jobs=1, faults=0, duration_s=30), lambda: fc.t, fc.sleep)
    except ab.ChaosError as exc:
        assert "boom" in str(exc)
    else:
        raise AssertionError("a failed setup command was ignored")
    text = [" ".join(c) for c in fc.calls]
    last = max(i for i, c in enumerate(text) if "nhc-drain.sh" in c and " -d " in c)
    assert any("controller restart --wipe" in c for c in text[last:])
    assert any(f"mv -f {ab.HOOKS_ORIG}" in c for c in text[last:])


def test_for_duration_scales_work_and_checkpoints():
    tp = TimelineParams.for_duration(240)
    assert tp.duration_s == 240 and tp.work_s == (16.0, 80.0)
    assert tp.ckpt_s == {"decode": 0.0, "pretrain": 8.0, "finetune": 8.0, "batch": 4.0}
    assert TimelineParams.for_duration(1800) == TimelineParams()
    assert TimelineParams.for_duration(10).ckpt_s["batch"] == 1.0  # whole seconds, at least 1
    assert TimelineParams.for_duration(240, jobs=5).jobs == 5
    tl = generate(0, tp)
    assert all(e.at_s <= 0.8 * 240 for e in tl.events)
    for bad in (0, -5):
        try:
            TimelineParams.for_duration(bad)
        except ValueError:
            continue
        raise AssertionError(f"duration {bad} accepted")


def test_ckpt_logs_and_gpu_fault_exit_in_the_ledger():
    from datetime import datetime

    ck = datetime.fromisoformat("2026-01-01T00:02:00").timestamp()
    recs = ledger.parse_ckpt_logs(
        f"/shared/fy-chaos/runs/x/progress/104.ckpts:{ck:.0f} 60\n"
        "/shared/fy-chaos/runs/x/progress/104.ckpts:garbage\nnoise\n/p/abc.ckpts:1 2\n"
    )
    assert recs == [{"job_id": "104", "last_checkpoint": ck}]
    # job 104 FAILED with exit 86 and no injected fault: still a hardware loss (its GPU faulted), and so is
    # 102's first attempt, requeued on the same node at that time; with another exit code neither is
    entries, tot = ledger.ledger(SACCT, recs, [], ab.PREMIUM_NODES)
    _, tot_none = ledger.ledger(SACCT.replace("|86:0|", "|1:0|"), recs, [], ab.PREMIUM_NODES)
    assert tot["hardware_failures"] == 2 and tot_none["hardware_failures"] == 0
    e104 = next(e for e in entries if e.job_id == 104)
    assert (e104.useful_gpu_s, e104.wasted_gpu_s) == (2 * 60, 2 * 180)
    assert tot["completed"] == 3 and tot_none["wasted_gpu_s"] == 0


def test_classes_from_the_chaos_log_when_sacct_has_no_comment():
    """Slurm stores job comments in accounting only with AccountingStoreFlags=job_comment: the driver passes
    the classes it submitted, so premium misuse is computed the same with or without it."""
    bare = "\n".join(ln.rsplit("|", 1)[0] + "|" for ln in SACCT.splitlines())
    classes = {"101": "decode", "102": "pretrain", "103": "batch", "104": "decode"}
    with_comment = ledger.ledger(SACCT, [], [], ab.PREMIUM_NODES)[0]
    without = ledger.ledger(bare, [], [], ab.PREMIUM_NODES)[0]
    from_log = ledger.ledger(bare, [], [], ab.PREMIUM_NODES, classes=classes)[0]
    assert {e.workload for e in without} == {None}
    assert [e.workload for e in from_log] == [e.workload for e in with_comment]
    assert [e.premium_misuse_gpu_s for e in from_log] == [e.premium_misuse_gpu_s for e in with_comment]


def test_timeline_cli_builds_the_params_and_refuses_bad_ones():
    from click.testing import CliRunner

    from slurm_fleetyield.chaos.cli import chaos

    r = CliRunner().invoke(
        chaos, ["timeline", "3", "--duration", "240", "--faults", "4", "--precursor-share", "1"]
    )
    assert r.exit_code == 0, r.output
    tl = Timeline.from_dict(json.loads(r.output))
    assert tl == generate(3, TimelineParams.for_duration(240, faults=4, precursor_share=1.0))
    assert sum(e.kind == "precursor" for e in tl.events) == 4
    for bad in (["--precursor-share", "1.5"], ["--jobs", "-1"], ["--duration", "0"]):
        r = CliRunner().invoke(chaos, ["timeline", "3", *bad])
        assert r.exit_code != 0 and "Invalid value" in r.output, (bad, r.output)


def test_job_script_follows_the_checkpoint_signal_convention(tmp_path: Path):
    """USR2: a checkpoint at the end of the current step, training goes on; USR1: a checkpoint, then the job
    requeues itself with scontrol (here a recorder) and exits 0."""
    import signal
    import time

    rec = tmp_path / "scontrol.log"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {rec}\n')
    fake.chmod(0o755)
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "43",
        "FY_STEP_S": "1",
        "FY_WORK_S": "60",
        "FY_CKPT_S": "0",  # no periodic checkpoints: every checkpoint here is a signalled one
        "FY_PROGRESS_DIR": str(tmp_path / "prog"),
        "FY_CKPT_DIR": str(tmp_path / "ckpt"),
        "FY_FATAL_FILE": str(tmp_path / "fatal.json"),
        "FY_SCONTROL": str(fake),
    }
    p = subprocess.Popen(["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and "training from 0s" in p.stdout.readline()  # traps are set
    ckpts = tmp_path / "prog" / "43.ckpts"

    def wait_for(cond, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 15
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        p.send_signal(signal.SIGUSR2)
        wait_for(lambda: ckpts.exists() and ckpts.read_text().strip(), "no checkpoint after USR2")
        assert p.poll() is None  # still training
        assert not rec.exists()
        p.send_signal(signal.SIGUSR1)
        assert p.wait(timeout=15) == 0
    finally:
        if p.poll() is None:
            p.kill()
    assert rec.read_text().split() == ["requeue", "43"]
    lines = ckpts.read_text().split("\n")
    assert len([x for x in lines if x.strip()]) == 2  # one per signal
    done, _, state = (tmp_path / "prog" / "43").read_text().split()
    assert state == "running" and int(done) >= 1
