import itertools
import json

import pytest
from pydantic import ValidationError

from slurm_fleetyield.core.lifecycle import (
    DEFAULT_LADDERS,
    TRANSITIONS,
    Event,
    EventKind,
    LifecycleMemory,
    LifecycleParams,
    Remediation,
    Stage,
    step,
    tier_for,
    transition_table_markdown,
)
from slurm_fleetyield.core.model import Envelope, Tier
from slurm_fleetyield.core.plan import DrainNode, ResumeNode
from slurm_fleetyield.core.rehab_actions import (
    CancelCanaries,
    PowerCycle,
    RebootNode,
    ResetGpu,
    SubmitCanary,
)
from slurm_fleetyield.core.route import fy_features

S, K = Stage, EventKind
P = LifecycleParams()
T0 = 1_000_000.0
DAY = 86_400.0
NODE = "gpu001"


def go(m, event, now, p=P):
    """Apply an event that must be accepted; returns the transition."""
    t = step(m, event, now, p)
    assert t.accepted, t.log
    return t


def ev(kind):
    return Event(kind)


def in_stage(stage: Stage) -> LifecycleMemory:
    """A memory in ``stage``, reached through real transitions (XID 48 gpu 2: the reset-first ladder)."""
    m = LifecycleMemory(NODE)
    if stage is S.IN_SERVICE:
        return m
    if stage is S.RETIRED:
        m = LifecycleMemory(NODE, failures=(T0 - 2 * DAY, T0 - DAY))
        return go(m, Event.fatal("xid", 79, 3), T0).memory
    m = go(m, Event.fatal("xid", 48, 2), T0).memory
    if stage is S.QUARANTINED:
        return m
    m = go(m, ev(K.DRAINED), T0 + 10).memory
    if stage is S.REMEDIATING:
        return m
    if stage is S.NEEDS_HUMAN:
        for i in range(P.max_remediation_attempts):
            m = go(m, ev(K.REMEDIATION_FAILED), T0 + 20 + i).memory
        return m
    m = go(m, ev(K.REMEDIATION_OK), T0 + 100).memory
    if stage is S.CANARY:
        return m
    for job in (901, 902):
        m = go(m, Event.canary(True, m.canary_token, job), T0 + 200 + job).memory
    assert stage is S.PROBATION
    return m


def event_for(kind: EventKind, m: LifecycleMemory) -> Event:
    return {
        K.FATAL: Event.fatal("xid", 79, 3),
        K.APPROVED_DRAIN: Event.approved("p-17", (42,)),
        K.CANARY_PASSED: Event.canary(True, m.canary_token, 903),
        K.CANARY_FAILED: Event.canary(False, m.canary_token, 904, "gpu 2 wrong answer"),
        K.INCIDENT: Event.incident("risk 0.71 >= red 0.5", (43,)),
    }.get(kind, Event(kind))


LATE = T0 + DAY  # past every deadline (remediation, canary, probation), inside the failure window

