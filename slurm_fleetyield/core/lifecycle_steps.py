"""The lifecycle's handlers: what each accepted (stage, event kind) pair of ``lifecycle.TRANSITIONS`` does
to a node's memory, which actions it plans and what it logs; ``tier_for``, and ``due`` (the timeout a tick
derives).

Input of a handler: the node's ``LifecycleMemory``, the ``Event``, ``now`` and ``LifecycleParams``. Output: a
``Transition`` (the next ``LifecycleMemory``, the actions to plan, the log events, whether the event was
accepted). No handler reads anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from slurm_fleetyield.core.lifecycle_types import (
    MAX_REASON_LEN,
    SURVIVED,
    Attempt,
    Cause,
    Event,
    EventKind,
    LifecycleMemory,
    LifecycleParams,
    Remediation,
    Stage,
    Transition,
    _faults,
)
from slurm_fleetyield.core.model import OUR_REASON_PREFIX, LogEvent, Tier
from slurm_fleetyield.core.plan import DrainNode, ResumeNode
from slurm_fleetyield.core.rehab_actions import (
    CancelCanaries,
    LifecycleAction,
    PowerCycle,
    RebootNode,
    ResetGpu,
    SubmitCanary,
)


def tier_for(stage: Stage, risk_tier: Tier) -> Tier:
    """The placement tier of a node in ``stage``; IN_SERVICE keeps its risk-based tier."""
    return risk_tier if stage is Stage.IN_SERVICE else STAGE_TIERS[stage]


STAGE_TIERS: Mapping[Stage, Tier] = {
    Stage.QUARANTINED: Tier.QUARANTINED,
    Stage.REMEDIATING: Tier.QUARANTINED,
    Stage.NEEDS_HUMAN: Tier.QUARANTINED,
    Stage.CANARY: Tier.CANARY,
    Stage.PROBATION: Tier.PROBATION,
    Stage.RETIRED: Tier.RETIRED,
}


def due(memory: LifecycleMemory, now: float) -> EventKind | None:
    """The timeout event that ``now`` makes due, if any (what TICK derives)."""
    if memory.stage is Stage.REMEDIATING and memory.attempts and now >= memory.attempts[-1].deadline:
        return EventKind.REMEDIATION_TIMEOUT
    if memory.until is not None and now >= memory.until:
        if memory.stage is Stage.CANARY:
            return EventKind.CANARY_TIMEOUT
        if memory.stage is Stage.PROBATION:
            return EventKind.PROBATION_ELAPSED
    return None


# --------------------------------------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------------------------------------


def _on_fatal_in_service(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    # quarantine.decide drained the node (with requeue and safety caps): nothing to drain here
    cause = Cause(e.fault or "alert", e.xid, e.gpu, e.detail)
    m = replace(_new_episode(m), cause=cause)
    return _after_failure(m, e, now, p, reason=f"{cause.text}; quarantined", drain=False, key=cause.key)


def _on_approved(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    actions: list[LifecycleAction] = _cancel(m)
    if m.stage is Stage.IN_SERVICE:
        m = replace(_new_episode(m), cause=Cause("approved", detail=e.proposal_id))
    else:  # canary or probation: the episode (and its ladder) goes on
        m = _close_attempt(m, "drain_approved")
    reason = _prefixed(f"{Cause('approved', detail=e.proposal_id).text}; quarantined")
    m = _enter(m, Stage.QUARANTINED, now, reason)
    actions.append(DrainNode(m.node, reason, e.requeue_jobs, cause="approved"))
    return _ok(m, e, now, tuple(actions))


def _on_drained(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    if len(m.attempts) >= p.max_remediation_attempts:  # params lowered since: do not overshoot
        return _needs_human(m, e, now, ())
    return _start_remediation(m, e, now, p)


def _on_started(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    # the confirmation restarts the deadline: the executor may have issued the command ticks after the plan
    if not m.attempts:
        return _reject(m, e, now, "no remediation in flight")
    a = m.attempts[-1]
    attempt = replace(a, started_at=now, deadline=now + p.remediation_timeout_s[a.remediation])
    return _ok(replace(m, attempts=(*m.attempts[:-1], attempt)), e, now, ())


def _on_remediation_ok(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    m = _close_attempt(m, "ok")
    token = f"{m.node}-{len(m.attempts)}-{int(now)}"
    reason = _canary_reason(m, 0, p)
    m = replace(
        _enter(m, Stage.CANARY, now, reason),
        canary_token=token,
        until=now + p.canary_timeout_s,
        baseline=e.baseline,
    )
    actions = (
        ResumeNode(m.node, reason),
        SubmitCanary(m.node, p.canary_passes_required, token, p.canary_job_time_limit_s),
    )
    return _ok(m, e, now, actions)


def _on_remediation_failed(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    if e.kind is EventKind.REMEDIATION_TIMEOUT and m.attempts and now < m.attempts[-1].deadline:
        return _reject(m, e, now, f"deadline {m.attempts[-1].deadline:g} not reached")
    m = _close_attempt(m, "timeout" if e.kind is EventKind.REMEDIATION_TIMEOUT else "failed")
    if len(m.attempts) >= p.max_remediation_attempts:
        return _needs_human(m, e, now, ())
    return _start_remediation(m, e, now, p)  # still drained and empty: escalate at once


def _on_canary_passed(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    if e.token != m.canary_token:
        return _reject(m, e, now, f"canary token {e.token!r} is not the current round {m.canary_token!r}")
    if e.job_id is not None and e.job_id in m.canary_jobs:
        return _reject(m, e, now, f"canary job {e.job_id} already counted")
    passes = m.canary_passes + 1
    jobs = (*m.canary_jobs, *(() if e.job_id is None else (e.job_id,)))
    if passes < p.canary_passes_required:
        reason = _canary_reason(m, passes, p)
        return _ok(replace(m, canary_passes=passes, canary_jobs=jobs, reason=reason), e, now, ())
    until = now + p.probation_s
    reason = _prefixed(f"{_cause_text(m)}; probation, {passes} canaries passed")
    m = replace(_enter(m, Stage.PROBATION, now, reason), canary_passes=passes, canary_jobs=jobs, until=until)
    return _ok(m, e, now, ())


def _on_canary_failed(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    if e.token != m.canary_token:
        return _reject(m, e, now, f"canary token {e.token!r} is not the current round {m.canary_token!r}")
    m = _close_attempt(m, "canary_failed")
    job = f" job {e.job_id}" if e.job_id is not None else ""
    # the episode's fault is still there (a canary tests what the remediation was to cure): that fault
    key = m.cause.key if m.cause else f"canary:{m.canary_token}"
    return _after_failure(m, e, now, p, reason=f"canary{job} failed {e.detail}".rstrip(), drain=True, key=key)


def _on_canary_timeout(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    if m.until is None or now < m.until:
        return _reject(m, e, now, f"canary deadline {m.until!r} not reached")
    m = _close_attempt(m, "canary_timeout")
    reason = _prefixed(f"{_cause_text(m)}; canary timed out ({m.canary_passes} passed); quarantined")
    return _requarantine(m, e, now, p, reason, drain=True)


def _on_fatal_resumed(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    # quarantine.decide drains it (the node is resumed in canary/probation); this is a failure of the rehab
    same = e.fault == "xid" and m.cause is not None and m.cause.kind == "xid" and e.xid == m.cause.xid
    m = _close_attempt(m, f"{SURVIVED if same else 'fatal'}_in_{m.stage.value}")
    cause = Cause(e.fault or "alert", e.xid, e.gpu)
    return _after_failure(m, e, now, p, reason=f"{cause.text} in {m.stage.value}", drain=False, key=cause.key)


def _on_incident(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    m = _close_attempt(m, f"incident_in_{m.stage.value}")
    reason = f"incident in {m.stage.value}: {e.detail}".rstrip(": ")
    return _after_failure(m, e, now, p, reason=reason, drain=True, key=e.key)


def _on_probation_elapsed(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    if m.until is None or now < m.until:
        return _reject(m, e, now, f"probation lasts until {m.until!r}")
    return _ok(_enter(_new_episode(m), Stage.IN_SERVICE, now, ""), e, now, (), note="green again")


def _on_admin_resumed(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    # the admin's decision stands; a retired node only comes back repaired or replaced: a fresh start
    kept = m.stage is not Stage.RETIRED
    m = replace(
        _enter(_new_episode(m), Stage.IN_SERVICE, now, ""),
        failures=m.failures if kept else (),
        faults=m.faults if kept else (),
    )
    return _ok(m, e, now, (), note="resumed by someone else: back to risk-based tiers")


def _on_admin_drained(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    actions = tuple(_cancel(m))
    m = _enter(_new_episode(m), Stage.IN_SERVICE, now, "")
    return _ok(m, e, now, actions, note="drained by someone else: hands off")


def _on_tick(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    kind = due(m, now)
    if kind is not None:
        from slurm_fleetyield.core.lifecycle import (
            step,  # the due event goes through the table: imported late
        )

        return step(m, Event(kind), now, p)
    trimmed = _trim(m, now, p)
    return Transition(trimmed)


# --------------------------------------------------------------------------------------------------------
# Shared moves
# --------------------------------------------------------------------------------------------------------


def _start_remediation(m: LifecycleMemory, e: Event, now: float, p: LifecycleParams) -> Transition:
    ladder = p.ladder(m.cause.fault_class if m.cause else "default")
    n = len(m.attempts)
    rem = ladder[min(n, len(ladder) - 1)]
    reason = _prefixed(
        f"{_cause_text(m)}; quarantined, remediation {n + 1}/{p.max_remediation_attempts} ({rem.value})"
    )
    attempt = Attempt(rem, now, now + p.remediation_timeout_s[rem])
    # The same decision made again from the same stored memory (a tick replayed after a crash between acting
    # and committing) carries the same intent: the executor then checks what was done instead of acting.
    intent = f"{m.node}/{m.since!r}/{n + 1}/{rem.value}"
    m = replace(_enter(m, Stage.REMEDIATING, now, reason), attempts=(*m.attempts, attempt))
    act: LifecycleAction
    if rem is Remediation.GPU_RESET:
        gpu = m.cause.gpu if m.cause else None
        act = ResetGpu(m.node, () if gpu is None else (gpu,), reason, intent)
    elif rem is Remediation.REBOOT:
        act = RebootNode(m.node, reason, intent=intent)
    else:
        act = PowerCycle(m.node, reason, intent)
    # the drain re-asserts our reason (and the drain itself) before the remediation runs
    return _ok(m, e, now, (DrainNode(m.node, reason, cause="rehab"), act))


def _after_failure(
    m: LifecycleMemory, e: Event, now: float, p: LifecycleParams, *, reason: str, drain: bool, key: str = ""
) -> Transition:
    """Record a failure (once per fault ``key`` in the window: one fault is one failure, however many
    checks see it); retire past max_failures, else back to quarantine (or NEEDS_HUMAN)."""
    m = _trim(m, now, p)
    if not key or key not in m.faults:
        m = replace(m, failures=(*m.failures, now), faults=(*m.faults, key))
    failures = m.failures
    if len(failures) >= p.max_failures:
        why = _prefixed(
            f"RETIRED after {len(failures)} failures in {_span(p.failure_window_s)} - RMA ({_cause_text(m)})"
        )
        actions = (*_cancel(m), DrainNode(m.node, why, e.requeue_jobs, cause="retire"))
        return _ok(_enter(m, Stage.RETIRED, now, why), e, now, actions)
    return _requarantine(m, e, now, p, _prefixed(reason), drain=drain)


def _requarantine(
    m: LifecycleMemory, e: Event, now: float, p: LifecycleParams, reason: str, *, drain: bool
) -> Transition:
    cancel = _cancel(m)
    survived = [a.remediation.value for a in m.attempts if a.outcome.startswith(SURVIVED)]
    if len(survived) >= p.max_xid_survivals:
        why = f"{_cause_text(m)} survived {len(survived)} remediations ({', '.join(survived)}) - RMA?"
        return _needs_human(m, e, now, tuple(cancel), why)
    if len(m.attempts) >= p.max_remediation_attempts:
        return _needs_human(m, e, now, tuple(cancel))
    actions = (*cancel, *((DrainNode(m.node, reason, e.requeue_jobs, cause="rehab"),) if drain else ()))
    return _ok(_enter(m, Stage.QUARANTINED, now, reason), e, now, actions)


def _needs_human(
    m: LifecycleMemory, e: Event, now: float, before: tuple[LifecycleAction, ...], detail: str = ""
) -> Transition:
    tried = ", ".join(f"{a.remediation.value}: {a.outcome}" for a in m.attempts)
    why = _prefixed(f"needs a human; {detail or f'{len(m.attempts)} remediations failed ({tried})'}")
    actions = (*before, DrainNode(m.node, why, e.requeue_jobs, cause="needs_human"))
    return _ok(_enter(m, Stage.NEEDS_HUMAN, now, why), e, now, actions)


def _enter(m: LifecycleMemory, stage: Stage, now: float, reason: str) -> LifecycleMemory:
    """Enter ``stage``: stage-specific fields (canary round, deadline) are cleared; the remediation's
    baseline lasts from CANARY through PROBATION."""
    baseline = m.baseline if stage in (Stage.CANARY, Stage.PROBATION) else ()
    return replace(
        m,
        stage=stage,
        since=now,
        reason=reason,
        canary_token="",
        canary_passes=0,
        canary_jobs=(),
        until=None,
        baseline=baseline,
    )


def _new_episode(m: LifecycleMemory) -> LifecycleMemory:
    return replace(m, cause=None, attempts=())


def _close_attempt(m: LifecycleMemory, outcome: str) -> LifecycleMemory:
    if not m.attempts:
        return m
    return replace(m, attempts=(*m.attempts[:-1], replace(m.attempts[-1], outcome=outcome)))


def _cancel(m: LifecycleMemory) -> list[LifecycleAction]:
    return [CancelCanaries(m.node, m.canary_token)] if m.canary_token else []


def _trim(m: LifecycleMemory, now: float, p: LifecycleParams) -> LifecycleMemory:
    """Failures (and their fault keys) trimmed to the window; the very memory when none left it."""
    keep = [i for i, t in enumerate(m.failures) if t > now - p.failure_window_s]
    if len(keep) == len(m.failures) and len(m.faults) == len(m.failures):
        return m
    faults = _faults(m.faults, len(m.failures))
    return replace(m, failures=tuple(m.failures[i] for i in keep), faults=tuple(faults[i] for i in keep))


def _canary_reason(m: LifecycleMemory, passes: int, p: LifecycleParams) -> str:
    rem = m.attempts[-1].remediation.value if m.attempts else "remediation"
    return _prefixed(f"{_cause_text(m)}; canary after {rem}, {passes}/{p.canary_passes_required} passed")


def _cause_text(m: LifecycleMemory) -> str:
    return m.cause.text if m.cause else "rehabilitation"


def _prefixed(text: str) -> str:
    text = text if text.startswith(OUR_REASON_PREFIX) else f"{OUR_REASON_PREFIX} {text}"
    return text[:MAX_REASON_LEN]


def _span(seconds: float) -> str:
    for unit, size in (("d", 86_400.0), ("h", 3_600.0), ("m", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _ok(
    m: LifecycleMemory, e: Event, now: float, actions: tuple[LifecycleAction, ...], note: str = ""
) -> Transition:
    data = {"event": e.kind.value, "stage": m.stage.value, "attempts": len(m.attempts)}
    msg = f"{e.kind.value} -> {m.stage.value}: {note or m.reason or 'in service'}"
    return Transition(m, actions, (LogEvent(now, m.node, "lifecycle", msg, data),), True)


def _reject(m: LifecycleMemory, e: Event, now: float, why: str) -> Transition:
    data = {"event": e.kind.value, "stage": m.stage.value}
    msg = f"{e.kind.value} rejected in {m.stage.value}: {why}"
    return Transition(m, (), (LogEvent(now, m.node, "lifecycle_rejected", msg, data),), False)


# --------------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------------
