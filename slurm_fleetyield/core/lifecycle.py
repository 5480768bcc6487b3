"""Lifecycle: how a quarantined node earns its way back into service, or out of it, as one state machine.

Input: one node's ``LifecycleMemory``, one ``Event`` (derived by the tick from Observations and from the
outcomes of the last plan), ``now`` and ``LifecycleParams``. Output: a ``Transition``: the next memory, the
actions to execute (``core/rehab_actions.py`` plus ``DrainNode``/``ResumeNode``), log events, and whether the
event was accepted. ``step`` is pure and total: every (stage, event kind) pair is either a row of
``TRANSITIONS`` (the single source of truth; ``transition_table_markdown`` renders it for the README) or is
rejected, with the memory unchanged, no action and one ``lifecycle_rejected`` LogEvent saying why.

The path back: IN_SERVICE -(fatal fault, quarantine drains)-> QUARANTINED -(Slurm shows it DRAINED: nothing
left running)-> REMEDIATING (a rung of the fault class's escalation ladder: GPU reset, reboot, later power
cycle) -(node back, agent fresh, no fatal pending)-> CANARY (resumed with fy_canary only; N canary jobs)
-(N passes)-> PROBATION (yellow-like, checkpointable work) -(probation_s without incident)-> IN_SERVICE.

Two counters, two verdicts:
- an *attempt* is one remediation; every way it can prove useless (it failed, timed out, its canary failed or
  timed out, an incident in probation) makes the next attempt the next rung; after
  ``max_remediation_attempts`` the node goes to NEEDS_HUMAN: our tools cannot fix it; so does the episode's
  own XID coming back after ``max_xid_survivals`` remediations (GPUd's rule: the same XID surviving two
  reboots wants hardware inspection, not a third);
- a *failure* is evidence of bad hardware: a fatal fault (in service, canary or probation), a failed canary,
  an incident. ``max_failures`` of them within ``failure_window_s`` retire the node (drained, reason says
  RMA). Retirement is checked first: bad hardware is the stronger verdict. Approved drains and timeouts are
  not failures (no evidence against the GPU); repeated fatal evidence while already drained is one incident.
  Failures are counted per fault (``Event.key``, ``LifecycleMemory.faults``): one fault is one failure however
  many checks see it. The episode's own fault seen again after a remediation (the same XID on the same GPU,
  a failed canary of the episode) is that fault surviving, which ``max_xid_survivals`` and
  ``max_remediation_attempts`` judge (NEEDS_HUMAN), not a new strike towards RMA. An incident in canary or
  probation is only ever evidence that appeared after the remediation (``core/aftercare.py``): a counter a
  reset cannot clear is not a new incident.

Invariant the tick relies on (tested with ``route.fy_features``): no stage before PROBATION maps to a tier
that carries an ``fy_ok_*`` feature, so resuming a node can never admit normal work (job_submit gives every
normal job an ``fy_ok_*`` constraint), whatever the order or the failure of the plan's actions.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_fleetyield.core.lifecycle_steps import (
    STAGE_TIERS,
    _on_admin_drained,
    _on_admin_resumed,
    _on_approved,
    _on_canary_failed,
    _on_canary_passed,
    _on_canary_timeout,
    _on_drained,
    _on_fatal_in_service,
    _on_fatal_resumed,
    _on_incident,
    _on_probation_elapsed,
    _on_remediation_failed,
    _on_remediation_ok,
    _on_started,
    _on_tick,
    _reject,
    due,
    tier_for,
)
from slurm_fleetyield.core.lifecycle_types import (
    DEFAULT_LADDERS,
    DEFAULT_REMEDIATION_TIMEOUT_S,
    DRAINED_STAGES,
    MAX_REASON_LEN,
    SURVIVED,
    Attempt,
    Cause,
    Event,
    EventKind,
    Handler,
    LifecycleMemory,
    LifecycleParams,
    Remediation,
    Row,
    Stage,
    Transition,
)

__all__ = [
    "DEFAULT_LADDERS",
    "DEFAULT_REMEDIATION_TIMEOUT_S",
    "DRAINED_STAGES",
    "MAX_REASON_LEN",
    "REJECTED_WHY",
    "STAGE_TIERS",
    "SURVIVED",
    "TRANSITIONS",
    "Attempt",
    "Cause",
    "Event",
    "EventKind",
    "Handler",
    "LifecycleMemory",
    "LifecycleParams",
    "Remediation",
    "Row",
    "Stage",
    "Transition",
    "due",
    "step",
    "tier_for",
    "transition_table_markdown",
]


def step(memory: LifecycleMemory, event: Event, now: float, params: LifecycleParams) -> Transition:
    """Apply one event. Pure: same inputs, same output; never raises for an unexpected (stage, event)."""
    row = TRANSITIONS.get((memory.stage, event.kind))
    if row is None:
        why = REJECTED_WHY.get((memory.stage, event.kind), f"not allowed in stage {memory.stage.value}")
        return _reject(memory, event, now, why)
    return row.handler(memory, event, now, params)


S, K = Stage, EventKind
_TO_FAIL = (S.QUARANTINED, S.RETIRED, S.NEEDS_HUMAN)
_FATAL_RESUMED = (
    "failure; quarantine drains it; canary round cancelled if any; K in window -> RETIRED; the episode's "
    "XID back after max_xid_survivals remediations -> NEEDS_HUMAN"
)
_INCIDENT = "failure; drain (requeue); canary round cancelled if any; K in window -> RETIRED"
_APPROVED = "drain (requeue); canary round cancelled if any; not a failure; the episode goes on"
_HANDS_OFF = "hands off: episode forgotten (failures kept); canary round cancelled if any"
_TICK = "derives the due timeout (row above), else nothing"

TRANSITIONS: Mapping[tuple[Stage, EventKind], Row] = {
    (S.IN_SERVICE, K.FATAL): Row(
        (S.QUARANTINED, S.RETIRED), _on_fatal_in_service,
        "failure recorded; quarantine already drained it; K in window -> RETIRED (RMA drain)",
    ),
    (S.IN_SERVICE, K.APPROVED_DRAIN): Row(
        (S.QUARANTINED,), _on_approved, "drain (cause approved, requeue); not a failure"
    ),
    (S.IN_SERVICE, K.TICK): Row((S.IN_SERVICE,), _on_tick, "trims failures to the window"),
    (S.QUARANTINED, K.DRAINED): Row(
        (S.REMEDIATING, S.NEEDS_HUMAN), _on_drained,
        "next rung of the ladder: reason update + ResetGpu / RebootNode / PowerCycle",
    ),
    (S.QUARANTINED, K.ADMIN_RESUMED): Row((S.IN_SERVICE,), _on_admin_resumed, "the admin's decision stands"),
    (S.QUARANTINED, K.ADMIN_DRAINED): Row((S.IN_SERVICE,), _on_admin_drained, _HANDS_OFF),
    (S.QUARANTINED, K.TICK): Row((S.QUARANTINED,), _on_tick, "waits for DRAINED"),
    (S.REMEDIATING, K.REMEDIATION_STARTED): Row(
        (S.REMEDIATING,), _on_started, "deadline restarts from the confirmation"
    ),
    (S.REMEDIATING, K.REMEDIATION_OK): Row(
        (S.CANARY,), _on_remediation_ok, "ResumeNode + SubmitCanary(N); features fy_canary only"
    ),
    (S.REMEDIATING, K.REMEDIATION_FAILED): Row(
        (S.REMEDIATING, S.NEEDS_HUMAN), _on_remediation_failed,
        "next rung at once (node still drained and empty); max attempts -> NEEDS_HUMAN",
    ),
    (S.REMEDIATING, K.REMEDIATION_TIMEOUT): Row(
        (S.REMEDIATING, S.NEEDS_HUMAN), _on_remediation_failed, "as failed; rejected before the deadline"
    ),
    (S.REMEDIATING, K.ADMIN_DRAINED): Row((S.IN_SERVICE,), _on_admin_drained, _HANDS_OFF),
    (S.REMEDIATING, K.TICK): Row((S.REMEDIATING, S.NEEDS_HUMAN), _on_tick, _TICK),
    (S.CANARY, K.CANARY_PASSED): Row(
        (S.CANARY, S.PROBATION), _on_canary_passed,
        "pass counted (current token only, each job once); N passes -> PROBATION",
    ),
    (S.CANARY, K.CANARY_FAILED): Row(
        _TO_FAIL, _on_canary_failed, "failure; drain; canaries cancelled; next rung after DRAINED"
    ),
    (S.CANARY, K.CANARY_TIMEOUT): Row(
        (S.QUARANTINED, S.NEEDS_HUMAN), _on_canary_timeout,
        "attempt used, not a failure; drain; canaries cancelled; rejected before the deadline",
    ),
    (S.CANARY, K.FATAL): Row(_TO_FAIL, _on_fatal_resumed, _FATAL_RESUMED),
    (S.CANARY, K.INCIDENT): Row(_TO_FAIL, _on_incident, _INCIDENT),
    (S.CANARY, K.APPROVED_DRAIN): Row((S.QUARANTINED,), _on_approved, _APPROVED),
    (S.CANARY, K.ADMIN_DRAINED): Row((S.IN_SERVICE,), _on_admin_drained, _HANDS_OFF),
    (S.CANARY, K.TICK): Row((S.CANARY, S.QUARANTINED, S.NEEDS_HUMAN), _on_tick, _TICK),
    (S.PROBATION, K.PROBATION_ELAPSED): Row(
        (S.IN_SERVICE,), _on_probation_elapsed, "green again: episode closed; rejected before `until`"
    ),
    (S.PROBATION, K.FATAL): Row(_TO_FAIL, _on_fatal_resumed, _FATAL_RESUMED),
    (S.PROBATION, K.INCIDENT): Row(_TO_FAIL, _on_incident, _INCIDENT),
    (S.PROBATION, K.APPROVED_DRAIN): Row((S.QUARANTINED,), _on_approved, _APPROVED),
    (S.PROBATION, K.ADMIN_DRAINED): Row((S.IN_SERVICE,), _on_admin_drained, _HANDS_OFF),
    (S.PROBATION, K.TICK): Row((S.PROBATION, S.IN_SERVICE), _on_tick, _TICK),
    (S.RETIRED, K.ADMIN_RESUMED): Row(
        (S.IN_SERVICE,), _on_admin_resumed, "repaired or replaced: failures forgotten too"
    ),
    (S.RETIRED, K.ADMIN_DRAINED): Row((S.IN_SERVICE,), _on_admin_drained, _HANDS_OFF),
    (S.RETIRED, K.TICK): Row((S.RETIRED,), _on_tick, "stays drained"),
    (S.NEEDS_HUMAN, K.ADMIN_RESUMED): Row((S.IN_SERVICE,), _on_admin_resumed, "the admin's decision stands"),
    (S.NEEDS_HUMAN, K.ADMIN_DRAINED): Row((S.IN_SERVICE,), _on_admin_drained, _HANDS_OFF),
    (S.NEEDS_HUMAN, K.TICK): Row((S.NEEDS_HUMAN,), _on_tick, "stays drained"),
}  # fmt: skip

REJECTED_WHY: Mapping[tuple[Stage, EventKind], str] = {
    (S.REMEDIATING, K.ADMIN_RESUMED): "a resume while a remediation is in flight cannot be told from "
    "Slurm finishing a reboot; REMEDIATION_OK and the canary decide",
    (S.QUARANTINED, K.FATAL): "already quarantined: more evidence of the same incident",
    (S.REMEDIATING, K.FATAL): "remediation in flight: judged by REMEDIATION_OK and the canary",
    (S.RETIRED, K.FATAL): "retired: stays drained",
    (S.NEEDS_HUMAN, K.FATAL): "waiting for a human: stays drained",
    (S.IN_SERVICE, K.INCIDENT): "in service, risk over red is the gate's drain proposal",
    (S.IN_SERVICE, K.ADMIN_RESUMED): "not ours: nothing to hand back",
    (S.IN_SERVICE, K.ADMIN_DRAINED): "not ours: already hands off",
}
"""Why notable pairs are rejected (others: 'not allowed in stage X')."""


def transition_table_markdown() -> str:
    """The README table, rendered from ``TRANSITIONS`` (so the doc cannot drift from the code)."""
    lines = ["| stage | event | next stage(s) | what happens |", "|---|---|---|---|"]
    for (stage, kind), row in TRANSITIONS.items():
        to = " / ".join(s.value for s in row.to)
        lines.append(f"| {stage.value} | {kind.value} | {to} | {row.doc} |")
    lines.append("| any other pair | | unchanged | rejected: no action, one `lifecycle_rejected` log event |")
    return "\n".join(lines)
