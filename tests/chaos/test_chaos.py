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
    """exec: answers sbatch with increasing job ids; a virtual clock advanced by sleep."""

    def __init__(self) -> None:
        self.t = 1_000.0
        self.calls: list[tuple[str, ...]] = []
        self.next_id = 100

    def exec(self, argv):  # type: ignore[no-untyped-def]
        self.calls.append(tuple(argv))
        if "sbatch" in argv:
            self.next_id += 1
            return 0, str(self.next_id)
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


def test_arm_setup_bare_disables_and_emulates_nhc_fleetyield_enables():
    bare = [" ".join(c) for c in ab.setup_commands("bare", ("gpu-h100-1",))]
    assert any("controller stop" in c for c in bare)
    assert any("touch /etc/slurm/fleetyield.disabled" in c for c in bare)
    assert any("nhc-drain.sh" in c and "-d" in c for c in bare)
    assert not any("pkill" in c or "killall" in c for c in bare)
    fy = [" ".join(c) for c in ab.setup_commands("fleetyield", ("gpu-h100-1",))]
    assert any("rm -f /etc/slurm/fleetyield.disabled" in c for c in fy)
    assert any("controller start" in c for c in fy)


def test_run_arm_on_a_fake_cluster_writes_log_and_result(tmp_path: Path):
    fc = FakeCluster()
    tl = generate(1, TimelineParams(jobs=3, faults=1, duration_s=60))
    res = ab.run_arm(tl, "bare", fc.exec, tmp_path, lambda: fc.t, fc.sleep, drain_timeout_s=60)
    assert res["type"] == "result" and set(res["job_ids"]) == {e.ref for e in tl.events if e.kind == "submit"}
    tl2, recs = chaos_log.read(tmp_path / "chaos-bare-s1.jsonl")
    assert tl2 == tl and recs[-1]["type"] == "result"
    assert isinstance(Timeline.from_dict(tl.to_dict()), Timeline)
