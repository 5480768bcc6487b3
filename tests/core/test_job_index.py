"""The queue index the stages share (``Observations.job_index``) and the stage helpers rewritten over it:
each must give what a plain scan of ``Observations.jobs`` gives."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_fleetyield.core.model import (
    HOLDING_STATES,
    JobView,
    Observations,
    SlurmNode,
    WorkloadClass,
)
from slurm_fleetyield.core.premium import idle_gpus, pending_premium_jobs

NODES = ("a", "b", "c", "d")
STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "COMPLETED")
CLASSES = (None, *WorkloadClass)

jobs_st = st.lists(
    st.builds(
        JobView,
        job_id=st.integers(1, 10_000),
        state=st.sampled_from(STATES),
        nodes=st.lists(st.sampled_from(NODES), max_size=3, unique=True).map(tuple),
        workload=st.sampled_from(CLASSES),
        gpus=st.integers(0, 16),
    ),
    max_size=40,
    unique_by=lambda j: j.job_id,
).map(tuple)

node_states_st = st.sampled_from(
    [
        frozenset({"IDLE"}),
        frozenset({"ALLOCATED"}),
        frozenset({"MIXED"}),
        frozenset({"MIXED", "DRAIN"}),
        frozenset({"DOWN", "NOT_RESPONDING"}),
        frozenset(),
    ]
)


@settings(max_examples=300, deadline=None)
@given(jobs_st)
def test_index_lists_are_the_plain_filters_in_queue_order(jobs: tuple[JobView, ...]) -> None:
    obs = Observations(0.0, {}, {}, jobs=jobs)
    idx = obs.job_index
    assert idx.pending == tuple(j for j in jobs if j.state == "PENDING")
    assert idx.holding == tuple(j for j in jobs if j.state in HOLDING_STATES)
    assert idx.placed == tuple(j for j in jobs if j.nodes)
    for w in CLASSES:
        assert idx.pending_by.get(w, ()) == tuple(j for j in jobs if j.state == "PENDING" and j.workload is w)
        assert idx.by.get(w, ()) == tuple(j for j in jobs if j.workload is w)
        assert idx.holding_by.get(w, ()) == tuple(j for j in idx.holding if j.workload is w)
    # each mapping's classes in the order of their first job in the queue (stages iterate them)
    assert list(idx.pending_by) == list(dict.fromkeys(j.workload for j in idx.pending))
    assert list(idx.holding_by) == list(dict.fromkeys(j.workload for j in idx.holding))
    assert list(idx.by) == list(dict.fromkeys(j.workload for j in jobs))
    assert obs.job_index is idx  # one tick's observations: built once
    again = Observations(0.0, {}, {}, jobs=jobs)  # another tick's: its own index, equal
    assert again.job_index is not idx and again.job_index.pending == idx.pending
    assert again == obs  # the index is not part of the observations' value


def _idle_plain(obs: Observations) -> dict[str, int]:
    """idle_gpus as it was written before the index: every job read, every node."""
    out_states = {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN"}
    used: dict[str, float] = {}
    for j in obs.jobs:
        if j.state in {"RUNNING", "COMPLETING", "SUSPENDED"} and j.nodes and j.gpus > 0:
            for n in j.nodes:
                used[n] = used.get(n, 0.0) + j.gpus / len(j.nodes)
    out: dict[str, int] = {}
    for name, s in obs.slurm.items():
        if s.states & out_states or not s.states:
            continue
        if "IDLE" in s.states:
            out[name] = s.gpu_count
        elif "ALLOCATED" in s.states:
            out[name] = 0
        else:
            out[name] = max(0, s.gpu_count - math.ceil(used.get(name, 0.0) - 1e-9))
    return out


@settings(max_examples=300, deadline=None)
@given(jobs_st, st.lists(node_states_st, min_size=len(NODES), max_size=len(NODES)))
def test_idle_gpus_equals_the_plain_scan(jobs: tuple[JobView, ...], states: list[frozenset[str]]) -> None:
    slurm = {n: SlurmNode(n, s, gpu_count=8) for n, s in zip(NODES, states, strict=True)}
    obs = Observations(0.0, slurm, {}, jobs=jobs)
    got = idle_gpus(obs)
    want = _idle_plain(obs)
    assert got == want
    assert list(got) == list(want)  # same order: callers iterate it
    # asked again within the tick (same Observations): the same answer, a copy each time
    got.clear()
    again = idle_gpus(obs)
    assert again == want and again is not idle_gpus(obs)


@settings(max_examples=200, deadline=None)
@given(jobs_st, st.sets(st.sampled_from([w.value for w in WorkloadClass])))
def test_pending_premium_jobs_equals_the_plain_scan(jobs: tuple[JobView, ...], classes: set[str]) -> None:
    obs = Observations(0.0, {}, {}, jobs=jobs)
    want = sorted(
        (j for j in jobs if j.state == "PENDING" and j.workload and j.workload in classes and j.gpus > 0),
        key=lambda j: j.job_id,
    )
    assert pending_premium_jobs(obs, frozenset(classes)) == want
