"""Scenario tables through ``tick``: drain proposals and the human gate, the rehabilitation lifecycle, the job
ledger and lemons. Each scenario runs on a virtual clock against the builders' fake Slurm."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core.builders import Fleet, Runner
from core.builders import tier_params as Params  # the tier rule's mechanisms (builders.TIER_RULE)

from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.explain import explain
from slurm_fleetyield.core.lifecycle import Remediation, Stage
from slurm_fleetyield.core.loop import TickResult, tick
from slurm_fleetyield.core.model import (
    CanaryResult,
    ConfirmedAction,
    FailedAction,
    GateDecision,
    JobOutcome,
    JobView,
    WorkloadClass,
)

T0 = 1_000_000.0


pytestmark = pytest.mark.usefixtures("tier_rule")  # Runner() runs builders.TIER_RULE


class Loop(Runner):
    """Runner whose ticks can carry the shell's feedback (canary results, decisions, outcomes, failures)."""

    def tick(self, advance: bool = True, **extra: object) -> TickResult:  # type: ignore[override]
        if advance and self.last is not None:
            self.now += self.step
        obs = replace(self.fleet.observe(self.now), **extra)
        result = tick(self.state, obs, self.params, self.now, self.rng)
        self.state = result.state
        if self.apply:
            self.fleet.apply(result.plan)
        self.last = result
        return result

    def until(self, t: float, **extra: object) -> TickResult:
        r = self.tick(**extra)
        while self.now < t:
            r = self.tick(**extra)
        return r


def kinds(res: TickResult) -> list[tuple[str, str]]:
    return [(a.kind, getattr(a, "node", "") or ",".join(getattr(a, "nodes", ()))) for a in res.plan.actions]


def degrade(f: Fleet, node: str = "gpu001", gpu: int = 3) -> None:
    f.set(node, gpu, s.ROWS_CORR, 14)
    f.set(node, gpu, s.REMAP_PENDING, 1)
    f.bump(node, gpu, s.ROWS_CORR, 2)


def proposed(r: Loop) -> tuple:
    f = Fleet(10)
    f.run_job(1, ("gpu001",), requeue=True)
    r.fleet = f
    r.tick()
    degrade(f)
    res = r.tick()
    (p,) = res.plan.of_kind("propose_drain")
    return f, res, p


# ---- gate --------------------------------------------------------------------------------------------------


def test_degradation_proposes_once_keeps_running_then_approval_drains():
    r = Loop(Fleet(1))
    _, res, p = proposed(r)
    assert p.node == "gpu001" and p.proposal_id.startswith("p-") and len(p.proposal_id) == 14
    assert p.gpus == (3,) and p.affected_jobs == (1,) and p.risk >= 0.5
    assert p.evidence.startswith("node gpu001: tier red") and "correctable_remapped_rows" in p.evidence
    assert p.expires_at == r.now + 24 * 3600
    assert res.plan.of_kind("drain") == () and res.nodes["gpu001"].tier.value == "red"
    assert any(e.kind == "drain_proposal" for e in res.events)
    for _ in range(3):  # stays red, runs its job, no second proposal, no drain
        res = r.tick()
        assert res.plan.of_kind("propose_drain") == () and res.plan.of_kind("drain") == ()
    assert "drain proposal: " + p.proposal_id in explain("gpu001", res)
    approve = (GateDecision(p.proposal_id, "gpu001", "approve", "alice", r.now),)
    res = r.tick(gate_decisions=approve)
    (d,) = res.plan.of_kind("drain")
    assert d.cause == "approved" and d.requeue_jobs == (1,)
    assert d.reason.startswith("fleetyield: risk 0.") and ", gpu 3 remap pending 1 [" in d.reason
    assert d.reason.endswith(f"[approved by alice #{p.proposal_id}]") and len(d.reason) <= 120
    assert r.state.lifecycle["gpu001"].stage is Stage.QUARANTINED and "gpu001" not in r.state.proposals
    assert res.nodes["gpu001"].tier.value == "quarantined"
    res = r.tick(gate_decisions=approve)  # the shell re-sends until it sees the drain: a no-op
    assert res.plan.of_kind("drain") == () and res.plan.of_kind("propose_drain") == ()
    assert not [e for e in res.events if e.kind == "gate_decision_ignored"]