# The oracle, written independently of the module: for each accepted pair, from the representative memory
# of in_stage() at time LATE, the next stage and the kinds of the actions. Every other pair is rejected.
EXPECTED = {
    (S.IN_SERVICE, K.FATAL): (S.QUARANTINED, ()),
    (S.IN_SERVICE, K.APPROVED_DRAIN): (S.QUARANTINED, ("drain",)),
    (S.IN_SERVICE, K.TICK): (S.IN_SERVICE, ()),
    (S.QUARANTINED, K.DRAINED): (S.REMEDIATING, ("drain", "reset_gpu")),
    (S.QUARANTINED, K.ADMIN_RESUMED): (S.IN_SERVICE, ()),
    (S.QUARANTINED, K.ADMIN_DRAINED): (S.IN_SERVICE, ()),
    (S.QUARANTINED, K.TICK): (S.QUARANTINED, ()),
    (S.REMEDIATING, K.REMEDIATION_STARTED): (S.REMEDIATING, ()),
    (S.REMEDIATING, K.REMEDIATION_OK): (S.CANARY, ("resume", "submit_canary")),
    (S.REMEDIATING, K.REMEDIATION_FAILED): (S.REMEDIATING, ("drain", "reboot")),
    (S.REMEDIATING, K.REMEDIATION_TIMEOUT): (S.REMEDIATING, ("drain", "reboot")),
    (S.REMEDIATING, K.ADMIN_DRAINED): (S.IN_SERVICE, ()),
    (S.REMEDIATING, K.TICK): (S.REMEDIATING, ("drain", "reboot")),
    (S.CANARY, K.CANARY_PASSED): (S.CANARY, ()),
    (S.CANARY, K.CANARY_FAILED): (S.QUARANTINED, ("cancel_canary", "drain")),
    (S.CANARY, K.CANARY_TIMEOUT): (S.QUARANTINED, ("cancel_canary", "drain")),
    (S.CANARY, K.FATAL): (S.QUARANTINED, ("cancel_canary",)),
    (S.CANARY, K.INCIDENT): (S.QUARANTINED, ("cancel_canary", "drain")),
    (S.CANARY, K.APPROVED_DRAIN): (S.QUARANTINED, ("cancel_canary", "drain")),
    (S.CANARY, K.ADMIN_DRAINED): (S.IN_SERVICE, ("cancel_canary",)),
    (S.CANARY, K.TICK): (S.QUARANTINED, ("cancel_canary", "drain")),
    (S.PROBATION, K.PROBATION_ELAPSED): (S.IN_SERVICE, ()),
    (S.PROBATION, K.FATAL): (S.QUARANTINED, ()),
    (S.PROBATION, K.INCIDENT): (S.QUARANTINED, ("drain",)),
    (S.PROBATION, K.APPROVED_DRAIN): (S.QUARANTINED, ("drain",)),
    (S.PROBATION, K.ADMIN_DRAINED): (S.IN_SERVICE, ()),
    (S.PROBATION, K.TICK): (S.IN_SERVICE, ()),
    (S.RETIRED, K.ADMIN_RESUMED): (S.IN_SERVICE, ()),
    (S.RETIRED, K.ADMIN_DRAINED): (S.IN_SERVICE, ()),
    (S.RETIRED, K.TICK): (S.RETIRED, ()),
    (S.NEEDS_HUMAN, K.ADMIN_RESUMED): (S.IN_SERVICE, ()),
    (S.NEEDS_HUMAN, K.ADMIN_DRAINED): (S.IN_SERVICE, ()),
    (S.NEEDS_HUMAN, K.TICK): (S.NEEDS_HUMAN, ()),
}


def test_the_table_lists_exactly_the_expected_pairs():
    assert set(TRANSITIONS) == set(EXPECTED)


@pytest.mark.parametrize(("stage", "kind"), list(itertools.product(Stage, EventKind)))
def test_every_stage_event_pair(stage, kind):
    m = in_stage(stage)
    assert m.stage is stage
    t = step(m, event_for(kind, m), LATE, P)
    if (stage, kind) in EXPECTED:
        want_stage, want_actions = EXPECTED[(stage, kind)]
        assert t.accepted, t.log
        assert t.memory.stage is want_stage
        assert t.memory.stage in TRANSITIONS[(stage, kind)].to
        assert tuple(a.kind for a in t.actions) == want_actions
        for a in t.actions:
            assert a.node == NODE
            if isinstance(a, DrainNode | RebootNode | ResumeNode | ResetGpu | PowerCycle):
                assert a.reason.startswith("fleetyield:") and len(a.reason) <= 120, a.reason
        assert step(m, event_for(kind, m), LATE, P) == t  # pure: same inputs, same output
    else:
        assert not t.accepted
        assert t.memory is m and t.actions == ()
        (log,) = t.log
        assert log.kind == "lifecycle_rejected" and log.node == NODE
        assert kind.value in log.message and stage.value in log.message


