"""intake.py: canary results and outcomes handed to the core exactly once; executor routing and dry-run."""

from __future__ import annotations

from slurm_fleetyield import intake
from slurm_fleetyield.adapters.slurm import JobAttempt
from slurm_fleetyield.adapters.store import Store, TickMarks
from slurm_fleetyield.core.model import CanaryResult
from slurm_fleetyield.core.plan import Plan, ProposeDrain, ResetGpu, SubmitCanary, UpdateNodes
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.executor import Executor, GateAccess
from slurm_fleetyield.ports import ActionResult, ApplyReport


class FakeSlurm:
    def __init__(self) -> None:
        self.canaries: list[CanaryResult] = []
        self.attempts: dict[int, list[JobAttempt]] = {}
        self.plans: list[Plan] = []

    def read_canaries(self, tokens, since):
        return [c for c in self.canaries if c.token in tokens]

    def read_job_attempts(self, ids):
        return {i: self.attempts[i] for i in ids if i in self.attempts}

    def expand_hostlists(self, exprs):
        return {e: tuple(f"gpu-0{i}" for i in (1, 2)) if "[" in e else (e,) for e in exprs}

    def apply(self, plan: Plan) -> ApplyReport:
        self.plans.append(plan)
        kinds = {"reset_gpu", "propose_drain", "withdraw_proposal"}
        return ApplyReport(
            tuple(ActionResult(a, True, ("x",)) for a in plan.actions if a.kind not in kinds), 1
        )


def commit(store: Store, tick: int, out: intake.Intake) -> None:
    store.commit_tick(
        tick,
        float(tick),
        ControllerState.empty(),
        marks=TickMarks(out.outcome_keys, out.attempts, (), out.gate_marks, out.canary_seen),
    )


def test_canary_results_once_and_live_ones_every_tick(tmp_path):
    store, slurm = Store(tmp_path / "fy.db"), FakeSlurm()
    store.record_canary_round("t1", "gpu-01", 100.0)
    slurm.canaries = [
        CanaryResult("gpu-01", 1, "t1", "COMPLETED", 0, 150.0),
        CanaryResult("gpu-01", 2, "t1", "RUNNING"),
        CanaryResult("gpu-01", 3, "old", "FAILED", 1, 90.0),  # a round we never submitted
    ]
    out = intake.Intake()
    intake.canaries(slurm, store, 200.0, 3600.0, out)
    assert [(r.job_id, r.state) for r in out.canary_results] == [(1, "COMPLETED"), (2, "RUNNING")]
    commit(store, 1, out)
    again = intake.Intake()
    intake.canaries(slurm, store, 210.0, 3600.0, again)
    assert [r.job_id for r in again.canary_results] == [2]


def test_outcome_with_sacct_state_waits_for_accounting(tmp_path):
    store, slurm = Store(tmp_path / "fy.db"), FakeSlurm()
    rec = {
        "job_id": "88",
        "node": "gpu-01",
        "nodes": "gpu-[01-02]",
        "gpus": [0, 1, 2, 3],
        "start_time": 1000.0,
        "end_time": 5000.0,
        "exit_code": 0,
        "exit_signal": 0,
        "declared_class": "pretrain",
        "last_checkpoint": 4000.0,
    }
    store.put_outcomes("gpu-01", [rec], received_at=5001.0)
    out = intake.Intake()
    intake.outcomes(slurm, store, 5010.0, True, out)
    assert out.outcomes == [] and out.outcome_keys == []  # sacct has no final state yet: wait
    slurm.attempts[88] = [JobAttempt(88, "NODE_FAIL", 0, 1000.0, 4990.0, "gpu-[01-02]")]
    out = intake.Intake()
    intake.outcomes(slurm, store, 5020.0, True, out)
    (o,) = out.outcomes
    assert (o.job_id, o.state, o.node_list, o.gpus, o.last_checkpoint) == (
        88,
        "NODE_FAIL",
        ("gpu-01", "gpu-02"),
        8,
        4000.0,
    )
    assert o.workload.value == "pretrain" and o.end == 4990.0
    commit(store, 1, out)
    assert store.pending_outcomes() == []


def test_outcome_without_accounting_is_derived_from_exit_codes(tmp_path):
    store = Store(tmp_path / "fy.db")
    store.put_outcomes(
        "gpu-01", [{"job_id": "9", "start_time": 1.0, "end_time": 2.0, "exit_code": 0, "exit_signal": 9}]
    )
    out = intake.Intake()
    intake.outcomes(None, store, 10.0, True, out)
    assert [(o.state, o.exit_code) for o in out.outcomes] == [("CANCELLED", 137)]


def test_executor_routes_and_dry_run_records_proposals_only(tmp_path):
    store, slurm = Store(tmp_path / "fy.db"), FakeSlurm()
    gate = GateAccess(tmp_path / "gate")
    plan = Plan(
        (
            UpdateNodes(("gpu-01",), ("fy_tier_red",), 10),
            SubmitCanary("gpu-02", 2, "tok", 600.0),
            ResetGpu("gpu-03", (1,), "r"),
            ProposeDrain("p-00000000abcd", "gpu-01", (3,), 0.9, "evidence", (7,), 10_000.0),
        )
    )
    report = Executor(slurm, store, gate=gate, dry_run=True).apply(plan, 100.0)
    assert slurm.plans == [plan]  # the Slurm port (a DryRunSlurm in production) sees the whole plan
    assert [r.ok for r in report.results] == [True, True, False, True]  # no agent control configured
    assert store.canary_rounds(0.0) == {}  # dry-run: no canary round recorded
    gk = gate.get()
    assert gk.get("p-00000000abcd").status.value == "pending"
    assert any(e.actor == "fleetyield (dry-run)" for e in gk.audit.entries())
    # a replayed tick proposes the same id again: idempotent
    report = Executor(slurm, store, gate=gate).apply(plan, 101.0)
    assert report.results[3].ok and "already recorded" in report.results[3].detail
    assert store.canary_rounds(0.0) == {"tok": "gpu-02"}
    gate.close()
