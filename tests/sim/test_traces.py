"""Trace loaders: the real openb CSV, the generic format round trip, clear errors on bad input."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from slurm_fleetyield.sim import traces
from slurm_fleetyield.sim.data import openb_pods

OPENB = openb_pods()


@pytest.mark.skipif(not OPENB.exists(), reason="shared data not mounted")
def test_openb_matches_the_data_readme() -> None:
    jobs, st = traces.load_openb(OPENB)
    assert st.rows == 8_152
    assert st.gpu_tasks == 7_064
    assert st.size_mix == {1: 6_989, 2: 16, 4: 15, 8: 44}
    classes = {j.workload for j in jobs}
    assert classes == {"decode", "batch", "finetune", "pretrain"}
    assert all(j.checkpoint_s is None for j in jobs if j.workload == "decode")
    gangs = [j for j in jobs if j.workload == "pretrain"]
    assert gangs and all(j.nodes == 8 and j.gpus_per_node == 8 for j in gangs)
    filled = traces.fill(jobs, 30 * 86_400.0, 64 * 8, 0.7, random.Random(0), traces.OPENB_DAYS * 86_400.0)
    assert all(0 <= j.submit < 30 * 86_400.0 for j in filled)


def test_fill_varies_the_workload_timing_with_the_seed_even_for_one_replica() -> None:
    jobs = traces.synthetic(traces.SyntheticParams(), 10 * 86_400.0, 64, 0.5, random.Random(1))
    span = max(j.submit for j in jobs)

    def stream(seed: int) -> list[tuple[float, str, int]]:
        filled = traces.fill(jobs, 10 * 86_400.0, 64, 0.5, random.Random(seed), span)
        return [(j.submit, j.workload, j.gpus) for j in filled]

    one = stream(0)
    assert len(one) == len(jobs)  # one replica at this load
    assert stream(0) == one  # same seed, same stream
    assert stream(1) != one  # another seed rotates the arrivals
    assert sorted(x[1:] for x in stream(1)) == sorted(x[1:] for x in one)  # the same jobs


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_generic_round_trip(tmp_path: Path, suffix: str) -> None:
    jobs = traces.synthetic(traces.SyntheticParams(), 5 * 86_400.0, 64, 0.5, random.Random(1))
    path = tmp_path / f"t{suffix}"
    traces.save(jobs, path)
    assert traces.load(path) == jobs


def test_sacct_parsable2(tmp_path: Path) -> None:
    p = tmp_path / "sacct.txt"
    p.write_text(
        "JobID|Submit|Start|End|NNodes|AllocTRES|Comment\n"
        "10|2024-01-01T00:00:00|2024-01-01T00:10:00|2024-01-01T02:10:00|2|cpu=8,gres/gpu=16|fy:pretrain\n"
        "10.batch|2024-01-01T00:00:00|2024-01-01T00:10:00|2024-01-01T02:10:00|1|cpu=8|\n"
        "11|2024-01-01T01:00:00|2024-01-01T01:00:00|2024-01-01T01:30:00|1|gres/gpu=1|fy:decode\n"
    )
    jobs = traces.load(p)
    assert [(j.submit, j.duration, j.nodes, j.gpus_per_node, j.workload) for j in jobs] == [
        (0.0, 7200.0, 2, 8, "pretrain"),
        (3600.0, 1800.0, 1, 1, "decode"),
    ]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("job_id,submit_s\n1,0\n", "missing column"),
        (
            "job_id,submit_s,duration_s,nodes,gpus_per_node,workload,checkpoint_s\n1,0,10,1,8,train,\n",
            r":2: workload 'train'",
        ),
        (
            "job_id,submit_s,duration_s,nodes,gpus_per_node,workload,checkpoint_s\n1,x,10,1,8,batch,\n",
            r":2: bad value",
        ),
        (
            "job_id,submit_s,duration_s,nodes,gpus_per_node,workload,checkpoint_s\n1,0,-5,1,8,batch,\n",
            "duration_s=-5.0 must be > 0",
        ),
    ],
)
def test_bad_trace_gives_a_clear_error(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(traces.TraceError, match=match):
        traces.load(p)


def test_missing_file_and_bad_json(tmp_path: Path) -> None:
    with pytest.raises(traces.TraceError, match="no such file"):
        traces.load(tmp_path / "nope.csv")
    p = tmp_path / "bad.json"
    p.write_text('{"job_id": 1}')
    with pytest.raises(traces.TraceError, match="JSON list"):
        traces.load(p)
