"""Signed statements and their verification (slurm_fleetyield/gate/approvals.py): every rejection reason."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_fleetyield.gate.approvals import (
    DEFAULT_TTL_S,
    ENVELOPE_MAX_BYTES,
    MAX_TTL_S,
    Action,
    Statement,
    make_statement,
    parse_envelope,
    seal,
    sign_statement,
    verify_statement,
)
from slurm_fleetyield.gate.audit import canonical_json
from slurm_fleetyield.gate.errors import ApprovalRejected, RejectReason, UnsafeKeyPermissions
from slurm_fleetyield.gate.keys import load_private_key
from slurm_fleetyield.gate.proposal import Proposal, ProposalStatus

from .conftest import Admins
from .helpers import NODE, PID, T0, make_proposal


@dataclass(frozen=True)
class Ref:
    id: str
    node: str


def _reason(envelope: str | bytes, admins: Admins, proposal: Proposal, now: float = T0, seen=()) -> str:
    with pytest.raises(ApprovalRejected) as e:
        verify_statement(envelope, admins.keys, proposal, now, set(seen))
    assert e.value.message and str(e.value).startswith(e.value.reason.value)
    return e.value.reason.value


def _resign(admins: Admins, **fields: Any) -> str:
    """An envelope signed by alice over a statement with ``fields`` overridden (bypassing sign_statement)."""
    key = load_private_key(admins.alice)
    base = make_statement(Ref(PID, NODE), "approve", _key_id(admins, "alice"), T0).model_dump()
    base.update(fields)
    st_ = Statement.model_construct(**base)
    sig = key.sign(st_.signed_bytes())
    return canonical_json({"signature": base64.b64encode(sig).decode(), "statement": base}).decode()


def _key_id(admins: Admins, name: str) -> str:
    return next(k.key_id for k in admins.keys.values() if k.name == name)


def _edit(envelope: str, **fields: Any) -> str:
    obj = json.loads(envelope)
    obj["statement"].update(fields)
    return canonical_json(obj).decode()


# ---- happy paths -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["approve", "deny"])
def test_valid_envelope_is_accepted(admins: Admins, proposal: Proposal, action: str) -> None:
    env = sign_statement(admins.alice, proposal, action, now=T0, note="looks bad, drain it")
    d = verify_statement(env, admins.keys, proposal, T0 + 10, set())
    assert (d.proposal_id, d.node, d.action, d.admin) == (PID, NODE, Action(action), "alice")
    assert d.key_id == _key_id(admins, "alice") and len(d.nonce) == 32
    assert (d.issued_at, d.expires_at) == (int(T0), int(T0) + DEFAULT_TTL_S)
    assert d.note == "looks bad, drain it" and len(d.envelope_sha256) == 64
    assert verify_statement(env.encode(), admins.keys, proposal, T0, set()) == d  # bytes accepted too


def test_envelope_format(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.bob, proposal, Action.APPROVE, now=T0)
    obj = json.loads(env)
    assert list(obj) == ["signature", "statement"]
    assert canonical_json(obj).decode() == env and not env.endswith("\n")
    assert len(base64.b64decode(obj["signature"])) == 64
    assert sorted(obj["statement"]) == sorted(
        ["v", "proposal_id", "node", "action", "nonce", "issued_at", "expires_at", "key_id", "note"]
    )
    assert obj["statement"]["v"] == 1


def test_nonces_are_fresh(admins: Admins, proposal: Proposal) -> None:
    nonces = {json.loads(sign_statement(admins.alice, proposal, "approve", now=T0))["statement"]["nonce"]
              for _ in range(20)}  # fmt: skip
    assert len(nonces) == 20


def test_sign_statement_refuses_unsafe_key_and_bad_ttl(admins: Admins, proposal: Proposal, tmp_path) -> None:
    leaky = tmp_path / "leaky.key"
    leaky.write_bytes(admins.alice.read_bytes())
    leaky.chmod(0o644)
    with pytest.raises(UnsafeKeyPermissions):
        sign_statement(leaky, proposal, "approve", now=T0)
    for ttl in (0, -5, MAX_TTL_S + 1):
        with pytest.raises(ValueError):
            sign_statement(admins.alice, proposal, "approve", now=T0, ttl_s=ttl)
    with pytest.raises(ValueError):
        sign_statement(admins.alice, proposal, "maybe", now=T0)


# ---- authenticity ----------------------------------------------------------------------------------------


def test_unknown_key(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.mallory, proposal, "approve", now=T0)
    assert _reason(env, admins, proposal) == "unknown_key"


def test_revoked_key_is_unknown(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.bob, proposal, "approve", now=T0)
    without_bob = {k: v for k, v in admins.keys.items() if v.name != "bob"}
    with pytest.raises(ApprovalRejected) as e:
        verify_statement(env, without_bob, proposal, T0, set())
    assert e.value.reason is RejectReason.UNKNOWN_KEY


def test_bad_signature_claiming_another_admins_key(admins: Admins, proposal: Proposal) -> None:
    # mallory signs but claims to be alice
    key = load_private_key(admins.mallory)
    st_ = make_statement(proposal, "approve", _key_id(admins, "alice"), T0)
    sig = key.sign(st_.signed_bytes())
    env = canonical_json(
        {"signature": base64.b64encode(sig).decode(), "statement": st_.model_dump()}
    ).decode()
    assert _reason(env, admins, proposal) == "bad_signature"


def test_bad_signature_random_bytes(admins: Admins, proposal: Proposal) -> None:
    env = json.loads(sign_statement(admins.alice, proposal, "approve", now=T0))
    env["signature"] = base64.b64encode(bytes(64)).decode()
    assert _reason(canonical_json(env).decode(), admins, proposal) == "bad_signature"


def test_signature_without_domain_context_is_bad(admins: Admins, proposal: Proposal) -> None:
    key = load_private_key(admins.alice)
    st_ = make_statement(proposal, "approve", _key_id(admins, "alice"), T0)
    sig = key.sign(canonical_json(st_.model_dump()))  # no SIGNING_CONTEXT prefix
    env = canonical_json(
        {"signature": base64.b64encode(sig).decode(), "statement": st_.model_dump()}
    ).decode()
    assert _reason(env, admins, proposal) == "bad_signature"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("proposal_id", "p-aaaaaaaaaaaa"),
        ("node", "gpu-018"),
        ("action", "deny"),
        ("nonce", "0" * 32),
        ("issued_at", int(T0) - 1),
        ("expires_at", int(T0) + DEFAULT_TTL_S + 3600),
        ("note", "approved by the CTO"),
        ("key_id", "BOB"),  # replaced below by bob's real key id
    ],
)
def test_any_field_tampered_after_signing_is_bad_signature(
    admins: Admins, proposal: Proposal, field: str, value: Any
) -> None:
    if field == "key_id":
        value = _key_id(admins, "bob")
    env = sign_statement(admins.alice, proposal, "approve", now=T0)
    assert verify_statement(env, admins.keys, proposal, T0, set())
    assert _reason(_edit(env, **{field: value}), admins, proposal) == "bad_signature"


# ---- lifetime, binding, replay, state, time --------------------------------------------------------------


def test_expired(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.alice, proposal, "approve", now=T0, ttl_s=900)
    assert verify_statement(env, admins.keys, proposal, T0 + 899, set())
    assert _reason(env, admins, proposal, now=T0 + 900) == "expired"


def test_issued_in_future_beyond_clock_skew(admins: Admins, proposal: Proposal) -> None:
    ok = sign_statement(admins.alice, proposal, "approve", now=T0 + 60)
    assert verify_statement(ok, admins.keys, proposal, T0, set())  # 60 s skew tolerated
    env = sign_statement(admins.alice, proposal, "approve", now=T0 + 61)
    assert _reason(env, admins, proposal, now=T0) == "issued_in_future"
    with pytest.raises(ApprovalRejected, match="issued_in_future"):
        verify_statement(ok, admins.keys, proposal, T0, set(), clock_skew_s=5)


@pytest.mark.parametrize("lifetime", [0, -10, MAX_TTL_S + 1])
def test_bad_lifetime(admins: Admins, proposal: Proposal, lifetime: int) -> None:
    env = _resign(admins, expires_at=int(T0) + lifetime)
    assert _reason(env, admins, proposal) == "bad_lifetime"


def test_replayed(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.alice, proposal, "approve", now=T0)
    nonce = json.loads(env)["statement"]["nonce"]
    assert _reason(env, admins, proposal, seen={nonce}) == "replayed"


def test_wrong_node(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.alice, Ref(PID, "gpu-018"), "approve", now=T0)
    assert _reason(env, admins, proposal) == "wrong_node"


def test_wrong_proposal(admins: Admins, proposal: Proposal) -> None:
    env = sign_statement(admins.alice, Ref("p-bbbbbbbbbbbb", NODE), "approve", now=T0)
    assert _reason(env, admins, proposal) == "wrong_proposal"


@pytest.mark.parametrize("status", [s for s in ProposalStatus if s is not ProposalStatus.PENDING])
def test_already_settled(admins: Admins, proposal: Proposal, status: ProposalStatus) -> None:
    env = sign_statement(admins.alice, proposal, "deny", now=T0)
    settled = proposal.settled(status, T0 - 1, "someone")
    assert _reason(env, admins, settled) == "already_settled"


def test_pending_proposal_past_its_deadline(admins: Admins) -> None:
    p = make_proposal(ttl_s=600)
    env = sign_statement(admins.alice, p, "approve", now=T0 + 500)
    assert verify_statement(env, admins.keys, p, T0 + 599, set())
    assert _reason(env, admins, p, now=T0 + 600) == "proposal_expired"


# ---- malformed -------------------------------------------------------------------------------------------


def _valid(admins: Admins, proposal: Proposal) -> str:
    return sign_statement(admins.alice, proposal, "approve", now=T0)


def _drop(env: str, field: str) -> str:
    obj = json.loads(env)
    del obj["statement"][field]
    return canonical_json(obj).decode()


MALFORMED_CASES: dict[str, Any] = {
    "not json": lambda env: "approve p-0123456789ab please",
    "empty": lambda env: "",
    "not utf-8": lambda env: env.encode().replace(b'"approve"', b'"appr\xffve"'),
    "lone surrogate": lambda env: env.replace("approve", "appr\ud800ve"),
    "top-level list": lambda env: f"[{env}]",
    "missing signature": lambda env: canonical_json({"statement": json.loads(env)["statement"]}).decode(),
    "missing statement": lambda env: canonical_json({"signature": json.loads(env)["signature"]}).decode(),
    "missing nonce": lambda env: _drop(env, "nonce"),
    "missing note": lambda env: _drop(env, "note"),
    "extra field": lambda env: _edit(env, admin="root"),
    "extra top-level field": lambda env: env[:-1] + ',"x":1}',
    "issued_at as string": lambda env: _edit(env, issued_at=str(int(T0))),
    "issued_at as float": lambda env: _edit(env, issued_at=T0),
    "issued_at as bool": lambda env: _edit(env, issued_at=True),
    "huge issued_at": lambda env: _edit(env, issued_at=10**30),
    "action unknown": lambda env: _edit(env, action="approve!"),
    "action not a string": lambda env: _edit(env, action=1),
    "version 2": lambda env: _edit(env, v=2),
    "version as bool": lambda env: _edit(env, v=True),
    "nonce upper-case": lambda env: _edit(env, nonce="A" * 32),
    "nonce too short": lambda env: _edit(env, nonce="a" * 30),
    "note too long": lambda env: _edit(env, note="x" * 501),
    "statement is a string": lambda env: canonical_json(
        {"signature": json.loads(env)["signature"], "statement": "approve"}
    ).decode(),
    "duplicate key": lambda env: env.replace('"action":"approve"', '"action":"deny","action":"approve"'),
    "NaN": lambda env: env.replace(f'"issued_at":{int(T0)}', '"issued_at":NaN'),
    "signature too short": lambda env: env.replace(
        json.loads(env)["signature"], base64.b64encode(bytes(63)).decode()
    ),
    "signature not base64": lambda env: env.replace(json.loads(env)["signature"], "!" * 86 + "=="),
    "oversized": lambda env: env + " " * ENVELOPE_MAX_BYTES,
    "oversized bytes": lambda env: (env + " " * ENVELOPE_MAX_BYTES).encode(),
    "oversized multibyte": lambda env: env + "é" * (ENVELOPE_MAX_BYTES // 2),
    "deep nesting": lambda env: "[" * 5000 + "]" * 5000,
}


@pytest.mark.parametrize("case", list(MALFORMED_CASES))
def test_malformed(admins: Admins, proposal: Proposal, case: str) -> None:
    env = MALFORMED_CASES[case](_valid(admins, proposal))
    assert _reason(env, admins, proposal) == "malformed"


def test_whitespace_around_a_valid_envelope_is_tolerated(admins: Admins, proposal: Proposal) -> None:
    env = _valid(admins, proposal)
    assert verify_statement(f"\n {env}\n", admins.keys, proposal, T0, set())  # files end with a newline


def test_non_canonical_signature_base64_is_malformed(admins: Admins, proposal: Proposal) -> None:
    env = _valid(admins, proposal)
    sig = json.loads(env)["signature"]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = sig[85]  # 64 bytes = 85 full chars + 1 char carrying 4 spare bits, then "=="
    twin = sig[:85] + alphabet[alphabet.index(last) ^ 1] + "=="
    assert base64.b64decode(twin) == base64.b64decode(sig)
    assert _reason(env.replace(sig, twin), admins, proposal) == "malformed"


def test_parse_envelope_exposes_the_statement(admins: Admins, proposal: Proposal) -> None:
    env = parse_envelope(_valid(admins, proposal))
    assert env.statement.proposal_id == PID and env.statement.action == "approve"


# ---- mutations -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signed(admins: Admins) -> tuple[bytes, Proposal]:
    p = make_proposal()
    return sign_statement(admins.alice, p, "approve", now=T0).encode(), p


def _accepted(env: bytes, admins: Admins, p: Proposal) -> bool:
    try:
        verify_statement(env, admins.keys, p, T0 + 1, set())
    except ApprovalRejected:
        return False
    return True


def test_every_single_bit_and_case_flip_is_rejected(admins: Admins, signed: tuple[bytes, Proposal]) -> None:
    env, p = signed
    assert _accepted(env, admins, p)
    for i in range(len(env)):
        for mask in (0x01, 0x02, 0x20, 0x80):
            mutated = env[:i] + bytes([env[i] ^ mask]) + env[i + 1 :]
            assert not _accepted(mutated, admins, p), (i, mask, mutated)


@settings(max_examples=500, deadline=None)
@given(data=st.data())
def test_random_single_byte_mutations_are_never_accepted(
    admins: Admins, signed: tuple[bytes, Proposal], data: st.DataObject
) -> None:
    env, p = signed
    i = data.draw(st.integers(0, len(env) - 1), label="position")
    b = data.draw(st.integers(0, 255).filter(lambda x: x != env[i]), label="byte")
    mutated = env[:i] + bytes([b]) + env[i + 1 :]
    assert not _accepted(mutated, admins, p)


def test_envelope_signed_by_a_fresh_key_for_the_right_proposal_is_still_unknown(
    admins: Admins, proposal: Proposal
) -> None:
    key = Ed25519PrivateKey.generate()
    from slurm_fleetyield.gate.keys import key_id_of

    env = seal(make_statement(proposal, "approve", key_id_of(key.public_key()), T0), key)
    assert _reason(env, admins, proposal) == "unknown_key"
