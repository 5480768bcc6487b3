"""The human gate: a pre-emptive drain of a degrading (not dead) node needs an admin's signed approval.

Input: drain proposals from the core, Ed25519-signed approve/deny envelopes from admins, the clock. Output:
proposals settled exactly once and a hash-chained audit log of every decision and every refusal of an
authentic envelope (one that fails authentication writes nothing; the listener counts it).

Modules, one idea each:
* ``keys``       admin key pairs, the authorized-keys file, safe private-key loading
* ``proposal``   the ``Proposal`` model and its statuses
* ``approvals``  signed statements and envelopes: ``sign_statement`` / ``verify_statement``
* ``audit``      the append-only hash-chained log, its head checkpoint, ``verify_chain``
* ``gatekeeper`` ``Gatekeeper``: proposals, nonces and audit in one SQLite database, applied atomically
* ``errors``     ``GateError`` and its subclasses, ``RejectReason``

Typical flow (CLI wiring)::

    keygen("alice", "~/.fleetyield")                                  # fleetyield keygen alice
    env = sign_statement("~/.fleetyield/alice.key", proposal, "approve")  # fleetyield approve p-...
    with Gatekeeper.open(state_dir) as gk:                            # daemon / gate side
        gk.submit(env, load_authorized_keys(path), now=time.time())
        gk.verify_audit()                                             # fleetyield audit verify

Exports are loaded lazily (PEP 562): ``import slurm_fleetyield.gate.proposal`` from the pure core pulls in
only stdlib and pydantic, not ``cryptography`` or ``sqlite3``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_fleetyield.gate.approvals import (
        DEFAULT_CLOCK_SKEW_S,
        DEFAULT_TTL_S,
        ENVELOPE_MAX_BYTES,
        MAX_TTL_S,
        Action,
        Envelope,
        Statement,
        VerifiedDecision,
        parse_envelope,
        sign_statement,
        verify_statement,
    )
    from slurm_fleetyield.gate.audit import (
        AuditEntry,
        AuditHead,
        AuditLog,
        AuditReport,
        read_head,
        verify_chain,
        verify_jsonl,
    )
    from slurm_fleetyield.gate.errors import (
        ApprovalRejected,
        AuditIntegrityError,
        GateError,
        KeyExists,
        KeyFileError,
        ProposalNotPending,
        ReasonMismatch,
        RejectReason,
        UnknownProposal,
        UnsafeKeyPermissions,
    )
    from slurm_fleetyield.gate.gatekeeper import AppliedDecision, Gatekeeper
    from slurm_fleetyield.gate.keys import AdminKey, keygen, load_authorized_keys, load_private_key
    from slurm_fleetyield.gate.proposal import (
        Proposal,
        ProposalStatus,
        new_proposal_id,
        proposal_ids_in_reason,
    )

_EXPORTS: dict[str, str] = {
    "Action": "approvals",
    "AdminKey": "keys",
    "AppliedDecision": "gatekeeper",
    "ApprovalRejected": "errors",
    "AuditEntry": "audit",
    "AuditHead": "audit",
    "AuditIntegrityError": "errors",
    "AuditLog": "audit",
    "AuditReport": "audit",
    "DEFAULT_CLOCK_SKEW_S": "approvals",
    "DEFAULT_TTL_S": "approvals",
    "ENVELOPE_MAX_BYTES": "approvals",
    "Envelope": "approvals",
    "GateError": "errors",
    "Gatekeeper": "gatekeeper",
    "KeyExists": "errors",
    "KeyFileError": "errors",
    "MAX_TTL_S": "approvals",
    "Proposal": "proposal",
    "ProposalNotPending": "errors",
    "ProposalStatus": "proposal",
    "ReasonMismatch": "errors",
    "RejectReason": "errors",
    "Statement": "approvals",
    "UnknownProposal": "errors",
    "UnsafeKeyPermissions": "errors",
    "VerifiedDecision": "approvals",
    "keygen": "keys",
    "load_authorized_keys": "keys",
    "load_private_key": "keys",
    "new_proposal_id": "proposal",
    "parse_envelope": "approvals",
    "proposal_ids_in_reason": "proposal",
    "read_head": "audit",
    "sign_statement": "approvals",
    "verify_chain": "audit",
    "verify_jsonl": "audit",
    "verify_statement": "approvals",
}
__all__ = [
    "DEFAULT_CLOCK_SKEW_S",
    "DEFAULT_TTL_S",
    "ENVELOPE_MAX_BYTES",
    "MAX_TTL_S",
    "Action",
    "AdminKey",
    "AppliedDecision",
    "ApprovalRejected",
    "AuditEntry",
    "AuditHead",
    "AuditIntegrityError",
    "AuditLog",
    "AuditReport",
    "Envelope",
    "GateError",
    "Gatekeeper",
    "KeyExists",
    "KeyFileError",
    "Proposal",
    "ProposalNotPending",
    "ProposalStatus",
    "ReasonMismatch",
    "RejectReason",
    "Statement",
    "UnknownProposal",
    "UnsafeKeyPermissions",
    "VerifiedDecision",
    "keygen",
    "load_authorized_keys",
    "load_private_key",
    "new_proposal_id",
    "parse_envelope",
    "proposal_ids_in_reason",
    "read_head",
    "sign_statement",
    "verify_chain",
    "verify_jsonl",
    "verify_statement",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
