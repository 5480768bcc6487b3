"""Signed quotes: the node's measured state bound to a controller nonce, signed with the node key.

Input: node name, a controller nonce (64 lowercase hex digits), ordered records, the node's Ed25519 key,
the time and optionally a TPM section (``tpm.Tpm.quote``). Output: the quote document::

    {"version": 1, "node", "nonce", "records": [{index, kind, name, digest, value?}], "pcr" (hex),
     "time", "key_id", "tpm"?: {...}, "signature": base64 Ed25519 over canonical(quote - signature)}

The records travel in full so the verifier replays the chain (``chain.replay``) and compares each record
with its policy; ``pcr`` is the node's claim, which the replay must reproduce.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from node_agent.attest.chain import Record, canonical, replay
from node_agent.attest.keys import key_id_of

QUOTE_VERSION = 1
NONCE_RE = re.compile(r"^[0-9a-f]{64}$")
NONCE_PATH = "/v1/attest/nonce"
"""Controller listener: ``POST {"node"}`` (HMAC-signed like pushes) -> ``{"node", "nonce", "expires_at"}``."""
QUOTE_PATH = "/v1/attest/quote"
"""Controller listener: ``POST`` the quote -> the signed verdict."""
AGENT_QUOTE_PATH = "/v1/attest/quote"
"""Agent exporter: ``GET ?nonce=HEX`` -> a quote (the controller-pull variant)."""


class QuoteError(ValueError):
    pass


def check_nonce(nonce: str) -> str:
    if not isinstance(nonce, str) or not NONCE_RE.fullmatch(nonce):
        raise QuoteError("a nonce is 64 lowercase hex digits (32 random bytes from the controller)")
    return nonce


def signed_payload(doc: Mapping[str, Any]) -> bytes:
    return canonical({k: v for k, v in doc.items() if k != "signature"})


def build_quote(
    node: str,
    nonce: str,
    records: Sequence[Record],
    key: Ed25519PrivateKey,
    now: float,
    tpm: dict[str, Any] | None = None,
    co_resident: Sequence[str] = (),
) -> dict[str, Any]:
    """The signed quote. ``co_resident``: the jobs still running here whose tenant records were left out
    (``job <id> uid <uid>`` lines; only on a shared node, so an exclusive node's quote is unchanged)."""
    doc: dict[str, Any] = {
        "version": QUOTE_VERSION,
        "node": node,
        "nonce": check_nonce(nonce),
        "records": [r.as_dict() for r in records],
        "pcr": replay(records),
        "time": round(now, 3),
        "key_id": key_id_of(key.public_key()),
    }
    if tpm is not None:
        doc["tpm"] = tpm
    if co_resident:
        doc["co_resident"] = list(co_resident)
    doc["signature"] = base64.b64encode(key.sign(signed_payload(doc))).decode("ascii")
    return doc


def signature_ok(doc: Mapping[str, Any], public_key: Ed25519PublicKey) -> bool:
    try:
        sig = base64.b64decode(str(doc.get("signature", "")), validate=True)
        public_key.verify(sig, signed_payload(doc))
    except (InvalidSignature, ValueError):
        return False
    return True
