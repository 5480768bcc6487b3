"""Signed approval/denial statements: how an admin's decision travels and is checked.

Input: an admin's private key and a proposal (signing side); an envelope text, the authorized keys, the
proposal, ``now`` and the set of consumed nonces (verifying side). Output: the envelope text, or a
``VerifiedDecision``; every refusal is an ``ApprovalRejected`` carrying a ``RejectReason`` code.

Statement (all fields required, no others; signed)::

    {"v": 1, "proposal_id": "p-0123456789ab", "node": "gpu-017", "action": "approve" | "deny",
     "nonce": "<32 lowercase hex = 16 random bytes>", "issued_at": <int Unix s>, "expires_at": <int Unix s>,
     "key_id": "<16 lowercase hex>", "note": "<free text, <= 500 chars, may be empty>"}

Signature: Ed25519 over ``SIGNING_CONTEXT + canonical_json(statement)`` (sorted keys, compact, UTF-8). The
context prefix keeps a FleetYield approval signature from being valid for anything else signed with the same
key, and vice versa.

Envelope (what ``fleetyield approve ID`` writes or sends; at most 16 KiB, canonical JSON, no newline)::

    {"signature": "<standard base64 of the 64-byte signature>", "statement": {...}}

Parsing is strict: duplicate JSON keys, NaN, floats or booleans where integers belong, unknown fields and
non-canonical base64 are all ``malformed``; so no second byte string maps onto an accepted statement.

Check order (the first failing check names the reason): malformed, unknown_key, bad_signature (also any field
changed after signing), bad_lifetime, wrong_proposal, wrong_node, replayed, already_settled,
proposal_expired, expired, issued_in_future. Authenticity comes first, so an unsigned or forged envelope
learns nothing about proposals or nonces.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
import time as _time
from collections.abc import Container, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slurm_fleetyield.gate.audit import canonical_json
from slurm_fleetyield.gate.errors import ApprovalRejected, RejectReason
from slurm_fleetyield.gate.keys import AdminKey, key_id_of, load_private_key
from slurm_fleetyield.gate.proposal import PROPOSAL_ID_RE, Proposal, ProposalStatus

SIGNING_CONTEXT = b"fleetyield-approval-v1\x00"
STATEMENT_VERSION = 1
ENVELOPE_MAX_BYTES = 16 * 1024
DEFAULT_TTL_S = 15 * 60
DEFAULT_CLOCK_SKEW_S = 60  # NTP keeps clusters within a second; 60 s tolerates a laptop that drifted
MAX_TTL_S = 24 * 3600  # a stolen envelope is useless after this, whatever the signer asked for
MAX_NOTE_CHARS = 500
_MAX_TIME = 2**53  # any larger "timestamp" is garbage; keeps ints exact in every JSON implementation


class Action(StrEnum):
    APPROVE = "approve"
    DENY = "deny"


class Statement(BaseModel):
    """The signed content of an admin's decision. Strict: JSON types must match exactly."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    v: int = Field(ge=STATEMENT_VERSION, le=STATEMENT_VERSION)
    proposal_id: str = Field(pattern=f"^{PROPOSAL_ID_RE.pattern}$")
    node: str = Field(pattern=r"^\S{1,255}$")
    action: str = Field(pattern=r"^(approve|deny)$")
    nonce: str = Field(pattern=r"^[0-9a-f]{32}$")
    issued_at: int = Field(ge=0, lt=_MAX_TIME)
    expires_at: int = Field(ge=0, lt=_MAX_TIME)
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    note: str = Field(max_length=MAX_NOTE_CHARS)

    def signed_bytes(self) -> bytes:
        return SIGNING_CONTEXT + canonical_json(self.model_dump())


