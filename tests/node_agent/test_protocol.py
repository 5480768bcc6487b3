from __future__ import annotations

import hashlib
import hmac

import pytest

from node_agent.protocol import AgentEvent, AgentEventBatch, SignatureError, sign, signed_headers, verify

SECRET = b"0123456789abcdef-secret"
NOW = 1_700_000_000


def _batch(node: str = "n1") -> bytes:
    ev = AgentEvent(
        event_id="e1",
        time=NOW,
        node=node,
        gpu=0,
        uuid="GPU-x",
        kind="xid",
        xid=79,
        fatal=True,
        message="XID 79",
    )
    return AgentEventBatch(node=node, events=[ev]).model_dump_json().encode()


def test_sign_matches_spec() -> None:
    body = b'{"a":1}'
    expected = hmac.new(SECRET, b"123." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 123, body) == "sha256=" + expected


def test_verify_roundtrip() -> None:
    body = _batch()
    batch = verify(SECRET, signed_headers(SECRET, "n1", NOW, body), body, now=NOW + 10)
    assert batch.events[0].xid == 79


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda h, b: (h, b.replace(b"79", b"80")), "bad signature"),
        (
            lambda h, b: ({**h, "X-FleetYield-Signature": sign(b"other-secret-xxxxxx", NOW, b)}, b),
            "bad signature",
        ),
        (
            lambda h, b: ({k: v for k, v in h.items() if k != "X-FleetYield-Signature"}, b),
            "missing X-FleetYield-Sig",
        ),
        (lambda h, b: ({**h, "X-FleetYield-Timestamp": "yesterday"}, b), "not unix seconds"),
        (lambda h, b: ({**h, "X-FleetYield-Signature": "md5=abc"}, b), "expected 'sha256="),
    ],
)
def test_verify_rejects(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    body = _batch()
    headers, body2 = mutate(signed_headers(SECRET, "n1", NOW, body), body)
    with pytest.raises(SignatureError, match=message):
        verify(SECRET, headers, body2, now=NOW)


def test_verify_rejects_stale_timestamp() -> None:
    body = _batch()
    with pytest.raises(SignatureError, match="stale timestamp"):
        verify(SECRET, signed_headers(SECRET, "n1", NOW - 301, body), body, now=NOW)


def test_verify_rejects_node_mismatch_and_malformed_body() -> None:
    body = _batch("n2")
    with pytest.raises(SignatureError, match="node mismatch"):
        verify(SECRET, signed_headers(SECRET, "n1", NOW, body), body, now=NOW)
    junk = b'{"node": "n1", "events": [{"kind": "boom"}]}'
    with pytest.raises(SignatureError, match="malformed body"):
        verify(SECRET, signed_headers(SECRET, "n1", NOW, junk), junk, now=NOW)


def test_header_names_are_case_insensitive() -> None:
    body = _batch()
    headers = {k.lower(): v for k, v in signed_headers(SECRET, "n1", NOW, body).items()}
    assert verify(SECRET, headers, body, now=NOW).node == "n1"