@pytest.mark.parametrize(
    ("stage", "kind"),
    [
        (S.REMEDIATING, K.REMEDIATION_TIMEOUT),
        (S.CANARY, K.CANARY_TIMEOUT),
        (S.PROBATION, K.PROBATION_ELAPSED),
    ],
)
def test_time_events_before_their_deadline_are_rejected_and_tick_is_a_no_op(stage, kind):
    m = in_stage(stage)
    early = m.since + 1
    t = step(m, ev(kind), early, P)
    assert not t.accepted and t.memory is m and t.actions == ()
    assert "not reached" in t.log[0].message or "lasts until" in t.log[0].message
    tick = step(m, ev(K.TICK), early, P)
    assert tick.accepted and tick.memory == m and tick.actions == () and tick.log == ()


def test_happy_path_xid79_reboot_canary_twice_probation_green():
    m = LifecycleMemory(NODE)
    t = go(m, Event.fatal("xid", 79, 3), T0)
    assert t.memory.stage is S.QUARANTINED and t.actions == ()  # quarantine.decide did the drain
    assert tier_for(t.memory.stage, Tier.GREEN) is Tier.QUARANTINED

    t = go(t.memory, ev(K.DRAINED), T0 + 30)
    reason = "fleetyield: XID 79 gpu 3; quarantined, remediation 1/3 (reboot)"
    assert t.actions == (
        DrainNode(NODE, reason, cause="rehab"),
        # the intent names the decision (node, the memory it was made from, attempt, rung): a replay of
        # this step from the same memory (a crash before the commit) makes the same one (executor.py)
        RebootNode(NODE, reason, intent=f"{NODE}/{T0!r}/1/reboot"),
    )
    assert step(t.memory, ev(K.TICK), T0 + 31, P).actions == ()
    assert t.actions[1].next_state is None  # Slurm must keep the drain: we resume, not the reboot
    assert t.memory.stage is S.REMEDIATING and t.memory.reason == reason
    assert tier_for(t.memory.stage, Tier.GREEN) is Tier.QUARANTINED
    assert go(t.memory, ev(K.TICK), T0 + 30 + 899).memory.stage is S.REMEDIATING  # reboot: 900 s

    t = go(t.memory, ev(K.REMEDIATION_OK), T0 + 400)
    resume, submit = t.actions
    assert isinstance(resume, ResumeNode) and resume.node == NODE
    assert isinstance(submit, SubmitCanary) and submit.count == 2 and submit.token == t.memory.canary_token
    assert submit.job_name == f"fy_canary_{submit.token}"
    assert t.memory.stage is S.CANARY and tier_for(S.CANARY, Tier.GREEN) is Tier.CANARY

    token = t.memory.canary_token
    t = go(t.memory, Event.canary(True, token, 5001), T0 + 500)
    assert t.memory.stage is S.CANARY and t.memory.canary_passes == 1
    assert "1/2 passed" in t.memory.reason
    again = step(t.memory, Event.canary(True, token, 5001), T0 + 501, P)
    assert not again.accepted and "already counted" in again.log[0].message
    t = go(t.memory, Event.canary(True, token, 5002), T0 + 600)
    assert t.memory.stage is S.PROBATION and t.memory.until == T0 + 600 + 3600
    assert t.memory.canary_jobs == (5001, 5002) and t.actions == ()
    assert tier_for(S.PROBATION, Tier.GREEN) is Tier.PROBATION

    assert go(t.memory, ev(K.TICK), T0 + 600 + 3599).memory.stage is S.PROBATION
    t = go(t.memory, ev(K.TICK), T0 + 600 + 3600)
    assert t.memory.stage is S.IN_SERVICE
    assert t.memory.cause is None and t.memory.attempts == () and t.memory.until is None
    assert t.memory.failures == (T0,)  # the fault still counts toward retirement for a week
    assert tier_for(S.IN_SERVICE, Tier.YELLOW) is Tier.YELLOW
    assert not t.memory.forgettable
    assert go(t.memory, ev(K.TICK), T0 + 8 * DAY).memory.forgettable


