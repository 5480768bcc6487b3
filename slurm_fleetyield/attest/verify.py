"""Quote -> verdict: the controller's check of one hand-over, and the service the listener calls.

Input: a node name, its quote (``node_agent.attest.quote``), the time, the ``AttestStore`` (enrolments,
nonces), the ``Policy`` and the controller key. Output: a signed verdict (``verdict``). Checks, in order,
each failure named in ``reasons``:

1. the node is enrolled (unknown node: fail) and the quote says it is that node;
2. the signature verifies with the *enrolled* key (a quote signed by another key fails);
3. the nonce was issued by this controller to this node, within its TTL, and is used once (burnt here);
4. the records are well formed, in index order, each ``value`` matches its digest, and replaying them
   gives the quote's ``pcr`` (a tampered record breaks the chain);
5. when the node was enrolled with a TPM attestation key: the TPM section verifies (``tpm2_checkquote``
   with the nonce) and the quoted PCR equals the replayed chain;
6. every record is allowed by the policy for the node's class (the differences are listed).

A passing verdict carries ``digests`` (record name -> digest): the Prolog recomputes the cheap records
(``measure.RECHECK``: loaded modules, taint, kernel knobs, ld.so.preload) before every job and denies when one
moved since this verdict, so a module loaded after the quote fails the next Prolog.

``AttestService`` adds nonce issuance and the two HTTP bodies of the exchange (see ``handle_nonce`` /
``handle_quote``) and the gate answer, so the lead wires three calls into the listener and the daemon.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from node_agent.attest.chain import Record, check_order, check_value, replay
from node_agent.attest.quote import NONCE_PATH, NONCE_RE, QUOTE_PATH, signature_ok
from slurm_fleetyield.attest import verdict as vd
from slurm_fleetyield.attest.policy import Policy, evaluate
from slurm_fleetyield.attest.store import NONCE_TTL_S, AttestStore, NonceError

TpmCheck = Callable[[dict, str, str], str]
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""A nonce request's own id (the agent sends 32 random hex digits): what makes a replay of it a duplicate."""
MAX_QUOTE_BYTES = 4 << 20


def _tpm_check_default(section: dict, ak_pem: str, nonce: str) -> str:
    from node_agent.attest.tpm import check_tpm_quote

    return check_tpm_quote(section, ak_pem, nonce)