def test_deny_closes_and_blocks_reproposal_within_cooldown():
    params = Params(gate={"deny_cooldown_s": 600.0})
    r = Loop(Fleet(1), params)
    _, _, p = proposed(r)
    res = r.tick(gate_decisions=(GateDecision(p.proposal_id, "gpu001", "deny", "bob", r.now),))
    assert res.plan.of_kind("drain") == () and "gpu001" not in r.state.proposals
    assert r.state.denials["gpu001"].proposal_id == p.proposal_id
    denied_at = r.now
    while r.now < denied_at + 570:
        res = r.tick()
        assert res.plan.of_kind("propose_drain") == () and res.plan.of_kind("drain") == ()
    res = r.until(denied_at + 600)
    (again,) = res.plan.of_kind("propose_drain")
    assert again.proposal_id != p.proposal_id


def test_approval_held_by_drain_cap_then_drained_when_room():
    r = Loop(Fleet(1))
    f, _, p = proposed(r)  # 10 nodes: the cap is 1 node
    f.slurm_update("gpu007", states=frozenset({"IDLE", "DRAIN"}), reason="fleetyield: XID 79 gpu 0 fell off")
    res = r.tick(gate_decisions=(GateDecision(p.proposal_id, "gpu001", "approve", "alice", r.now),))
    assert res.plan.of_kind("drain") == ()
    (hold,) = res.plan.holds
    assert hold.node == "gpu001" and hold.rule == "drain_cap" and p.proposal_id in hold.detail
    assert r.state.proposals["gpu001"].approved_by == "alice"
    res = r.tick()  # not re-sent: the approval is remembered and retried
    assert res.plan.of_kind("drain") == () and res.plan.holds
    f.slurm_update("gpu007", states=frozenset({"IDLE"}), reason="")
    res = r.tick()
    (d,) = res.plan.of_kind("drain")
    assert d.node == "gpu001" and d.cause == "approved" and d.reason.endswith(f"#{p.proposal_id}]")


def test_withdrawn_when_risk_falls_or_admin_drain_names_it():
    r = Loop(Fleet(1), Params(gate={"withdraw_after_s": 60.0}))
    f, _, p = proposed(r)
    f.set("gpu001", 3, s.ROWS_CORR, 0)
    f.set("gpu001", 3, s.REMAP_PENDING, 0)
    r.step = 3600.0  # the remap-growth window passes
    res = r.tick()
    res = r.tick() if not res.plan.of_kind("withdraw_proposal") else res
    (w,) = res.plan.of_kind("withdraw_proposal")
    assert w.proposal_id == p.proposal_id and w.reason.startswith("risk_fell:")
    r2 = Loop(Fleet(1))
    f2, _, p2 = proposed(r2)
    f2.drain_by_admin("gpu001", f"swapping gpu 3 #{p2.proposal_id}")
    (w2,) = r2.tick().plan.of_kind("withdraw_proposal")
    assert w2.reason.startswith("settled_by_admin:") and "gpu001" not in r2.state.proposals


# ---- lifecycle ---------------------------------------------------------------------------------------------


def to_canary(r: Loop, f: Fleet) -> tuple[TickResult, str]:
    """XID 79 on gpu002 -> quarantine -> drained -> reboot -> back: returns the canary entry tick, token."""
    f.run_job(1, ("gpu002",), requeue=True)
    r.tick()
    f.push("gpu002", 79, 3, r.now)
    res = r.tick()
    (d,) = res.plan.of_kind("drain")
    assert d.cause == "fatal" and d.requeue_jobs == (1,)
    assert r.state.lifecycle["gpu002"].stage is Stage.QUARANTINED
    res = r.tick()  # job 1 still running (requeue not landed): not DRAINED yet
    assert res.plan.of_kind("reboot") == ()
    f.jobs = []
    res = r.tick()
    assert kinds(res)[-2:] == [("drain", "gpu002"), ("reboot", "gpu002")]
    assert "remediation 1/3 (reboot)" in res.plan.of_kind("reboot")[0].reason
    assert r.state.lifecycle["gpu002"].stage is Stage.REMEDIATING
    started = r.now
    while r.now < started + 90:  # a sample right after the command proves nothing
        assert r.tick().plan.of_kind("resume") == ()
    res = r.until(started + 150)
    while not res.plan.of_kind("resume"):
        res = r.tick()
    (update,) = [a for a in res.plan.of_kind("update") if "gpu002" in a.nodes]
    fy = {x for x in update.features if x.startswith("fy_")}
    assert "fy_canary" in fy and "fy_tier_canary" in fy and not {x for x in fy if x.startswith("fy_ok_")}
    order = [a.kind for a in res.plan.actions if getattr(a, "node", "gpu002") == "gpu002"]
    assert order.index("update") < order.index("resume") < order.index("submit_canary")
    (sub,) = res.plan.of_kind("submit_canary")
    assert sub.count == 2 and r.state.lifecycle["gpu002"].stage is Stage.CANARY
    return res, sub.token


