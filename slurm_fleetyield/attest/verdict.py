"""Signed verdicts: what the controller concluded about one quote, checkable offline by anyone.

Input: the verification outcome and the controller's Ed25519 key. Output: the verdict document::

    {"version": 1, "node", "node_class", "status": "pass"|"fail", "authenticated": bool, "nonce",
     "quote_pcr", "quote_time", "time", "tpm": "verified"|"absent", "reasons": [...],
     "differences": [{name, kind, problem, expected, actual, actual_value}],
     "digests": {record name: digest} (a pass only: what the Prolog re-checks), "key_id", "node_key_id",
     "signature": base64 Ed25519 over canonical(verdict - signature)}

``authenticated`` is true only when the quote's signature matched the node's enrolled key *and* its nonce
was fresh: only such verdicts are stored as the node's latest and may quarantine it (otherwise anyone
reaching the listener could get a node drained by posting garbage or replaying an old quote).
``check(doc, public_key)`` is the offline check (``fleetyield attest verify``): it needs no controller.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from node_agent.attest.chain import canonical
from slurm_fleetyield.gate.keys import key_id_of

VERDICT_VERSION = 1


class VerdictError(ValueError):
    pass


def payload(doc: Mapping[str, Any]) -> bytes:
    return canonical({k: v for k, v in doc.items() if k != "signature"})


def sign(doc: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    out = {k: v for k, v in doc.items() if k != "signature"}
    out["version"] = VERDICT_VERSION
    out["key_id"] = key_id_of(key.public_key())
    out["signature"] = base64.b64encode(key.sign(payload(out))).decode("ascii")
    return out


def check(doc: Mapping[str, Any], public_key: Ed25519PublicKey) -> dict[str, Any]:
    """Return the verdict when its signature verifies with ``public_key``; else ``VerdictError`` says why."""
    if not isinstance(doc, Mapping) or "signature" not in doc:
        raise VerdictError("not a signed verdict (no 'signature')")
    if doc.get("key_id") != key_id_of(public_key):
        raise VerdictError(f"signed by key {doc.get('key_id')!r}, not by {key_id_of(public_key)!r}")
    try:
        sig = base64.b64decode(str(doc["signature"]), validate=True)
        public_key.verify(sig, payload(doc))
    except (InvalidSignature, ValueError):
        raise VerdictError(
            "bad signature: the verdict was altered after signing, or another key signed it"
        ) from None
    return dict(doc)


def drain_reason(doc: Mapping[str, Any]) -> str:
    """``fleetyield: attestation failed (/etc/ld.so.preload, kernel/modules)`` -- one source of truth."""
    from prolog_epilog.attest_gate import failure_reason

    return failure_reason(dict(doc))