def attest_node(
    node: str,
    quote: Mapping[str, Any],
    now: float,
    *,
    store: AttestStore,
    policy: Policy,
    key: Ed25519PrivateKey,
    tpm_check: TpmCheck = _tpm_check_default,
) -> dict[str, Any]:
    """Verify ``quote`` for ``node`` and return the signed verdict (stored when authenticated)."""
    reasons: list[str] = []
    differences: list[dict[str, Any]] = []
    authenticated = False
    tpm_state = "absent"
    nonce = str(quote.get("nonce", ""))
    enrolment = store.enrolment(node)
    if enrolment is None:
        reasons.append(f"node {node!r} is not enrolled (fleetyield attest enroll)")
    elif quote.get("node") != node:
        reasons.append(f"the quote names node {quote.get('node')!r}, not {node!r}")
    else:
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(enrolment.pubkey))
        if not signature_ok(quote, public):
            reasons.append(f"quote signature does not verify with {node}'s enrolled key {enrolment.key_id}")
        elif not NONCE_RE.fullmatch(nonce):
            reasons.append("quote nonce malformed")
        else:
            try:
                store.consume_nonce(node, nonce, now)
                authenticated = True
            except NonceError as exc:
                reasons.append(f"nonce {exc.code}: {exc}")
    records: list[Record] = []
    if authenticated:
        try:
            records = [Record.from_dict(r) for r in quote.get("records") or []]
        except ValueError as exc:
            reasons.append(f"malformed record: {exc}")
        if records:
            order = check_order(records)
            if order:
                reasons.append(f"chain: {order}")
            bad_values = [r.name for r in records if not check_value(r)]
            if bad_values:
                reasons.append(f"chain: value does not match digest for {', '.join(bad_values)}")
            replayed = replay(records)
            if replayed != quote.get("pcr"):
                reasons.append(
                    f"chain: replay gives {replayed[:16]}..., quote claims {str(quote.get('pcr'))[:16]}..."
                )
            if enrolment is not None and enrolment.ak_pem:
                section = quote.get("tpm")
                if not isinstance(section, dict):
                    reasons.append("tpm: node enrolled with a TPM AK but the quote has no TPM section")
                else:
                    try:
                        quoted = tpm_check(section, enrolment.ak_pem, nonce)
                        if quoted != replayed:
                            pcr_n = section.get("pcr_index")
                            reasons.append(f"tpm: PCR {pcr_n} {quoted[:16]}.. != chain {replayed[:16]}..")
                        else:
                            tpm_state = "verified"
                    except Exception as exc:
                        reasons.append(f"tpm: {exc}")
            if enrolment is not None:
                diffs = evaluate(records, node, enrolment.node_class, policy)
                differences = [d.model_dump() for d in diffs]
                if diffs:
                    reasons.append(f"{len(diffs)} record(s) outside the {enrolment.node_class} policy")
        elif not reasons:
            reasons.append("the quote holds no records")
    doc = {
        "node": node,
        "node_class": enrolment.node_class if enrolment else None,
        "status": "pass" if authenticated and not reasons else "fail",
        "authenticated": authenticated,
        "nonce": nonce,
        "quote_pcr": quote.get("pcr"),
        "quote_time": quote.get("time"),
        "time": now,
        "tpm": tpm_state,
        "reasons": reasons,
        "differences": differences,
        # the digests the Prolog re-checks against before each job (attest_gate.recheck): signed here, so
        # a re-check compares with what this verdict passed, not with anything the node says later
        "digests": {r.name: r.digest for r in records} if authenticated and not reasons else {},
        "node_key_id": enrolment.key_id if enrolment else None,
    }
    co_resident = quote.get("co_resident")
    if authenticated and isinstance(co_resident, list) and co_resident:
        # a shared node: these jobs' tenants were still here, their records left out (signed by the node)
        doc["co_resident"] = [str(c) for c in co_resident[:1024]]
    signed = vd.sign(doc, key)
    if authenticated:
        store.save_verdict(signed)
    return signed