def quiet_history_params(**over: object) -> Params:
    # the repeat-offender signals would keep a just-failed node yellow; mute them to see the stage tiers alone
    return Params(risk={"weights": {"gpu_repeat_offender": 0.0, "node_repeat_offender": 0.0}}, **over)


def test_xid79_full_rehabilitation_to_green():
    f = Fleet(10)
    r = Loop(f, quiet_history_params())
    _, token = to_canary(r, f)
    ok = (
        CanaryResult("gpu002", 501, token, "COMPLETED", 0),
        CanaryResult("gpu002", 502, token, "COMPLETED", 0),
    )
    res = r.tick(canary_results=ok[:1])
    assert (
        r.state.lifecycle["gpu002"].stage is Stage.CANARY and r.state.lifecycle["gpu002"].canary_passes == 1
    )
    res = r.tick(canary_results=ok)  # the first is re-sent: counted once
    assert r.state.lifecycle["gpu002"].stage is Stage.PROBATION
    res = r.tick()
    fy = set(res.nodes["gpu002"].fy_features)
    assert {"fy_tier_probation", "fy_ok_batch"} <= fy and "fy_ok_train" not in fy
    assert "lifecycle: probation" in explain("gpu002", res)
    r.step = 600.0
    res = r.until(r.state.lifecycle["gpu002"].since + 3600)
    lc = r.state.lifecycle["gpu002"]  # episode closed; kept only for its failure, still in the window
    assert lc.stage is Stage.IN_SERVICE and lc.cause is None and len(lc.failures) == 1
    assert res.nodes["gpu002"].tier.value == "green" and "fy_ok_train" in res.nodes["gpu002"].fy_features


def test_failed_canary_back_to_quarantine_and_cancelled():
    f = Fleet(10)
    r = Loop(f, quiet_history_params())
    _, token = to_canary(r, f)
    res = r.tick(canary_results=(CanaryResult("gpu002", 501, token, "FAILED", 3),))
    assert [k for k, n in kinds(res) if n == "gpu002"][-2:] == ["drain", "cancel_canary"]
    assert r.state.lifecycle["gpu002"].stage is Stage.QUARANTINED
    assert res.nodes["gpu002"].tier.value == "quarantined"


def test_quiet_corruption_in_probation_requarantines():
    f = Fleet(10)
    r = Loop(f, quiet_history_params())
    _, token = to_canary(r, f)
    ok = tuple(CanaryResult("gpu002", j, token, "COMPLETED", 0) for j in (501, 502))
    r.tick(canary_results=ok)
    assert r.state.lifecycle["gpu002"].stage is Stage.PROBATION
    f.push("gpu002", None, 1, r.now, kind="check_failed", message="dgemm mismatch")
    res = r.tick()
    (d,) = res.plan.of_kind("drain")
    assert d.node == "gpu002" and d.cause == "fatal"
    assert r.state.lifecycle["gpu002"].stage is Stage.QUARANTINED
    assert len(r.state.lifecycle["gpu002"].failures) == 2


def test_remediation_failure_escalates_and_one_fault_failing_every_canary_needs_a_human():
    f = Fleet(10)
    r = Loop(f, quiet_history_params())
    _, token = to_canary(r, f)
    r.tick(canary_results=(CanaryResult("gpu002", 501, token, "NODE_FAIL"),))  # the episode's fault again
    res = r.tick()  # drained again and empty: next rung
    assert "remediation 2/3" in res.plan.of_kind("reboot")[0].reason
    res = r.tick(failed_actions=(FailedAction("reboot", "gpu002", "scontrol: error"),))
    assert "remediation 3/3" in res.plan.of_kind("reboot")[0].reason  # escalated at once
    while not res.plan.of_kind("resume"):
        res = r.tick()
    token = res.plan.of_kind("submit_canary")[0].token
    res = r.tick(canary_results=(CanaryResult("gpu002", 601, token, "FAILED", 1),))
    # one fault, however many canaries saw it: one failure; the remediations ran out, a human decides
    lc = r.state.lifecycle["gpu002"]
    assert lc.stage is Stage.NEEDS_HUMAN and len(lc.failures) == 1
    (d,) = res.plan.of_kind("drain")
    assert d.cause == "needs_human" and "3 remediations failed" in d.reason
    res = r.tick()
    assert res.nodes["gpu002"].tier.value == "quarantined" and res.plan.of_kind("reboot") == ()