def test_a_driver_recovery_request_starts_the_ladder_with_what_it_asked_for():
    t = go(go(LifecycleMemory(NODE), Event.fatal("recovery_gpu_reset", None, 2, "GPU reset"), T0).memory,
           ev(K.DRAINED), T0 + 10)  # fmt: skip
    assert t.actions[1] == ResetGpu(NODE, (2,), t.memory.reason, f"{NODE}/{T0!r}/1/gpu_reset")
    t = go(go(LifecycleMemory(NODE), Event.fatal("recovery_node_reboot", None, 2, "node reboot"), T0).memory,
           ev(K.DRAINED), T0 + 10)  # fmt: skip
    assert isinstance(t.actions[1], RebootNode) and "remediation 1/3 (reboot)" in t.memory.reason, t.memory
    assert t.memory.reason.startswith("fleetyield: driver requests node reboot gpu 2; quarantined")


def test_quiet_corruption_reset_canary_fails_back_to_quarantine_then_reboot_then_needs_human():
    """The failed canaries are the episode's fault surviving the reset and the reboots: one fault, one
    failure (issue 27 item 9), so the remediations run out (NEEDS_HUMAN), not the RMA count."""
    m = go(LifecycleMemory(NODE), Event.fatal("check_failed", gpu=2), T0).memory
    t = go(m, ev(K.DRAINED), T0 + 10)
    assert t.actions[1] == ResetGpu(NODE, (2,), t.memory.reason, f"{NODE}/{T0!r}/1/gpu_reset")
    assert "remediation 1/3 (gpu_reset)" in t.memory.reason
    t = go(t.memory, ev(K.REMEDIATION_OK), T0 + 60)
    token = t.memory.canary_token

    t = go(t.memory, Event.canary(False, token, 7001, "gpu 2: wrong answer"), T0 + 120)
    assert t.memory.stage is S.QUARANTINED
    assert t.actions == (
        CancelCanaries(NODE, token),
        DrainNode(NODE, "fleetyield: canary job 7001 failed gpu 2: wrong answer", cause="rehab"),
    )
    assert t.memory.failures == (T0,) and t.memory.faults == ("check_failed:gpu2",)
    assert t.memory.attempts[-1].outcome == "canary_failed"

    t = go(t.memory, ev(K.DRAINED), T0 + 300)  # escalated: the reset did not help
    assert isinstance(t.actions[1], RebootNode) and "remediation 2/3 (reboot)" in t.memory.reason
    t = go(t.memory, ev(K.REMEDIATION_OK), T0 + 900)
    stale = step(t.memory, Event.canary(False, token, 7002), T0 + 901, P)
    assert not stale.accepted and "not the current round" in stale.log[0].message

    t = go(t.memory, Event.canary(False, t.memory.canary_token, 7003, "gpu 2: wrong answer"), T0 + 960)
    assert t.memory.stage is S.QUARANTINED and t.memory.failures == (T0,)
    t = go(t.memory, ev(K.DRAINED), T0 + 1000)
    assert "remediation 3/3 (reboot)" in t.memory.reason
    t = go(t.memory, ev(K.REMEDIATION_OK), T0 + 1900)
    t = go(t.memory, Event.canary(False, t.memory.canary_token, 7004, "gpu 2: wrong answer"), T0 + 1960)
    assert t.memory.stage is S.NEEDS_HUMAN and t.memory.failures == (T0,)
    drain = t.actions[-1]
    assert isinstance(drain, DrainNode) and drain.cause == "needs_human"
    assert "reboot: canary_failed" in drain.reason


