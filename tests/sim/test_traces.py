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
    load = traces.offered_load(jobs, 10 * 86_400.0, 64)  # exactly one replica: no thinned one

    def stream(seed: int) -> list[tuple[float, str, int]]:
        filled = traces.fill(jobs, 10 * 86_400.0, 64, load, random.Random(seed), span)
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


HEADER = "job_id,submit_s,duration_s,nodes,gpus_per_node,workload,checkpoint_s\n"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        # no trailing comma: until issue 25 read as a job that cannot checkpoint
        (
            "1,0,10,1,8,batch,600\n2,5,10,1,8,batch\n",
            r"bad\.csv:3: 6 fields, the header has 7 \(no checkpoint_s",
        ),
        # a short row: until issue 25 "int() argument must be ... not 'NoneType'"
        ("1,0,10\n", r"bad\.csv:2: 3 fields, the header has 7 \(no nodes, gpus_per_node, workload"),
        ("1,0,10,1,8,batch,600,extra\n", r"bad\.csv:2: 8 fields, the header has 7"),
        (
            "7,0,10,1,8,batch,600\n8,1,10,1,8,batch,\n7,2,10,1,8,decode,\n",
            r"bad\.csv:4: duplicate job_id 7 \(first on line 2\)",
        ),
        ("", r"bad\.csv: no jobs in the trace"),
    ],
)
def test_generic_csv_rows_must_be_whole_and_unique(tmp_path: Path, body: str, match: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(HEADER + body)
    with pytest.raises(traces.TraceError, match=match):
        traces.load(p)


def test_an_empty_cannot_checkpoint_field_is_still_read(tmp_path: Path) -> None:
    p = tmp_path / "ok.csv"
    p.write_text(HEADER + "3,0,10,1,8,decode,\n")
    assert traces.load(p)[0].checkpoint_s is None


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("empty.csv", "", r"empty\.csv: empty file"),
        ("empty.json", "[]", r"empty\.json: no jobs"),
        (
            "null.json",
            '[{"job_id": 1, "submit_s": 0, "duration_s": null, "nodes": 1, "gpus_per_node": 8, '
            '"workload": "batch", "checkpoint_s": null}]',
            r"null\.json:1: duration_s is null",
        ),
        (
            "dup.json",
            '[{"job_id": 1, "submit_s": 0, "duration_s": 5, "nodes": 1, "gpus_per_node": 8, '
            '"workload": "batch", "checkpoint_s": null}, {"job_id": 1, "submit_s": 0, "duration_s": 5, '
            '"nodes": 1, "gpus_per_node": 8, "workload": "batch", "checkpoint_s": null}]',
            r"dup\.json:2: duplicate job_id 1",
        ),
    ],
)
def test_empty_and_null_traces_name_their_file(tmp_path: Path, name: str, text: str, match: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(traces.TraceError, match=match):
        traces.load(p)


def _one_replica_trace() -> tuple[list[traces.Job], float]:
    """100 one-node jobs over 10 days on 8 nodes x 8 GPUs: about 0.45 of the fleet's GPU-hours."""
    rng = random.Random(5)
    jobs = [
        traces.Job(i + 1, i * 8640.0, rng.uniform(2 * 3600.0, 14 * 3600.0), 1, 8, "batch", 1800.0)
        for i in range(100)
    ]
    return jobs, traces.offered_load(jobs, 10 * 86_400.0, 64)


@pytest.mark.parametrize("load", [0.2, 0.45, 0.7, 1.3])
def test_fill_replays_the_load_asked_for_not_whole_replicas(load: float) -> None:
    # until issue 25 the replica count was rounded: 0.2 and 0.7 both gave the trace once (0.45)
    jobs, one = _one_replica_trace()
    assert 0.4 < one < 0.5
    offered = [
        traces.offered_load(
            traces.fill(jobs, 10 * 86_400.0, 64, load, random.Random(s), 86_400.0 * 10), 10 * 86_400.0, 64
        )
        for s in range(20)
    ]
    mean = sum(offered) / len(offered)
    assert abs(mean - load) < 0.06 * load, (load, mean)


def test_fill_thins_by_the_seed_and_errs_when_nothing_is_left() -> None:
    jobs, _ = _one_replica_trace()
    a = traces.fill(jobs, 10 * 86_400.0, 64, 0.2, random.Random(1), 86_400.0 * 10)
    b = traces.fill(jobs, 10 * 86_400.0, 64, 0.2, random.Random(1), 86_400.0 * 10)
    c = traces.fill(jobs, 10 * 86_400.0, 64, 0.2, random.Random(2), 86_400.0 * 10)
    assert a == b and a != c and len(a) < len(jobs)
    with pytest.raises(traces.TraceError, match="keeps none of the trace's 1 jobs"):
        traces.fill(jobs[:1], 10 * 86_400.0, 8, 0.001, random.Random(0), 86_400.0 * 10)


def test_check_fits_names_the_traces_own_job_id() -> None:
    jobs = [
        traces.Job(10, 0.0, 60.0, 1, 8, "batch", None),
        traces.Job(4242, 1.0, 60.0, 16, 8, "pretrain", None),
    ]
    with pytest.raises(
        traces.TraceError, match=r"t\.csv: job 4242 needs 16 x 8 GPUs, larger than the fleet \(4 x 8\)"
    ):
        traces.check_fits(jobs, 4, 8, "t.csv")
    traces.check_fits(jobs, 16, 8, "t.csv")