def power_cycling(r: Loop, f: Fleet) -> tuple[TickResult, float]:
    """XID 79 on gpu002 with the power-cycle-only ladder -> quarantine -> drained -> PowerCycle planned."""
    r.tick()
    f.push("gpu002", 79, 3, r.now)
    r.tick()
    res = r.tick()  # DRAINED (nothing ran on it): the ladder's only rung
    (pc,) = res.plan.of_kind("power_cycle")
    assert pc.node == "gpu002" and "remediation 1/2 (power_cycle)" in pc.reason
    return res, r.now


POWER_ONLY = {
    "power_cycle_enabled": True,
    "ladders": {"xid_79": ["power_cycle"]},
    "max_remediation_attempts": 2,
}


def test_power_cycle_off_the_tick_is_judged_only_once_it_finished():
    f = Fleet(10)
    r = Loop(f, quiet_history_params(lifecycle=POWER_ONLY))
    _, started = power_cycling(r, f)
    busy = frozenset({"gpu002"})
    # The BMC is still cycling: the agent keeps answering (the power is not cut yet, or the node is not up
    # again), and those fresh samples must not count as "back".
    while r.now < started + 600:
        res = r.tick(in_flight=busy)
        assert res.plan.of_kind("resume") == () and r.state.lifecycle["gpu002"].stage is Stage.REMEDIATING
    res = r.tick(confirmed_actions=(ConfirmedAction("power_cycle", "gpu002", "power cycled in 31.0s"),))
    confirmed = r.now
    attempt = r.state.lifecycle["gpu002"].attempts[-1]
    assert (attempt.started_at, attempt.deadline) == (confirmed, confirmed + 1200.0)
    assert res.plan.of_kind("resume") == ()
    res = r.until(confirmed + 90)  # within reboot_settle_s (120 s) of the power coming back: proves nothing
    assert res.plan.of_kind("resume") == ()
    res = r.until(confirmed + 150)
    while not res.plan.of_kind("resume"):
        res = r.tick()
    assert r.state.lifecycle["gpu002"].stage is Stage.CANARY and res.plan.of_kind("submit_canary")


def test_power_cycle_failing_off_the_tick_escalates_to_needs_human():
    f = Fleet(10)
    r = Loop(f, quiet_history_params(lifecycle=POWER_ONLY))
    power_cycling(r, f)
    err = "BmcAuthError: power_cycle on gpu002 via http://bmc:8000: credentials refused (401)"
    r.tick(in_flight=frozenset({"gpu002"}))
    res = r.tick(failed_actions=(FailedAction("power_cycle", "gpu002", err),))  # reported when done
    (pc,) = res.plan.of_kind("power_cycle")
    assert "remediation 2/2 (power_cycle)" in pc.reason
    res = r.tick(failed_actions=(FailedAction("power_cycle", "gpu002", err),))
    lc = r.state.lifecycle["gpu002"]
    assert lc.stage is Stage.NEEDS_HUMAN and res.plan.of_kind("power_cycle") == ()
    (d,) = res.plan.of_kind("drain")
    assert d.cause == "needs_human" and "power_cycle: failed, power_cycle: failed" in d.reason
    res = r.tick()
    assert res.nodes["gpu002"].tier.value == "quarantined" and res.plan.of_kind("resume") == ()