def test_three_distinct_faults_in_the_window_retire():
    m = go(LifecycleMemory(NODE), Event.fatal("check_failed", gpu=2), T0).memory
    t = go(m, ev(K.DRAINED), T0 + 10)
    t = go(t.memory, ev(K.REMEDIATION_OK), T0 + 60)
    t = go(t.memory, Event.fatal("xid", 79, 5), T0 + 120)  # another fault, another GPU: a second strike
    assert t.memory.stage is S.QUARANTINED and t.memory.faults == ("check_failed:gpu2", "xid_79:gpu5")
    t = go(t.memory, ev(K.DRAINED), T0 + 300)
    t = go(t.memory, ev(K.REMEDIATION_OK), T0 + 900)
    t = go(t.memory, Event.incident("risk 0.9 >= red 0.5", key="incident:gpu1:remap_growth"), T0 + 960)
    assert t.memory.stage is S.RETIRED
    drain = t.actions[-1]
    assert isinstance(drain, DrainNode) and drain.cause == "retire"
    assert drain.reason == "fleetyield: RETIRED after 3 failures in 7d - RMA (check failed gpu 2)"
    assert tier_for(S.RETIRED, Tier.GREEN) is Tier.RETIRED
    for kind in EventKind:  # retired is terminal for everything but a human
        if kind not in (K.ADMIN_RESUMED, K.ADMIN_DRAINED, K.TICK):
            assert not step(t.memory, event_for(kind, t.memory), T0 + 2000, P).accepted


def test_one_fault_seen_by_many_checks_is_one_failure():
    """Issue 27 item 9: the same incident after each of three reboots (one fault) never retires the node."""
    m = go(LifecycleMemory(NODE), Event.approved("p-0123456789ab"), T0).memory
    assert m.failures == ()  # an approved drain is no evidence against the GPU
    now = T0
    for _ in range(3):
        now += 10
        t = go(m, ev(K.DRAINED), now)
        if t.memory.stage is S.NEEDS_HUMAN:
            break
        t = go(t.memory, ev(K.REMEDIATION_OK), now + 1)
        t = go(t.memory, Event.incident("risk 0.9 >= red 0.5", key="incident:gpu2:remap_growth"), now + 2)
        m = t.memory
        assert m.stage is not S.RETIRED and len(m.failures) == 1
    assert m.stage is S.NEEDS_HUMAN and m.failures == (T0 + 12,)


def test_escalation_reset_reboot_then_needs_human():
    m = go(LifecycleMemory(NODE), Event.fatal("xid", 48, 5), T0).memory
    t = go(m, ev(K.DRAINED), T0 + 10)
    assert isinstance(t.actions[1], ResetGpu)
    t = go(t.memory, ev(K.REMEDIATION_FAILED), T0 + 20)
    assert isinstance(t.actions[1], RebootNode) and "remediation 2/3 (reboot)" in t.memory.reason
    deadline = t.memory.attempts[-1].deadline
    assert deadline == T0 + 20 + 900
    t = go(t.memory, ev(K.TICK), deadline)  # timeout derived from now
    assert isinstance(t.actions[1], RebootNode) and "remediation 3/3 (reboot)" in t.memory.reason
    t = go(t.memory, ev(K.REMEDIATION_FAILED), deadline + 30)
    assert t.memory.stage is S.NEEDS_HUMAN
    (drain,) = t.actions
    assert drain.cause == "needs_human"
    assert drain.reason == (
        "fleetyield: needs a human; 3 remediations failed "
        "(gpu_reset: failed, reboot: timeout, reboot: failed)"
    )
    assert t.memory.failures == (T0,)  # remediation trouble is no evidence against the GPU
    assert tier_for(S.NEEDS_HUMAN, Tier.GREEN) is Tier.QUARANTINED


