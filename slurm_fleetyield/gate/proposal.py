"""Drain proposals: what a human is asked to approve.

Input: the core's decision that a degrading (not dead) node should be drained, with its evidence. Output: an
immutable ``Proposal`` value with a short unique id (``p-<12 hex>``) that admins quote in ``fleetyield
approve``/``deny`` and in a manual ``scontrol`` drain reason (``#p-...``). The core decides *when* to propose;
``Gatekeeper`` stores proposals and moves them through their statuses. Times are Unix seconds (float), the
same clock as the rest of the controller.

Status lifecycle: ``pending`` -> one of ``approved`` | ``denied`` (signed decision), ``expired`` (deadline
passed), ``settled_by_admin`` (an admin drained the node by hand, naming the proposal), ``superseded`` (a
newer proposal for the same node replaced it). Every status except ``pending`` is final.
"""

from __future__ import annotations

import math
import re
import secrets
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PROPOSAL_ID_RE = re.compile(r"p-[0-9a-f]{12}")
_REASON_REF_RE = re.compile(r"#(p-[0-9a-f]{12})(?![0-9A-Za-z])")
DEFAULT_PROPOSAL_TTL_S = 24 * 3600.0
MAX_EVIDENCE_CHARS = 64 * 1024


class ProposalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    SETTLED_BY_ADMIN = "settled_by_admin"
    SUPERSEDED = "superseded"
    WITHDRAWN = "withdrawn"  # the controller closed it without a decision (risk fell, node drained anyway)

    @property
    def final(self) -> bool:
        return self is not ProposalStatus.PENDING


def new_proposal_id() -> str:
    """``p-`` + 12 random hex digits (48 bits: collisions are negligible and checked by the store anyway)."""
    return "p-" + secrets.token_hex(6)


def proposal_ids_in_reason(reason: str) -> list[str]:
    """Proposal ids an admin's Slurm drain reason refers to (``... #p-0123456789ab ...``), in order."""
    return _REASON_REF_RE.findall(reason)


class Proposal(BaseModel):
    """A request to drain ``node`` (its ``gpus`` degrading), waiting for an admin's signed decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=PROPOSAL_ID_RE.pattern, description="p-<12 hex>, unique in the gate's store")
    node: str = Field(pattern=r"^\S{1,255}$", description="Slurm node name")
    gpus: tuple[int, ...] = Field(description="indices of the degrading GPUs on the node")
    risk: float = Field(description="the core's risk score at proposal time")
    evidence: str = Field(max_length=MAX_EVIDENCE_CHARS, description="the `explain` output shown to admins")
    affected_jobs: tuple[int, ...] = Field(default=(), description="Slurm job ids running on the node")
    created_at: float
    expires_at: float
    status: ProposalStatus = ProposalStatus.PENDING
    settled_at: float | None = None
    settled_by: str | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus_non_negative(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(g < 0 for g in v):
            raise ValueError(f"GPU indices must be >= 0, got {v}")
        return v

    @field_validator("risk", "created_at", "expires_at")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be finite, got {v}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> Proposal:
        if self.expires_at <= self.created_at:
            raise ValueError(f"expires_at {self.expires_at} must be after created_at {self.created_at}")
        if self.status.final and self.settled_at is None:
            raise ValueError(f"a {self.status.value} proposal needs settled_at")
        return self

    @classmethod
    def new(
        cls,
        *,
        node: str,
        gpus: tuple[int, ...] | list[int],
        risk: float,
        evidence: str,
        affected_jobs: tuple[int, ...] | list[int] = (),
        now: float,
        ttl_s: float = DEFAULT_PROPOSAL_TTL_S,
        id: str | None = None,
    ) -> Proposal:
        """A fresh pending proposal expiring ``ttl_s`` after ``now``."""
        return cls(
            id=id or new_proposal_id(),
            node=node,
            gpus=tuple(gpus),
            risk=risk,
            evidence=evidence,
            affected_jobs=tuple(affected_jobs),
            created_at=now,
            expires_at=now + ttl_s,
        )

    def settled(self, status: ProposalStatus, at: float, by: str) -> Proposal:
        """This proposal in a final ``status`` (a new value; proposals are immutable)."""
        if not status.final:
            raise ValueError("settled() needs a final status")
        return self.model_copy(update={"status": status, "settled_at": at, "settled_by": by})

    def is_open(self, now: float) -> bool:
        """Pending and not past its deadline: the only state in which a decision may be applied."""
        return self.status is ProposalStatus.PENDING and now < self.expires_at