def test_retired_node_counts_against_the_drain_cap():
    """Issue 27 item 10: every node FleetYield holds drained counts, RETIRED included (it used to be
    exempt: 2 of 4 nodes drained by FleetYield under a 10%, min-1 cap). The new fault is held, not drained."""
    f = Fleet(10)  # cap: 1 node
    r = Loop(f)
    r.tick()
    f.slurm_update("gpu004", states=frozenset({"IDLE", "DRAIN"}), reason="fleetyield: RETIRED - RMA")
    from slurm_fleetyield.core.lifecycle import LifecycleMemory

    r.state = replace(
        r.state, lifecycle={"gpu004": LifecycleMemory("gpu004", Stage.RETIRED, r.now, failures=(r.now,))}
    )
    f.push("gpu006", 79, 0, r.now)
    res = r.tick()
    assert res.plan.of_kind("drain") == ()
    (hold,) = res.plan.holds
    assert (hold.node, hold.rule) == ("gpu006", "drain_cap") and "1 nodes already drained" in hold.detail
    # the admin repairs the retired node and resumes it: the cap has room, the held evidence drains
    f.slurm_update("gpu004", states=frozenset({"IDLE"}), reason="")
    assert [d.node for d in r.tick().plan.of_kind("drain")] == ["gpu006"]


def test_canary_node_counts_against_the_drain_cap():
    """A node resumed for canaries only is out of normal service: it holds its place under the cap."""
    f = Fleet(10)  # cap: 1 node
    r = Loop(f)
    r.tick()
    from slurm_fleetyield.core.lifecycle import LifecycleMemory

    canary = LifecycleMemory("gpu004", Stage.CANARY, r.now, canary_token="gpu004-1-0", until=r.now + 1800)
    r.state = replace(r.state, lifecycle={"gpu004": canary})
    f.push("gpu006", 79, 0, r.now)
    res = r.tick()
    assert res.plan.of_kind("drain") == ()
    assert [(h.node, h.rule) for h in res.plan.holds] == [("gpu006", "drain_cap")]


def test_a_canary_node_that_faults_again_is_drained_at_once_it_holds_its_own_place_under_the_cap():
    """The canary node is already counted: its own fatal drain takes no more room (CI: a node re-faulting in
    canary waited 3-4 s for its own slot on the 4-node docker cluster)."""
    f = Fleet(10)  # cap: 1 node
    r = Loop(f)
    r.tick()
    from slurm_fleetyield.core.lifecycle import LifecycleMemory

    canary = LifecycleMemory("gpu004", Stage.CANARY, r.now, canary_token="gpu004-1-0", until=r.now + 1800)
    r.state = replace(r.state, lifecycle={"gpu004": canary})
    f.push("gpu004", 79, 0, r.now)
    res = r.tick()
    assert [(d.node, d.cause) for d in res.plan.of_kind("drain")] == [("gpu004", "fatal")]
    assert not res.plan.holds


def test_admin_resume_of_a_quarantined_node_hands_it_back():
    f = Fleet(10)
    r = Loop(f)
    r.tick()
    f.run_job(1, ("gpu002",))
    f.push("gpu002", 48, 1, r.now)
    r.tick()
    r.tick()  # Slurm shows it drained by us now
    f.slurm_update("gpu002", states=frozenset({"IDLE"}), reason="")
    res = r.tick()
    assert "gpu002" not in r.state.lifecycle or r.state.lifecycle["gpu002"].stage is Stage.IN_SERVICE
    assert res.plan.of_kind("drain") == ()


# ---- settle ------------------------------------------------------------------------------------------------


def test_ledger_completed_fault_killed_never_checkpointed_and_premium_misuse():
    f = Fleet(10)
    r = Loop(f)
    r.tick()
    t = r.now
    # premium-needing work waits from t+30 to t+90 (two ticks)
    f.jobs = [JobView(9, "PENDING", (), True, WorkloadClass.PRETRAIN, 64)]
    r.tick()
    r.tick()
    f.jobs = []
    r.tick()
    f.push("gpu003", 79, 2, t + 100)
    r.tick()  # the fault is acted on (drain); the job outcomes arrive next tick
    outcomes = (
        JobOutcome(
            1, ("gpu001",), 8, WorkloadClass.BATCH, t - 1000, t + 120, "COMPLETED", 0, None, "u", True
        ),
        JobOutcome(2, ("gpu003",), 8, WorkloadClass.PRETRAIN, t - 500, t + 100, "FAILED", 1, t - 100),
        JobOutcome(3, ("gpu003",), 4, WorkloadClass.FINETUNE, t - 200, t + 100, "NODE_FAIL", None, None),
        JobOutcome(4, ("gpu005",), 2, WorkloadClass.BATCH, t - 50, t + 20, "FAILED", 1, t),
    )
    res = r.tick(outcomes=outcomes)
    by = {e.job_id: e for e in res.ledger}
    assert (by[1].useful_gpu_s, by[1].wasted_gpu_s, by[1].failure) == (8 * 1120, 0.0, False)
    assert by[1].premium_misuse_gpu_s == 8 * 60  # batch on premium while pretrain waited 60 s
    assert (by[2].useful_gpu_s, by[2].wasted_gpu_s, by[2].cause) == (8 * 400, 8 * 200, "hardware")
    assert (by[3].useful_gpu_s, by[3].wasted_gpu_s, by[3].cause) == (0.0, 4 * 300, "node_fail")
    assert (by[4].useful_gpu_s, by[4].wasted_gpu_s, by[4].cause) == (2 * 50, 0.0, "job")  # not hardware
    assert by[2].premium_misuse_gpu_s == 0.0  # premium-needing work is never misuse
    assert r.tick(outcomes=outcomes).ledger == ()  # settled once