def test_power_cycle_is_the_top_rung_only_when_enabled():
    p = LifecycleParams(power_cycle_enabled=True)
    m = go(LifecycleMemory(NODE), Event.fatal("xid", 48, 5), T0, p).memory
    kinds = []
    t = go(m, ev(K.DRAINED), T0 + 1, p)
    kinds.append(t.actions[1].kind)
    for i in range(2):
        t = go(t.memory, ev(K.REMEDIATION_FAILED), T0 + 2 + i, p)
        kinds.append(t.actions[-1].kind)
    assert kinds == ["reset_gpu", "reboot", "power_cycle"]
    assert t.memory.attempts[-1].deadline == T0 + 3 + 1200

    m = go(LifecycleMemory(NODE), Event.fatal("gpu_missing"), T0, p).memory
    t = go(m, ev(K.DRAINED), T0 + 1, p)
    assert isinstance(t.actions[1], RebootNode)
    t = go(t.memory, ev(K.REMEDIATION_TIMEOUT), T0 + 1 + 900, p)
    assert t.actions[1] == PowerCycle(NODE, t.memory.reason, t.actions[1].intent)
    assert t.actions[1].intent.endswith("/2/power_cycle")
    assert P.ladder("gpu_missing") == (Remediation.REBOOT,)  # default: power cycle off


def test_failures_outside_the_window_do_not_count():
    old = LifecycleMemory(NODE, failures=(T0 - 8 * DAY, T0 - DAY))
    t = go(old, Event.fatal("xid", 79), T0)
    assert t.memory.stage is S.QUARANTINED and t.memory.failures == (T0 - DAY, T0)
    recent = LifecycleMemory(NODE, failures=(T0 - 6 * DAY, T0 - DAY))
    t = go(recent, Event.fatal("xid", 79), T0)
    assert t.memory.stage is S.RETIRED
    assert t.actions == (DrainNode(NODE, t.memory.reason, cause="retire"),)
    assert t.memory.reason == "fleetyield: RETIRED after 3 failures in 7d - RMA (XID 79)"


def test_incident_in_probation_drains_with_requeue_and_counts_as_failure():
    m = in_stage(S.PROBATION)
    t = go(m, Event.incident("risk 0.8 >= red 0.5", (11, 12)), m.since + 60)
    assert t.memory.stage is S.QUARANTINED and len(t.memory.failures) == 2
    (drain,) = t.actions
    assert drain.requeue_jobs == (11, 12) and drain.reason.startswith("fleetyield: incident in probation")
    assert t.memory.attempts[-1].outcome == "incident_in_probation"
    t = go(t.memory, ev(K.DRAINED), m.since + 600)
    assert isinstance(t.actions[1], RebootNode)  # the reset held only until probation: escalate


def test_canary_timeout_is_an_attempt_but_not_a_failure():
    m = in_stage(S.CANARY)
    t = go(m, ev(K.TICK), m.until)
    assert t.memory.stage is S.QUARANTINED
    assert t.memory.failures == m.failures
    assert t.memory.attempts[-1].outcome == "canary_timeout"
    assert t.actions[0] == CancelCanaries(NODE, m.canary_token)


def test_approved_drain_quarantines_without_a_failure_and_reboots_first():
    t = go(LifecycleMemory(NODE), Event.approved("p-9", (21,)), T0)
    assert t.memory.stage is S.QUARANTINED and t.memory.failures == ()
    assert t.actions == (DrainNode(NODE, "fleetyield: approved drain p-9; quarantined", (21,), "approved"),)
    t = go(t.memory, ev(K.DRAINED), T0 + 5)
    assert isinstance(t.actions[1], RebootNode)