class Envelope(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    statement: Statement
    signature: str = Field(pattern=r"^[A-Za-z0-9+/]{86}==$")  # 64 bytes, standard base64


class ProposalRef(Protocol):
    """What signing needs from a proposal: a ``Proposal`` or anything with ``id`` and ``node``."""

    @property
    def id(self) -> str: ...

    @property
    def node(self) -> str: ...


@dataclass(frozen=True, slots=True)
class VerifiedDecision:
    """An authentic, in-date, unreplayed decision about a pending proposal. Not yet applied."""

    proposal_id: str
    node: str
    action: Action
    admin: str
    key_id: str
    nonce: str
    issued_at: int
    expires_at: int
    note: str
    envelope_sha256: str


# --------------------------------------------------------------------------------------------------------
# Signing (admin side)
# --------------------------------------------------------------------------------------------------------


def make_statement(
    proposal: ProposalRef,
    action: Action | str,
    key_id: str,
    now: float,
    ttl_s: int = DEFAULT_TTL_S,
    *,
    note: str = "",
    nonce: str | None = None,
) -> Statement:
    issued = int(now)
    return Statement(
        v=STATEMENT_VERSION,
        proposal_id=proposal.id,
        node=proposal.node,
        action=Action(action).value,
        nonce=nonce if nonce is not None else secrets.token_hex(16),
        issued_at=issued,
        expires_at=issued + int(ttl_s),
        key_id=key_id,
        note=note,
    )


def seal(statement: Statement, private_key: Ed25519PrivateKey) -> str:
    """Sign ``statement`` and return the envelope text."""
    if key_id_of(private_key.public_key()) != statement.key_id:
        raise ValueError("statement key_id does not belong to this private key")
    sig = private_key.sign(statement.signed_bytes())
    env = {"signature": base64.b64encode(sig).decode("ascii"), "statement": statement.model_dump()}
    return canonical_json(env).decode("utf-8")


def sign_statement(
    private_key_path: str | Path,
    proposal: ProposalRef,
    action: Action | str,
    now: float | None = None,
    ttl_s: int = DEFAULT_TTL_S,
    *,
    note: str = "",
    allow_unsafe_permissions: bool = False,
) -> str:
    """Envelope text for ``fleetyield approve|deny ID``: ``action`` on ``proposal``, valid ``ttl_s`` seconds.

    ``now`` defaults to the wall clock (this is the CLI edge). Raises ``KeyFileError`` /
    ``UnsafeKeyPermissions`` for an unusable key, ``ValueError`` for a bad action, ttl or note.
    """
    if not 0 < ttl_s <= MAX_TTL_S:
        raise ValueError(f"ttl_s must be in (0, {MAX_TTL_S}], got {ttl_s}")
    key = load_private_key(private_key_path, allow_unsafe_permissions=allow_unsafe_permissions)
    t = _time.time() if now is None else now
    return seal(make_statement(proposal, action, key_id_of(key.public_key()), t, ttl_s, note=note), key)


# --------------------------------------------------------------------------------------------------------
# Verifying (gate side)
# --------------------------------------------------------------------------------------------------------


def _reject(reason: RejectReason, message: str) -> ApprovalRejected:
    return ApprovalRejected(reason, message)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def envelope_digest(envelope_text: str | bytes) -> str:
    raw = envelope_text.encode("utf-8", "surrogatepass") if isinstance(envelope_text, str) else envelope_text
    return hashlib.sha256(raw).hexdigest()


def parse_envelope(envelope_text: str | bytes) -> Envelope:
    """Strictly parse an envelope; any defect raises ``ApprovalRejected(MALFORMED)``."""
    if len(envelope_text) > ENVELOPE_MAX_BYTES:
        raise _reject(RejectReason.MALFORMED, f"envelope larger than {ENVELOPE_MAX_BYTES} bytes")
    if isinstance(envelope_text, bytes):
        try:
            text = envelope_text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _reject(RejectReason.MALFORMED, f"envelope is not UTF-8: {e}") from e
    else:
        text = envelope_text
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise _reject(RejectReason.MALFORMED, f"envelope is not encodable as UTF-8: {e}") from e
        if size > ENVELOPE_MAX_BYTES:
            raise _reject(RejectReason.MALFORMED, f"envelope larger than {ENVELOPE_MAX_BYTES} bytes")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise _reject(RejectReason.MALFORMED, f"envelope is not valid JSON: {e}") from e
    try:
        env = Envelope.model_validate(obj)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()[:5]
        )
        raise _reject(RejectReason.MALFORMED, f"envelope fields: {problems}") from e
    return env


