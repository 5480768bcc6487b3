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

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

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

MAX_REASON_LEN = 120  # same bound as core/quarantine.py: sinfo -R columns stay readable
SURVIVED = "xid_survived"
"""Outcome prefix of an attempt after which the episode's own XID came back (``max_xid_survivals``)."""


class Stage(StrEnum):
    IN_SERVICE = "in_service"  # not ours: tiers come from risk
    QUARANTINED = "quarantined"  # drained by us, waiting for Slurm to show it empty (DRAINED)
    REMEDIATING = "remediating"  # one remediation in flight (``attempts[-1]``: which, deadline)
    CANARY = "canary"  # resumed with fy_canary only; a canary round (token, passes) is running
    PROBATION = "probation"  # back in service as yellow-like until ``until``
    RETIRED = "retired"  # too many failures in the window: stays drained, RMA
    NEEDS_HUMAN = "needs_human"  # remediations exhausted: stays drained, a human decides


DRAINED_STAGES = frozenset({Stage.QUARANTINED, Stage.REMEDIATING, Stage.RETIRED, Stage.NEEDS_HUMAN})
"""Stages in which Slurm should show the node drained by us (what the tick compares against)."""


class EventKind(StrEnum):
    FATAL = "fatal"  # quarantine accepted fatal evidence (and drained the node, or it was drained by us)
    APPROVED_DRAIN = "approved_drain"  # the gate approved a drain proposal
    DRAINED = "drained"  # Slurm shows it drained by us with no job left: safe to remediate
    REMEDIATION_STARTED = "remediation_started"  # the executor confirms the remediation was issued
    REMEDIATION_OK = "remediation_ok"  # node back: responding, agent fresh since the start, no fatal pending
    REMEDIATION_FAILED = "remediation_failed"  # the command failed, or the agent reports the reset failed
    REMEDIATION_TIMEOUT = "remediation_timeout"  # derived from now (TICK), or fed explicitly
    CANARY_PASSED = "canary_passed"  # a canary job of the current round completed OK
    CANARY_FAILED = "canary_failed"  # a canary job of the current round failed (check failed, node fail)
    CANARY_TIMEOUT = "canary_timeout"  # derived from now: the round did not finish in canary_timeout_s
    INCIDENT = "incident"  # risk over red (or another non-drain incident) while in canary/probation
    PROBATION_ELAPSED = "probation_elapsed"  # derived from now
    ADMIN_RESUMED = "admin_resumed"  # someone else resumed a node we held drained
    ADMIN_DRAINED = "admin_drained"  # someone else drained the node (reason not ``fleetyield:``)
    TICK = "tick"  # time passes: derives the due timeout, if any


class Remediation(StrEnum):
    GPU_RESET = "gpu_reset"
    REBOOT = "reboot"
    POWER_CYCLE = "power_cycle"


# --------------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------------

_R, _B, _P = Remediation.GPU_RESET, Remediation.REBOOT, Remediation.POWER_CYCLE
DEFAULT_LADDERS: Mapping[str, tuple[Remediation, ...]] = {
    # NVIDIA Xid catalog: 79 fallen off the bus -> RESTART_BM; GSP 119/120 and a GPU that did not enumerate
    # need the driver reloaded on a fresh PCIe bus: a reset cannot reach them.
    "xid_79": (_B, _P),
    "xid_119": (_B, _P),
    "xid_120": (_B, _P),
    "gpu_missing": (_B, _P),
    # ECC / remap (48, 95, 64), NVLink (74), 109/110: catalog action RESET_GPU; a reboot if that did not help.
    "xid_48": (_R, _B, _P),
    "xid_64": (_R, _B, _P),
    "xid_74": (_R, _B, _P),
    "xid_95": (_R, _B, _P),
    "xid_109": (_R, _B, _P),
    "xid_110": (_R, _B, _P),
    # Quiet corruption (active check failed): a reset is cheap to try; bad silicon fails the canary anyway.
    "check_failed": (_R, _B, _P),
    # Alerts, approved drains, other XIDs: nothing specific to reset; a reboot clears driver/firmware state.
    "default": (_B, _P),
}
_LADDER_KEY = re.compile(r"^(xid_[1-9][0-9]*|gpu_missing|check_failed|alert|approved|default)$")
DEFAULT_REMEDIATION_TIMEOUT_S: Mapping[Remediation, float] = {
    _R: 300.0,  # nvidia-smi --gpu-reset takes seconds; the rest is the agent's next scrapes
    _B: 900.0,  # an 8-GPU HGX server: POST, NVSwitch/fabric manager and driver load take several minutes
    _P: 1200.0,  # a cold boot adds BMC power sequencing and memory training
}