def test_admin_resume_and_drain_are_accepted_and_hand_off():
    q = in_stage(S.QUARANTINED)
    t = go(q, ev(K.ADMIN_RESUMED), T0 + 50)
    assert t.memory.stage is S.IN_SERVICE and t.memory.failures == q.failures and t.actions == ()
    retired = in_stage(S.RETIRED)
    assert go(retired, ev(K.ADMIN_RESUMED), T0 + 50).memory.failures == ()  # repaired: fresh start
    assert go(retired, ev(K.ADMIN_DRAINED), T0 + 50).memory.failures == retired.failures
    c = in_stage(S.CANARY)
    t = go(c, ev(K.ADMIN_DRAINED), T0 + 500)
    assert t.memory.stage is S.IN_SERVICE and t.actions == (CancelCanaries(NODE, c.canary_token),)
    r = step(in_stage(S.REMEDIATING), ev(K.ADMIN_RESUMED), T0 + 50, P)
    assert not r.accepted and "reboot" in r.log[0].message


def test_remediation_started_restarts_the_deadline_from_the_confirmation():
    m = in_stage(S.REMEDIATING)
    t = go(m, ev(K.REMEDIATION_STARTED), T0 + 200)
    assert t.memory.attempts[-1].deadline == T0 + 200 + 300
    assert step(t.memory, ev(K.REMEDIATION_TIMEOUT), T0 + 10 + 300, P).accepted is False


def test_lowered_max_attempts_goes_to_needs_human_instead_of_overshooting():
    m = in_stage(S.REMEDIATING)
    m = go(m, ev(K.REMEDIATION_OK), T0 + 60).memory
    m = go(m, Event.canary(False, m.canary_token, 1), T0 + 90).memory
    assert m.stage is S.QUARANTINED
    t = go(m, ev(K.DRAINED), T0 + 100, LifecycleParams(max_remediation_attempts=1))
    assert t.memory.stage is S.NEEDS_HUMAN


@pytest.mark.parametrize("stage", list(Stage))
def test_memory_json_round_trip(stage):
    m = in_stage(stage)
    assert LifecycleMemory.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_no_stage_before_probation_admits_normal_work():
    full = Envelope(premium=False, nvlink=True, nvlink_full=True, hbm_full=True, known=True)
    for stage in (S.QUARANTINED, S.REMEDIATING, S.CANARY, S.NEEDS_HUMAN, S.RETIRED):
        features = fy_features(tier_for(stage, Tier.GREEN), full)
        assert not [f for f in features if f.startswith("fy_ok_")], (stage, features)
    assert "fy_canary" in fy_features(tier_for(S.CANARY, Tier.GREEN), full)
    assert "fy_ok_batch" in fy_features(tier_for(S.PROBATION, Tier.GREEN), full)
    assert "fy_ok_train" not in fy_features(tier_for(S.PROBATION, Tier.GREEN), full)


def test_params_defaults_and_descriptions():
    assert (P.canary_passes_required, P.probation_s, P.max_failures) == (2, 3600, 3)
    assert P.failure_window_s == 7 * DAY and P.max_remediation_attempts == 3
    assert P.remediation_timeout_s[Remediation.REBOOT] == 900 and not P.power_cycle_enabled
    assert P.ladders == dict(DEFAULT_LADDERS)
    for name, f in LifecycleParams.model_fields.items():
        assert f.description, name


def test_params_partial_overrides_keep_other_defaults():
    p = LifecycleParams.model_validate(
        {"remediation_timeout_s": {"reboot": 60}, "ladders": {"xid_79": ["gpu_reset", "reboot"]}}
    )
    assert p.remediation_timeout_s[Remediation.REBOOT] == 60
    assert p.remediation_timeout_s[Remediation.GPU_RESET] == 300
    assert p.ladder("xid_79") == (Remediation.GPU_RESET, Remediation.REBOOT)
    assert p.ladder("xid_48") == (Remediation.GPU_RESET, Remediation.REBOOT)
    assert p.ladder("xid_13") == (Remediation.REBOOT,)  # no own ladder: default


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"ladders": {"xid79": ["reboot"]}}, "xid79"),
        ({"ladders": {"xid_79": []}}, "xid_79"),
        ({"ladders": {"xid_79": ["reboot", "reboot"]}}, "distinct"),
        ({"ladders": {"xid_79": ["reflash"]}}, "reflash"),
        ({"ladders": {"alert": ["power_cycle"]}}, "power_cycle_enabled is false"),
        ({"remediation_timeout_s": {"reboot": 0}}, "reboot"),
        ({"remediation_timeout_s": {"reboot": float("inf")}}, "inf"),
        ({"canary_passes_required": 0}, "canary_passes_required"),
        ({"probation_s": -1}, "probation_s"),
        ({"max_failures": 0}, "max_failures"),
        ({"canary_pases_required": 2}, "canary_pases_required"),
    ],
)
def test_params_validation_errors_name_the_bad_value(data, match):
    with pytest.raises(ValidationError, match=match):
        LifecycleParams.model_validate(data)