class AttestService:
    """Nonce issuance, quote verification and the gate answer over one store, policy and key.

    Thread-safe: the listener's request threads, the API's and the daemon's tick share one instance (and
    its one SQLite connection), so every public call holds one lock.
    """

    def __init__(
        self,
        store: AttestStore,
        policy: Policy,
        key: Ed25519PrivateKey,
        nonce_ttl_s: float = NONCE_TTL_S,
        tpm_check: TpmCheck = _tpm_check_default,
    ) -> None:
        self.store = store
        self.policy = policy
        self.key = key
        self.nonce_ttl_s = nonce_ttl_s
        self.tpm_check = tpm_check
        self.lock = threading.RLock()

    def issue_nonce(self, node: str, now: float, request: str | None = None) -> dict[str, Any]:
        """``request``: the asking request's own id; the same id again answers the same nonce, adding no
        row (``AttestStore.issue_nonce``)."""
        with self.lock:
            nonce, expires = self.store.issue_nonce(node, now, self.nonce_ttl_s, request=request)
        return {"node": node, "nonce": nonce, "expires_at": expires}

    def attest(self, node: str, quote: Mapping[str, Any], now: float) -> dict[str, Any]:
        with self.lock:
            return attest_node(
                node, quote, now, store=self.store, policy=self.policy, key=self.key, tpm_check=self.tpm_check
            )

    # ------------------------------------------------------------------ listener bodies
    def handle_nonce(
        self, secret: bytes, headers: Mapping[str, str], body: bytes, now: float
    ) -> tuple[int, dict[str, Any]]:
        """``POST /v1/attest/nonce`` (HMAC-signed like event pushes): (HTTP status, JSON doc). The body
        ``{"node", "request_id"?, ...}``: a request replayed (inside the signature's skew window) or
        retried with its ``request_id`` gets the same nonce back and adds no row (``AttestStore``)."""
        from node_agent.protocol import SignatureError, verify_signed

        try:
            node = verify_signed(secret, headers, body, now)
            doc = json.loads(body)
        except SignatureError as exc:
            return 401, {"error": str(exc)}
        except ValueError:
            return 400, {"error": "body is not JSON"}
        if not isinstance(doc, dict) or doc.get("node") != node:
            return 400, {"error": 'body must be {"node": <the signing node>}'}
        request_id = doc.get("request_id")
        well_formed = isinstance(request_id, str) and REQUEST_ID_RE.fullmatch(request_id) is not None
        if request_id is not None and not well_formed:
            return 400, {"error": "request_id must be 1-64 characters of [A-Za-z0-9._-]"}
        with self.lock:
            enrolled = self.store.enrolment(node) is not None
        if not enrolled:
            return 403, {"error": f"node {node!r} is not enrolled"}
        return 200, self.issue_nonce(node, now, request=request_id)

    def handle_quote(self, body: bytes, now: float) -> tuple[int, dict[str, Any]]:
        """``POST /v1/attest/quote``: body = the quote; answer = the signed verdict (also on fail)."""
        if len(body) > MAX_QUOTE_BYTES:
            return 413, {"error": "quote too large"}
        try:
            quote = json.loads(body)
        except ValueError:
            return 400, {"error": "body is not JSON"}
        if not isinstance(quote, dict) or not isinstance(quote.get("node"), str):
            return 400, {"error": "a quote is a JSON object naming its node"}
        return 200, self.attest(quote["node"], quote, now)

    def route(
        self, path: str, headers: Mapping[str, str], body: bytes, now: float, secret: bytes
    ) -> tuple[int, dict[str, Any]] | None:
        """The listener's one-line hook: the answer for an attest ``POST`` path, None for other paths."""
        if path == NONCE_PATH:
            return self.handle_nonce(secret, headers, body, now)
        if path == QUOTE_PATH:
            return self.handle_quote(body, now)
        return None

    def quarantine_candidates(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(node, drain reason, verdict) for every node whose latest authenticated verdict failed.

        The daemon turns each into a quarantine finding (reason e.g. ``fleetyield: attestation failed
        (/etc/ld.so.preload, kernel/modules)``); a later passing verdict drops the node from this list.
        """
        with self.lock:
            latest = self.store.latest_verdicts()
        return [(doc["node"], vd.drain_reason(doc), doc) for doc in latest if doc.get("status") != "pass"]

    def gate(self, node: str, now: float, max_age_s: float) -> tuple[bool, str]:
        """The controller-side gate on the latest authenticated verdict (for ``/v1/nodes/{node}/gate``)."""
        with self.lock:
            doc = self.store.latest_verdict(node)
        if doc is None:
            return False, "fleetyield: no attestation verdict"
        if now - float(doc["time"]) > max_age_s:
            return False, f"fleetyield: attestation verdict stale ({now - float(doc['time']):.0f}s old)"
        if doc.get("status") != "pass":
            return False, vd.drain_reason(doc)
        return True, "attested"


def decode_pubkey_line(line: str) -> tuple[str, str]:
    """(base64 key, key_id) from a ``fleetyield-ed25519 <base64> <name>`` line (validated)."""
    from slurm_fleetyield.gate.keys import parse_public_line

    key = parse_public_line(line.strip())
    try:
        return base64.b64encode(key.raw).decode("ascii"), key.key_id
    except binascii.Error as exc:  # pragma: no cover - parse_public_line already validated
        raise ValueError(str(exc)) from None