# ---- lemons and learning -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("window_days", "lemon"), [(30.0, True), (1.0, False)])
def test_lemon_loses_gang_and_premium_class_features(window_days: float, lemon: bool):
    f = Fleet(4)
    r = Loop(f, quiet_history_params(learn={"lemon_window_s": window_days * 86_400.0}))
    r.tick()
    m = r.state.nodes["gpu001"]
    history = ((r.now - 5 * 86_400.0, "GPU-gpu001-0"), (r.now - 2 * 86_400.0, "GPU-gpu001-1"))
    r.state = replace(r.state, nodes={**r.state.nodes, "gpu001": replace(m, fatal_history=history)})
    res = r.tick()
    fy = set(res.nodes["gpu001"].fy_features)
    assert res.nodes["gpu001"].tier.value == "green"
    assert ("fy_ok_train" not in fy) is lemon and ("fy_ok_finetune" not in fy) is lemon
    assert ("fy_lemon" in fy) is lemon and "fy_ok_batch" in fy
    assert ("lemon: repeated fatal failures" in explain("gpu001", res)) is lemon


def test_learned_multiplier_scales_risk_and_shows_in_explain():
    f = Fleet(2)
    r = Loop(f)
    base = r.tick().risks["gpu000"].probability
    r.state = replace(r.state, learn=replace(r.state.learn, multipliers={"base": 3.0}))
    res = r.tick()
    p = res.risks["gpu000"].probability
    assert p == pytest.approx(1 - (1 - base) ** 3, rel=1e-9)
    assert "learned hazard multipliers: base x3.00" in explain("gpu000", res)
    off = Loop(Fleet(2), Params(learn={"enabled": False}))
    off.tick()
    off.state = replace(off.state, learn=replace(off.state.learn, multipliers={"base": 3.0}))
    assert off.tick().risks["gpu000"].probability == pytest.approx(base)


# ---- checkpoint signals (stake.classes.<class>.checkpoint_signals) ---------------------------------------


@pytest.mark.parametrize("convention", [True, False])
def test_a_gang_that_follows_the_checkpoint_signal_convention_checkpoints_at_the_proposal_and_at_the_drain(
    convention: bool,
) -> None:
    """With the convention: USR2 (checkpoint now, keep running) goes out with the proposal, before any
    approval; the approved drain then does not requeue the gang but signals USR1 (checkpoint and requeue
    yourself) right after the drain. Without it: no signal, the drain requeues the job as before."""
    convention_of = "steps" if convention else "off"
    classes = {"pretrain": {"checkpoint_s": 3600.0, "checkpoint_signals": convention_of}}
    r = Loop(Fleet(1), Params(stake={"classes": classes}))
    f = Fleet(10)
    f.jobs.append(JobView(7, "RUNNING", ("gpu001", "gpu002"), True, WorkloadClass.PRETRAIN, 16))
    f.run_job(8, ("gpu001",), requeue=True)  # no class: never signalled
    r.fleet = f
    r.tick()
    degrade(f)
    res = r.tick()
    (p,) = res.plan.of_kind("propose_drain")
    signals = res.plan.of_kind("signal")
    assert [(a.node, a.jobs, a.signal) for a in signals] == ([("gpu001", (7,), "USR2")] if convention else [])
    if convention:
        assert kinds(res).index(("signal", "gpu001")) > kinds(res).index(("propose_drain", "gpu001"))
    res = r.tick(gate_decisions=(GateDecision(p.proposal_id, "gpu001", "approve", "alice", r.now),))
    (d,) = res.plan.of_kind("drain")
    assert d.requeue_jobs == ((8,) if convention else (7, 8))
    after = res.plan.of_kind("signal")
    assert [(a.jobs, a.signal) for a in after] == ([((7,), "USR1")] if convention else [])
    if convention:  # after the drain, so the job cannot requeue itself back onto this node
        assert kinds(res).index(("signal", "gpu001")) > kinds(res).index(("drain", "gpu001"))


