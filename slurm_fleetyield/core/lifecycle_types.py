"""The lifecycle's vocabulary: stages, event kinds, remediations, its parameters, and the memory, event,
transition and table-row types of the state machine core/lifecycle.py runs (core/lifecycle_steps.py has
the handlers).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from slurm_fleetyield.core.model import LogEvent
from slurm_fleetyield.core.rehab_actions import (
    LifecycleAction,
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
    # The driver's requested recovery (DCGM_FI_DEV_GPU_RECOVERY_ACTION): a GPU or bus reset (drain P2P or
    # drain and reset first), else a reboot; each escalates when it did not clear the request.
    "recovery_gpu_reset": (_R, _B, _P),
    "recovery_node_reboot": (_B, _P),
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
_LADDER_KEY = re.compile(
    r"^(xid_[1-9][0-9]*|gpu_missing|recovery_gpu_reset|recovery_node_reboot|check_failed|alert|approved|default)$"
)
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
        description="Escalation ladder per fault class (xid_<n>, gpu_missing, recovery_gpu_reset, "
        "recovery_node_reboot, check_failed, alert, approved, default), gentlest first. Attempt n uses "
        "rung n, the last rung once exhausted. A class without its own ladder uses 'default'. Given "
        "ladders replace the defaults of their class only.",
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
                    f"unknown fault class {key!r} in ladders; known: xid_<n>, gpu_missing, "
                    "recovery_gpu_reset, recovery_node_reboot, check_failed, alert, approved, default"
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
        if self.kind.startswith("recovery_"):  # the driver's request (core/evidence.py RECOVERY_ACTIONS)
            what = self.detail or self.kind.removeprefix("recovery_").replace("_", " ")
            return f"driver requests {what}{gpu}"
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


def _faults(faults: Any, n: int) -> tuple[str, ...]:
    """``n`` fault keys: the stored ones, "" (unknown, never equal to another) for failures without one."""
    keys = tuple(str(k) for k in faults)[:n]
    return keys + ("",) * (n - len(keys))