class LifecycleParams(BaseModel):
    """Rehabilitation: remediation ladder, canary, probation, retirement."""

    # strict and finite like core/params.py; remediation names (TOML strings) still become Remediation
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    canary_passes_required: int = Field(
        2,
        ge=1,
        description="Canary jobs that must pass before probation. Two: one pass can be luck on an "
        "intermittent fault, and each canary is a few minutes of an otherwise idle node.",
    )
    canary_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="A canary round that has not produced its passes in this time is abandoned (back to "
        "quarantine, next rung; not a failure: a stuck queue is no evidence against the GPU).",
    )
    canary_job_time_limit_s: float = Field(
        600.0, gt=0, description="Slurm --time of each canary job (the check itself takes seconds)."
    )
    probation_s: float = Field(
        3600.0,
        gt=0,
        description="Time in probation (checkpointable work only) without incident before the node is "
        "green again. An hour covers a few checkpoint intervals of real work.",
    )
    max_failures: int = Field(
        3,
        ge=1,
        description="Failures (fatal faults, failed canaries, incidents) within failure_window_s that "
        "retire the node for RMA. Meta's RSC reports ~1.2% 'lemon' nodes causing a large share of "
        "interruptions: three strikes a week is well past noise.",
    )
    failure_window_s: float = Field(7 * 86_400.0, gt=0, description="Window of max_failures (seconds).")
    max_remediation_attempts: int = Field(
        3,
        ge=1,
        description="Remediations tried per episode (quarantine to green) before NEEDS_HUMAN.",
    )
    max_xid_survivals: int = Field(
        2,
        ge=1,
        description="The episode's XID back (in canary or probation) after this many remediations sends the "
        "node to NEEDS_HUMAN (RMA?) instead of the next rung, whatever attempts are left. Two, as GPUd "
        "escalates an XID that survived two reboots to hardware inspection. Retirement (max_failures) is "
        "checked first.",
    )
    remediation_timeout_s: dict[Annotated[Remediation, Strict(False)], float] = Field(
        default_factory=lambda: dict(DEFAULT_REMEDIATION_TIMEOUT_S),
        description="Per remediation kind, seconds until an unconfirmed remediation counts as failed. "
        "Kinds not given keep their defaults (gpu_reset 300, reboot 900, power_cycle 1200).",
    )
    reboot_settle_s: float = Field(
        120.0,
        ge=0,
        description="The tick derives REMEDIATION_OK after a reboot or power cycle only from a sample taken "
        "at "
        "least this long after the command: for a moment after `scontrol reboot` the node still answers "
        "scrapes from before the reboot. A GPU reset needs no such wait (any sample after it is new).",
    )
    power_cycle_enabled: bool = Field(
        False,
        description="Use the power_cycle rungs of the ladders (needs the Redfish adapter). Off: those rungs "
        "are skipped and the strongest remaining rung is repeated.",
    )
    ladders: dict[str, Annotated[tuple[Annotated[Remediation, Strict(False)], ...], Strict(False)]] = Field(
        default_factory=lambda: dict(DEFAULT_LADDERS),
        description="Escalation ladder per fault class (xid_<n>, gpu_missing, check_failed, alert, "
        "approved, default), gentlest first. Attempt n uses rung n, the last rung once exhausted. A class "
        "without its own ladder uses 'default'. Given ladders replace the defaults of their class only.",
    )

    @field_validator("remediation_timeout_s", mode="before")
    @classmethod
    def _merge_timeouts(cls, v: Any) -> Any:
        return {**DEFAULT_REMEDIATION_TIMEOUT_S, **v} if isinstance(v, Mapping) else v

    @field_validator("remediation_timeout_s")
    @classmethod
    def _timeouts(cls, v: dict[Remediation, float]) -> dict[Remediation, float]:
        for kind, s in v.items():
            if not (math.isfinite(s) and s > 0):
                raise ValueError(f"remediation_timeout_s[{kind.value!r}] must be positive seconds, got {s!r}")
        return v

    @field_validator("ladders", mode="before")
    @classmethod
    def _merge_ladders(cls, v: Any) -> Any:
        return {**DEFAULT_LADDERS, **v} if isinstance(v, Mapping) else v

    @field_validator("ladders")
    @classmethod
    def _ladders(cls, v: dict[str, tuple[Remediation, ...]]) -> dict[str, tuple[Remediation, ...]]:
        for key, ladder in v.items():
            if not _LADDER_KEY.match(key):
                raise ValueError(
                    f"unknown fault class {key!r} in ladders; known: xid_<n>, gpu_missing, check_failed, "
                    "alert, approved, default"
                )
            if not ladder or len(set(ladder)) != len(ladder):
                raise ValueError(f"ladder {key!r} must list distinct remediations, got {list(ladder)!r}")
        return v

    @model_validator(mode="after")
    def _usable(self) -> LifecycleParams:
        if not self.power_cycle_enabled:
            for key, ladder in self.ladders.items():
                if all(r is Remediation.POWER_CYCLE for r in ladder):
                    raise ValueError(
                        f"ladder {key!r} is {[r.value for r in ladder]!r} but power_cycle_enabled is false: "
                        "it would have no usable remediation"
                    )
        return self

    def ladder(self, fault_class: str) -> tuple[Remediation, ...]:
        """Usable rungs for a fault class, gentlest first (power cycle dropped unless enabled)."""
        ladder = self.ladders.get(fault_class) or self.ladders["default"]
        return tuple(r for r in ladder if self.power_cycle_enabled or r is not Remediation.POWER_CYCLE)


