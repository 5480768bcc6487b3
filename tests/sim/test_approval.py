"""The simulated admin's approval goes through the core, as the live gate's does (issue #5).

The approval enters a tick as a ``GateDecision``; the drain, its reason and its requeue list are the plan's
(lifecycle APPROVED_DRAIN): a job without Slurm's Requeue flag (here: a job that cannot checkpoint) is never
requeued by it and keeps running on the drained node until it ends.
"""

from __future__ import annotations

import pytest

from sim.fleets import fault_heavy
from slurm_fleetyield.core.plan import DrainNode
from slurm_fleetyield.sim import runner

# a small, fault-heavy synthetic fleet where approved drains hit nodes running both kinds of jobs
# seed: a run with both kinds of drained jobs; these tests are about the approval mechanism, not the drain
# economics: the risk is trusted fully (stake.drain_precision 1) so that drains pay on this small fleet
CFG = dict(nodes=12, days=10, seed=0, lead_h=12.0, core='{"stake": {"drain_precision": 1.0}}')


def test_approved_drain_comes_from_the_plan_and_never_requeues_a_no_requeue_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = fault_heavy(**CFG)
    approvals: list = []
    approved: list[DrainNode] = []
    kept: list[int] = []  # jobs left running on a node the plan just drained for an approval
    requeued: list[tuple[int, bool]] = []  # every job a drain requeued, with its Requeue flag
    original = runner.controller_step

    def spy(state, slurm, samples, pending, params, now, rng, gate_decisions=()):  # type: ignore[no-untyped-def]
        approvals.extend(d for d in gate_decisions if d.action == "approve")
        r = original(state, slurm, samples, pending, params, now, rng, gate_decisions)
        for a in r.plan.of_kind("drain"):
            assert isinstance(a, DrainNode)
            if a.cause == "approved":
                approved.append(a)
                left = slurm.jobs_on(a.node)
                assert not set(left) & set(a.requeue_jobs)
                assert all(not slurm.running[j].requeue for j in left), "a requeueable job was left running"
                kept.extend(left)
        return r

    on_requeue = sim.slurm.on_requeue
    assert on_requeue is not None

    def record(jid: int) -> None:
        requeued.append((jid, sim.slurm.running[jid].requeue))
        on_requeue(jid)

    sim.slurm.on_requeue = record
    monkeypatch.setattr(runner, "controller_step", spy)
    m = sim.run()

    assert approved, "the scenario must contain approved drains"
    assert m["preemptive_drains"] == len(approved)
    assert 0 < m["false_drains"] <= m["preemptive_drains"]
    by_id = {d.proposal_id: d for d in approvals}
    for a in approved:  # each drain answers one of the simulated admin's decisions, named in its reason
        pid = a.reason.rsplit("#", 1)[-1].rstrip("]")
        assert pid in by_id and by_id[pid].node == a.node and by_id[pid].admin == runner.SIM_ADMIN
        assert a.reason.startswith("fleetyield: ") and f"[approved by {runner.SIM_ADMIN} #{pid}]" in a.reason
    assert kept, "some approved drain must hit a node running a job that cannot be requeued"
    assert all(flag for _, flag in requeued), "a drain requeued a job submitted --no-requeue"
    assert any(a.requeue_jobs for a in approved)  # requeueable jobs are still requeued
    for jid in kept:  # the no-requeue jobs were not cut short by the drain
        assert sim.jobs[jid].job.checkpoint_s is None


def test_a_stale_proposal_is_declined(monkeypatch: pytest.MonkeyPatch) -> None:
    """The admin approves only an open proposal of a node still red and in service."""
    sim = fault_heavy(**CFG)
    sent: list = []
    original = runner.controller_step

    def spy(state, slurm, samples, pending, params, now, rng, gate_decisions=()):  # type: ignore[no-untyped-def]
        sent.extend(gate_decisions)
        return original(state, slurm, samples, pending, params, now, rng, gate_decisions)

    calls: list[str] = []
    approve = sim._approve

    def count(node: str) -> None:
        calls.append(node)
        approve(node)

    monkeypatch.setattr(sim, "_approve", count)
    monkeypatch.setattr(runner, "controller_step", spy)
    m = sim.run()
    assert all(d.action == "approve" and d.admin == runner.SIM_ADMIN for d in sent)
    assert 0 < m["preemptive_drains"] <= len(sent)  # a drain held by a cap may still be pending at the end
    assert len(calls) > len(sent), "the scenario must contain a declined (stale) proposal"