# ---- issue 27 item 9: false RMA on counters a reset cannot clear -------------------------------------------


def scarred(f: Fleet, node: str = "gpu001", gpu: int = 3) -> None:
    """An ECC fault that left its scar: uncorrectable rows remapped and the remapper out of rows (levels no
    reset clears), grown within the trend window. After that nothing moves: the fault is gone."""
    f.set(node, gpu, s.ROWS_UNCORR, 6)
    f.set(node, gpu, s.REMAP_FAILURE, 1)
    f.bump(node, gpu, s.ROWS_UNCORR, 2)


def rebooted_back(r: Loop) -> TickResult:
    """Ticks until the lifecycle resumes the node for its canaries (the reboot's settle time included)."""
    deadline = r.now + r.params.lifecycle.remediation_timeout_s[Remediation.REBOOT]
    res = r.tick()
    while not res.plan.of_kind("resume"):
        assert r.now < deadline and r.state.lifecycle["gpu001"].stage is Stage.REMEDIATING
        res = r.tick()
    return res


def test_approved_ecc_drain_with_counters_no_reset_clears_ends_in_service_not_retired():
    """The docker scenario of issue 27: an approved ECC drain; the fault is gone after the reboot, but the
    remap counters stay. Each canary round used to read the scar as "incident in canary: risk >= red": three
    rounds, RETIRED - RMA within minutes. A counter that did not move since the remediation is no incident:
    the canaries decide, the node passes probation and is back in service."""
    f = Fleet(10)
    r = Loop(f)
    r.tick()
    scarred(f)
    res = r.tick()
    assert res.risks["gpu001"].probability >= 0.5
    (p,) = res.plan.of_kind("propose_drain")
    res = r.tick(gate_decisions=(GateDecision(p.proposal_id, "gpu001", "approve", "alice", r.now),))
    assert [d.cause for d in res.plan.of_kind("drain")] == ["approved"]
    res = r.tick()
    assert res.plan.of_kind("reboot") and r.state.lifecycle["gpu001"].stage is Stage.REMEDIATING
    for round_ in range(3):  # three canary rounds: none of them sees an incident
        res = rebooted_back(r) if round_ == 0 else r.tick()
        lc = r.state.lifecycle["gpu001"]
        assert lc.stage in (Stage.CANARY, Stage.PROBATION), lc
        assert res.risks["gpu001"].probability >= 0.5  # still red on the scar: the premise
        assert not [e for e in res.events if "incident" in e.message], res.events
    token = r.state.lifecycle["gpu001"].canary_token
    ok = tuple(CanaryResult("gpu001", j, token, "COMPLETED", 0) for j in (801, 802))
    r.tick(canary_results=ok)
    assert r.state.lifecycle["gpu001"].stage is Stage.PROBATION
    r.until(r.now + r.params.lifecycle.probation_s + 60)
    lc = r.state.lifecycle.get("gpu001")
    assert lc is None or lc.stage is Stage.IN_SERVICE, lc  # back in service; red again: the gate asks anew
    assert lc is None or lc.failures == ()


def test_a_counter_that_grows_after_the_remediation_is_an_incident():
    """The same scar, then rows remapped again after the reboot: evidence of a fault after the remediation."""
    f = Fleet(10)
    r = Loop(f)
    r.tick()
    scarred(f)
    (p,) = r.tick().plan.of_kind("propose_drain")
    r.tick(gate_decisions=(GateDecision(p.proposal_id, "gpu001", "approve", "alice", r.now),))
    r.tick()
    rebooted_back(r)
    assert r.state.lifecycle["gpu001"].stage is Stage.CANARY
    f.bump("gpu001", 3, s.ROWS_UNCORR, 1)
    res = r.tick()
    (inc,) = [e for e in res.events if e.message.startswith("incident ->")]
    assert "since the remediation" in inc.message, inc.message
    lc = r.state.lifecycle["gpu001"]
    assert lc.stage is Stage.QUARANTINED and lc.faults == ("incident:gpu3:uncorrectable_remapped_rows",)