# --------------------------------------------------------------------------------------------------------
# Memory, events, transitions
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """Why the episode started: the fault (or the approved proposal) that sent the node to quarantine."""

    kind: str  # xid | gpu_missing | check_failed | alert | approved | incident
    xid: int | None = None
    gpu: int | None = None
    detail: str = ""  # proposal id, incident text, alert name

    @property
    def key(self) -> str:
        """The fault's identity for failure counting: class and GPU (an approved drain: its proposal)."""
        if self.kind == "approved":
            return f"approved:{self.detail}"
        return self.fault_class + ("" if self.gpu is None else f":gpu{self.gpu}")

    @property
    def fault_class(self) -> str:
        """The key of ``LifecycleParams.ladders``."""
        return f"xid_{self.xid}" if self.kind == "xid" and self.xid is not None else self.kind

    @property
    def text(self) -> str:
        gpu = f" gpu {self.gpu}" if self.gpu is not None else ""
        if self.kind == "xid" and self.xid is not None:
            return f"XID {self.xid}{gpu}"
        if self.kind == "approved":
            return f"approved drain {self.detail}".rstrip()
        if self.kind == "gpu_missing":
            return "GPU missing"
        if self.kind == "attestation_failed" and self.detail:  # keep the differing records in every reason
            return f"attestation failed ({self.detail})"
        return f"{self.kind.replace('_', ' ')}{gpu}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One remediation of the current episode."""

    remediation: Remediation
    started_at: float
    deadline: float
    outcome: str = "pending"  # pending | ok | failed | timeout | canary_failed | canary_timeout | ...