def test_power_cycle_only_ladder_is_fine_when_enabled():
    p = LifecycleParams(power_cycle_enabled=True, ladders={"alert": ("power_cycle",)})
    assert p.ladder("alert") == (Remediation.POWER_CYCLE,)


def test_readme_table_is_rendered_from_the_table():
    md = transition_table_markdown()
    assert md.count("\n") == len(TRANSITIONS) + 2
    assert "| canary | canary_passed | canary / probation |" in md


def _back_in_canary(m: LifecycleMemory, now: float, p: LifecycleParams) -> LifecycleMemory:
    """QUARANTINED -> DRAINED -> remediation OK -> CANARY."""
    m = go(m, ev(K.DRAINED), now, p).memory
    return go(m, ev(K.REMEDIATION_OK), now + 100, p).memory


def test_the_same_xid_surviving_two_remediations_needs_a_human_not_a_third():
    p = LifecycleParams(max_failures=10, max_remediation_attempts=5)  # neither limit interferes here
    m = go(LifecycleMemory(NODE), Event.fatal("xid", 48, 2), T0, p).memory
    m = _back_in_canary(m, T0 + 10, p)  # gpu reset
    t = go(m, Event.fatal("xid", 48, 2), T0 + 200, p)  # survived remediation 1: next rung
    assert t.memory.stage is S.QUARANTINED and t.memory.attempts[-1].outcome == "xid_survived_in_canary"
    m = _back_in_canary(t.memory, T0 + 300, p)  # reboot
    m = go(m, Event.fatal("xid", 13, 2), T0 + 500, p).memory  # another XID: a failure, not a survival
    assert m.stage is S.QUARANTINED and m.attempts[-1].outcome == "fatal_in_canary"
    m = _back_in_canary(m, T0 + 600, p)
    token = m.canary_token
    t = go(m, Event.fatal("xid", 48, 2), T0 + 800, p)  # survived remediation 3 (the second time)
    assert t.memory.stage is S.NEEDS_HUMAN  # not the fourth rung, though 2 of 5 attempts are left
    reason = "fleetyield: needs a human; XID 48 gpu 2 survived 2 remediations (gpu_reset, reboot) - RMA?"
    assert t.memory.reason == reason
    assert t.actions == (CancelCanaries(NODE, token), DrainNode(NODE, reason, cause="needs_human"))


def test_with_default_limits_one_xid_surviving_twice_needs_a_human_not_three_strikes():
    m = go(LifecycleMemory(NODE), Event.fatal("xid", 79, 3), T0).memory
    m = _back_in_canary(m, T0 + 10, P)
    m = go(m, Event.fatal("xid", 79, 3), T0 + 200).memory
    m = _back_in_canary(m, T0 + 300, P)
    t = go(m, Event.fatal("xid", 79, 3), T0 + 500)  # the same fault seen thrice: one failure, survived twice
    assert t.memory.stage is S.NEEDS_HUMAN and t.memory.failures == (T0,)
    assert "XID 79 gpu 3 survived 2 remediations (reboot, reboot) - RMA?" in t.memory.reason