def _signature_bytes(env: Envelope) -> bytes:
    try:
        sig = base64.b64decode(env.signature, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _reject(RejectReason.MALFORMED, f"signature is not base64: {e}") from e
    # Base64 has spare bits in its last character; only the canonical spelling is accepted, so one
    # signature has exactly one envelope text.
    if len(sig) != 64 or base64.b64encode(sig).decode("ascii") != env.signature:
        raise _reject(RejectReason.MALFORMED, "signature is not a canonical base64 64-byte Ed25519 signature")
    return sig


def authenticate(env: Envelope, authorized_keys: Mapping[str, AdminKey]) -> AdminKey:
    """The admin whose key signed ``env``; raises ``unknown_key`` or ``bad_signature``."""
    sig = _signature_bytes(env)
    admin = authorized_keys.get(env.statement.key_id)
    if admin is None:
        raise _reject(RejectReason.UNKNOWN_KEY, f"key {env.statement.key_id} is not in the authorized keys")
    try:
        admin.public_key.verify(sig, env.statement.signed_bytes())
    except InvalidSignature as e:
        raise _reject(
            RejectReason.BAD_SIGNATURE,
            f"signature does not verify with {admin.name}'s key {admin.key_id} (forged, or content changed)",
        ) from e
    return admin


def check_decision(
    st: Statement,
    admin: AdminKey,
    proposal: Proposal,
    now: float,
    seen_nonces: Container[str],
    *,
    envelope_sha256: str = "",
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
    max_ttl_s: float = MAX_TTL_S,
) -> VerifiedDecision:
    """Everything after authenticity: lifetime, binding to ``proposal``, replay, proposal state, time."""
    lifetime = st.expires_at - st.issued_at
    if lifetime <= 0 or lifetime > max_ttl_s:
        raise _reject(
            RejectReason.BAD_LIFETIME, f"statement lifetime {lifetime}s is outside (0, {max_ttl_s:g}] seconds"
        )
    if st.proposal_id != proposal.id:
        raise _reject(RejectReason.WRONG_PROPOSAL, f"signed for {st.proposal_id}, not {proposal.id}")
    if st.node != proposal.node:
        raise _reject(
            RejectReason.WRONG_NODE,
            f"signed for node {st.node!r}, proposal {proposal.id} is {proposal.node!r}",
        )
    if st.nonce in seen_nonces:
        raise _reject(RejectReason.REPLAYED, f"nonce {st.nonce} was already used")
    if proposal.status is not ProposalStatus.PENDING:
        raise _reject(
            RejectReason.ALREADY_SETTLED, f"proposal {proposal.id} is already {proposal.status.value}"
        )
    if now >= proposal.expires_at:
        raise _reject(
            RejectReason.PROPOSAL_EXPIRED, f"proposal {proposal.id} expired at {proposal.expires_at:.0f}"
        )
    if now >= st.expires_at:
        raise _reject(RejectReason.EXPIRED, f"statement expired at {st.expires_at} (now {now:.0f})")
    if st.issued_at > now + clock_skew_s:
        raise _reject(
            RejectReason.ISSUED_IN_FUTURE,
            f"issued at {st.issued_at}, more than {clock_skew_s:g}s after now ({now:.0f}): check clocks",
        )
    return VerifiedDecision(
        proposal_id=st.proposal_id,
        node=st.node,
        action=Action(st.action),
        admin=admin.name,
        key_id=admin.key_id,
        nonce=st.nonce,
        issued_at=st.issued_at,
        expires_at=st.expires_at,
        note=st.note,
        envelope_sha256=envelope_sha256,
    )


def verify_statement(
    envelope_text: str | bytes,
    authorized_keys: Mapping[str, AdminKey],
    proposal: Proposal,
    now: float,
    seen_nonces: Container[str],
    *,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
    max_ttl_s: float = MAX_TTL_S,
) -> VerifiedDecision:
    """Check an envelope against ``proposal`` at ``now``. Pure: records nothing (``Gatekeeper.submit`` does).

    Raises ``ApprovalRejected`` with the first failing ``RejectReason`` (order in the module docstring).
    """
    env = parse_envelope(envelope_text)
    admin = authenticate(env, authorized_keys)
    return check_decision(
        env.statement,
        admin,
        proposal,
        now,
        seen_nonces,
        envelope_sha256=envelope_digest(envelope_text),
        clock_skew_s=clock_skew_s,
        max_ttl_s=max_ttl_s,
    )