@dataclass(frozen=True, slots=True)
class LifecycleMemory:
    """What the lifecycle remembers about one node. JSON round trip: ``from_dict(m.to_dict()) == m``."""

    node: str
    stage: Stage = Stage.IN_SERVICE
    since: float = 0.0  # entry into ``stage``
    cause: Cause | None = None  # of the current episode (None in service)
    attempts: tuple[Attempt, ...] = ()  # of the current episode, oldest first
    canary_token: str = ""  # the running canary round (CANARY only)
    canary_passes: int = 0
    canary_jobs: tuple[int, ...] = ()  # jobs that passed in this round (evidence)
    until: float | None = None  # CANARY: round deadline; PROBATION: end of probation
    failures: tuple[float, ...] = ()  # failure times, oldest first, trimmed to the window
    reason: str = ""  # what Slurm's Reason (or ResumeNode's reason) says about the node
    faults: tuple[str, ...] = ()  # each failure's fault key (same length; "": unknown, stored before keys)
    baseline: tuple[tuple[str, float], ...] = ()  # CANARY/PROBATION: counters when the remediation proved OK

    @property
    def forgettable(self) -> bool:
        """Nothing worth storing: the tick may drop this node's memory."""
        return self.stage is Stage.IN_SERVICE and not self.failures

    def to_dict(self) -> dict[str, Any]:
        c = self.cause
        return {
            "node": self.node,
            "stage": self.stage.value,
            "since": self.since,
            "cause": None if c is None else {"kind": c.kind, "xid": c.xid, "gpu": c.gpu, "detail": c.detail},
            "attempts": [[a.remediation.value, a.started_at, a.deadline, a.outcome] for a in self.attempts],
            "canary_token": self.canary_token,
            "canary_passes": self.canary_passes,
            "canary_jobs": list(self.canary_jobs),
            "until": self.until,
            "failures": list(self.failures),
            "reason": self.reason,
            "faults": list(self.faults),
            "baseline": [[k, v] for k, v in self.baseline],
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> LifecycleMemory:
        c = d.get("cause")
        failures = tuple(float(t) for t in d.get("failures", ()))
        return LifecycleMemory(
            node=d["node"],
            stage=Stage(d["stage"]),
            since=float(d["since"]),
            cause=None if c is None else Cause(c["kind"], c.get("xid"), c.get("gpu"), c.get("detail", "")),
            attempts=tuple(Attempt(Remediation(k), s, dl, o) for k, s, dl, o in d.get("attempts", ())),
            canary_token=d.get("canary_token", ""),
            canary_passes=int(d.get("canary_passes", 0)),
            canary_jobs=tuple(d.get("canary_jobs", ())),
            until=d.get("until"),
            failures=failures,
            reason=d.get("reason", ""),
            faults=_faults(d.get("faults", ()), len(failures)),
            baseline=tuple((str(k), float(v)) for k, v in d.get("baseline", ())),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened to a node. Only the fields of its kind matter; use the constructors."""

    kind: EventKind
    fault: str = ""  # FATAL: xid | gpu_missing | check_failed | alert
    xid: int | None = None
    gpu: int | None = None
    proposal_id: str = ""  # APPROVED_DRAIN
    token: str = ""  # CANARY_PASSED / CANARY_FAILED: the round, from the job name
    job_id: int | None = None  # CANARY_PASSED / CANARY_FAILED
    detail: str = ""  # human text: why it failed, what the incident was
    requeue_jobs: tuple[int, ...] = ()  # APPROVED_DRAIN / INCIDENT: running jobs that allow requeue
    key: str = ""  # INCIDENT: the fault's identity (GPU and signal of the new evidence)
    baseline: tuple[tuple[str, float], ...] = ()  # REMEDIATION_OK: counters of the sample that proved it

    @staticmethod
    def fatal(fault: str, xid: int | None = None, gpu: int | None = None, detail: str = "") -> Event:
        return Event(EventKind.FATAL, fault=fault, xid=xid, gpu=gpu, detail=detail)

    @staticmethod
    def approved(proposal_id: str, requeue_jobs: tuple[int, ...] = ()) -> Event:
        return Event(EventKind.APPROVED_DRAIN, proposal_id=proposal_id, requeue_jobs=requeue_jobs)

    @staticmethod
    def canary(passed: bool, token: str, job_id: int, detail: str = "") -> Event:
        kind = EventKind.CANARY_PASSED if passed else EventKind.CANARY_FAILED
        return Event(kind, token=token, job_id=job_id, detail=detail)

    @staticmethod
    def incident(detail: str, requeue_jobs: tuple[int, ...] = (), key: str = "") -> Event:
        return Event(EventKind.INCIDENT, detail=detail, requeue_jobs=requeue_jobs, key=key)


@dataclass(frozen=True, slots=True)
class Transition:
    memory: LifecycleMemory
    actions: tuple[LifecycleAction, ...] = ()
    log: tuple[LogEvent, ...] = ()
    accepted: bool = True


Handler = Callable[[LifecycleMemory, Event, float, LifecycleParams], Transition]


@dataclass(frozen=True, slots=True)
class Row:
    """One allowed (stage, event kind): the stages it may lead to (first: the usual one) and why."""

    to: tuple[Stage, ...]
    handler: Handler
    doc: str


def step(memory: LifecycleMemory, event: Event, now: float, params: LifecycleParams) -> Transition:
    """Apply one event. Pure: same inputs, same output; never raises for an unexpected (stage, event)."""
    row = TRANSITIONS.get((memory.stage, event.kind))
    if row is None:
        why = REJECTED_WHY.get((memory.stage, event.kind), f"not allowed in stage {memory.stage.value}")
        return _reject(memory, event, now, why)
    return row.handler(memory, event, now, params)


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


def _faults(faults: Any, n: int) -> tuple[str, ...]:
    """``n`` fault keys: the stored ones, "" (unknown, never equal to another) for failures without one."""
    keys = tuple(str(k) for k in faults)[:n]
    return keys + ("",) * (n - len(keys))


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
