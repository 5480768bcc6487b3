"""fleetyield-epilog run as a subprocess, the way slurmd runs it."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest


def _epilog_env(node: Any, job_id: str, gpus: str | None = "0,1", **extra: str) -> dict[str, str]:
    env = node.env(job_id=job_id, gpus=gpus, **extra)
    env["SLURM_SCRIPT_CONTEXT"] = "epilog_slurmd"
    env.pop("SLURM_JOB_GPUS", None)  # documented for the Prolog only on Slurm 22.05
    return env


def test_prolog_then_epilog_roundtrip(node: Any, hook: Any) -> None:
    assert hook("prolog", node.env(job_id="2001", gpus="0,1", SLURM_JOB_PARTITION="decode")).rc == 0
    assert (node.map_dir / "0").exists()
    res = hook("epilog", _epilog_env(node, "2001"))
    assert res.rc == 0, res.stderr
    assert os.listdir(node.map_dir) == []
    record = json.loads((node.spool / "outcomes" / "2001.json").read_text())
    assert record["job_id"] == "2001"
    assert record["user"] == "alice" and record["uid"] == 1234
    assert record["node"] == "gpu-node-07"
    assert record["gpus"] == [0, 1]
    assert record["mapping_removed"] == [0, 1]
    assert record["start_time_source"] == "prolog"
    assert record["start_time"] <= record["end_time"]
    assert record["declared_class"] == "decode" and record["class_source"] == "partition"
    assert record["exit_code"] is None  # not provided by a 22.05 slurmd Epilog
    assert not (node.spool / "jobs" / "2001.json").exists()  # prolog state consumed


def test_epilog_removes_only_this_jobs_mapping(node: Any, hook: Any) -> None:
    node.map_dir.mkdir(parents=True)
    (node.map_dir / "0").write_text("3001\n")
    (node.map_dir / "1").write_text("3002\n")  # another job's GPU
    (node.map_dir / "2").write_text("3001\n3003\n")  # shared GPU
    (node.map_dir / "notes").write_text("3001\n")  # not a GPU file: untouched
    (node.map_dir / ".2.3001.tmp").write_text("3001\n")  # this job's leftover temp file
    (node.map_dir / ".4.3004.tmp").write_text("3004\n")  # another job's temp file
    res = hook("epilog", _epilog_env(node, "3001", gpus="0"))
    assert res.rc == 0, res.stderr
    assert sorted(os.listdir(node.map_dir)) == [".4.3004.tmp", "1", "2", "notes"]
    assert (node.map_dir / "1").read_text() == "3002\n"
    assert (node.map_dir / "2").read_text() == "3003\n"
    record = json.loads((node.spool / "outcomes" / "3001.json").read_text())
    assert record["mapping_removed"] == [0]


def test_outcome_uses_newer_slurm_variables(node: Any, hook: Any) -> None:
    env = _epilog_env(
        node,
        "4001",
        SLURM_JOB_START_TIME="1700000000",
        SLURM_JOB_END_TIME="1700003600",
        SLURM_JOB_EXIT_CODE="256",
        SLURM_JOB_EXIT_CODE2="1:0",
        SLURM_JOB_DERIVED_EC="1",
        SLURM_JOB_COMMENT="fy:finetune run=42",
        SLURM_JOB_NODELIST="gpu-node-[07-08]",
    )
    assert hook("epilog", env).rc == 0
    record = json.loads((node.spool / "outcomes" / "4001.json").read_text())
    assert record["start_time"] == 1700000000 and record["start_time_source"] == "slurm"
    assert record["slurm_end_time"] == 1700003600
    assert record["exit_code"] == 1 and record["exit_signal"] == 0 and record["exit_status_raw"] == 256
    assert record["declared_class"] == "finetune" and record["class_source"] == "comment"
    assert record["nodes"] == "gpu-node-[07-08]"
    assert record["gpus"] == [0, 1]  # from CUDA_VISIBLE_DEVICES


def test_requeued_job_does_not_clobber_undelivered_record(node: Any, hook: Any) -> None:
    assert hook("epilog", _epilog_env(node, "5001")).rc == 0
    first = (node.spool / "outcomes" / "5001.json").read_text()
    assert hook("epilog", _epilog_env(node, "5001")).rc == 0
    names = sorted(os.listdir(node.spool / "outcomes"))
    assert len(names) == 2 and "5001.json" in names
    assert next(n for n in names if n != "5001.json").startswith("5001-")
    assert (node.spool / "outcomes" / "5001.json").read_text() == first
    assert not [n for n in names if n.startswith(".")]


def test_epilog_without_prolog_state_or_mapping(node: Any, hook: Any) -> None:
    res = hook("epilog", _epilog_env(node, "6001", gpus=None))
    assert res.rc == 0, res.stderr
    record = json.loads((node.spool / "outcomes" / "6001.json").read_text())
    assert record["start_time"] is None and record["gpus"] == []


def test_epilog_unwritable_spool_exits_zero(node: Any, hook: Any) -> None:
    node.spool.write_text("not a directory")
    res = hook("epilog", _epilog_env(node, "7001"))
    assert res.rc == 0
    assert "cannot spool" in res.stderr


def test_epilog_bad_job_id_exits_zero(node: Any, hook: Any) -> None:
    res = hook("epilog", _epilog_env(node, "x/../1"))
    assert res.rc == 0
    assert not (node.spool / "outcomes").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_epilog_hard_deadline(node: Any, hook: Any) -> None:
    # The prolog's job-state file is a FIFO with no writer: open(2) blocks like a hung mount.
    (node.spool / "jobs").mkdir(parents=True)
    os.mkfifo(node.spool / "jobs" / "8001.json")
    node.write_conf(hard_timeout_ms=400)
    res = hook("epilog", _epilog_env(node, "8001"), timeout=10)
    assert res.rc == 0
    assert "hard deadline passed" in res.stderr
    assert res.wall_s < 2.0, res.wall_s
