"""The Epilog's view of a shared node: the other jobs the Prolog recorded here (``attest_gate.running_jobs``),
passed to the agent's hand-over so their tenants are present, not left behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prolog_epilog import attest_gate


def _record(spool: Path, job_id: str, uid: object, owner: int | None = None) -> Path:
    jobs = spool / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    path = jobs / f"{job_id}.json"
    path.write_text(json.dumps({"version": 1, "job_id": job_id, "uid": uid}))
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def test_the_other_jobs_recorded_here_are_co_resident(tmp_path: Path) -> None:
    _record(tmp_path, "41", "1000")  # the job ending now
    _record(tmp_path, "42", "1001")  # the Prolog writes $SLURM_JOB_UID, a string
    _record(tmp_path, "43_7", 1002)
    _record(tmp_path, "44", None)  # no uid: skipped
    (tmp_path / "jobs" / "notes.txt").write_text("x")
    (tmp_path / "jobs" / "4*.json").write_text(json.dumps({"uid": "1003"}))  # not a job id
    assert attest_gate.running_jobs(str(tmp_path), "41") == [
        {"job_id": "42", "uid": 1001},
        {"job_id": "43_7", "uid": 1002},
    ]
    assert attest_gate.running_jobs(None, "41") == [] == attest_gate.running_jobs(str(tmp_path / "x"), "1")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_record_root_did_not_write_keeps_nobody_out(tmp_path: Path) -> None:
    _record(tmp_path, "42", "1001", owner=1001)  # a tenant's own file in the spool: ignored
    assert attest_gate.running_jobs(str(tmp_path), "41") == []
    link = tmp_path / "jobs" / "45.json"
    link.symlink_to(_record(tmp_path, "46", "1002"))
    os.remove(tmp_path / "jobs" / "46.json")
    assert attest_gate.running_jobs(str(tmp_path), "41") == []  # a dangling link: not followed
