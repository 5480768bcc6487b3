"""Typed errors of the human gate.

Input: nothing. Output: one exception hierarchy rooted at ``GateError`` so the CLI and the daemon can catch
the gate's failures without catching programming errors. Every error says what failed and where (file and line
for key files, a reason code for rejected approvals) so that an operator can act on it without a debugger.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path


class GateError(Exception):
    """Base of every error the gate raises on purpose."""


# --------------------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------------------


class KeyFileError(GateError):
    """A key file (private key or authorized keys) cannot be used. Names the file and, if known, the line."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {message}")


class UnsafeKeyPermissions(KeyFileError):
    """A private key readable by group/others, or an authorized-keys file writable by group/others."""


class KeyExists(KeyFileError):
    """``keygen`` refuses to overwrite an existing key file."""


# --------------------------------------------------------------------------------------------------------
# Approvals
# --------------------------------------------------------------------------------------------------------


class RejectReason(StrEnum):
    """Why an approval/denial envelope was refused. Stable strings: the audit log and scripts use them."""

    MALFORMED = "malformed"  # not UTF-8/JSON, missing or extra fields, wrong types, > 16 KiB, bad base64
    UNKNOWN_KEY = "unknown_key"  # key_id not in authorized_keys (never authorized, or revoked)
    BAD_SIGNATURE = (
        "bad_signature"  # signature does not verify: forged, or any signed field changed after signing
    )
    BAD_LIFETIME = "bad_lifetime"  # expires_at <= issued_at, or a lifetime longer than the verifier allows
    UNKNOWN_PROPOSAL = "unknown_proposal"  # the gate has no proposal with this id
    WRONG_PROPOSAL = "wrong_proposal"  # signed for another proposal than the one being decided
    WRONG_NODE = "wrong_node"  # signed for another node than the proposal's
    REPLAYED = "replayed"  # nonce already consumed by an applied decision
    ALREADY_SETTLED = "already_settled"  # proposal is approved/denied/expired/settled_by_admin/superseded
    PROPOSAL_EXPIRED = "proposal_expired"  # proposal still pending but past its own deadline
    EXPIRED = "expired"  # the signed statement itself is past its expires_at
    ISSUED_IN_FUTURE = "issued_in_future"  # issued_at later than now + allowed clock skew


UNAUTHENTICATED_REASONS = frozenset(
    {RejectReason.MALFORMED, RejectReason.UNKNOWN_KEY, RejectReason.BAD_SIGNATURE}
)
"""Refusals before an authorized key is proven to have signed: anyone can cause them, so they write nothing
durable (the audit log is for what admins did); the listener counts them in a metric."""


class ApprovalRejected(GateError):
    """An envelope was refused. ``reason`` is machine-readable, ``message`` is for humans."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(f"{reason.value}: {message}")

    @property
    def authenticated(self) -> bool:
        """Whether an authorized admin's signature checked out (then the refusal is audited)."""
        return self.reason not in UNAUTHENTICATED_REASONS


class UnknownProposal(GateError):
    def __init__(self, proposal_id: str) -> None:
        self.proposal_id = proposal_id
        super().__init__(f"no proposal {proposal_id!r}")


class ProposalNotPending(GateError):
    def __init__(self, proposal_id: str, status: str) -> None:
        self.proposal_id = proposal_id
        self.status = status
        super().__init__(f"proposal {proposal_id} is {status}, not pending")


class ReasonMismatch(GateError):
    """An admin's Slurm drain reason does not name the proposal (``#p-...``) it is claimed to settle."""


# --------------------------------------------------------------------------------------------------------
# Audit
# --------------------------------------------------------------------------------------------------------


class AuditIntegrityError(GateError):
    """The audit chain no longer extends the recorded head: entries were removed or rewritten.

    The gate refuses to append (and so to apply decisions) until an operator investigates; see ``audit.py``.
    """
