"""The authenticated push listener: agents POST fatal events and job outcomes, admins POST approvals.

Paths: ``POST /v1/agent/events`` (fatal events, HMAC-signed by the agent), ``POST /v1/agent/outcomes`` (the
Epilog's job-outcome records the agent forwards, same signature), ``POST /v1/approvals`` (an admin's
signed approve/deny envelope: self-authenticating with Ed25519, so no HMAC; ``Gatekeeper.submit`` checks it
against the authorized-keys file, re-read at every request so a revoked key stops working at once).

Input: signed HTTP requests (``node_agent.protocol``: HMAC-SHA256 over timestamp and body, shared secret).
Output: fatal events written durably to the store's inbox BEFORE the reply, then the daemon is woken so a
fatal XID drains its node within about a second instead of waiting for the next scrape.

Replies: 202 accepted (with counts of fatal events; a repeated event_id, fatal or not, is accepted again as a
duplicate and written nowhere, so agent retries are safe and a replayed request adds no row), 400 malformed
(the signature is good but the body is not a valid batch), 401 unauthenticated (missing/stale/bad signature),
404/405 elsewhere, 411 without Content-Length, 413 too large. A rejected request changes nothing. Non-fatal
events are acknowledged and logged, not queued: the inbox feeds drains; an XID the controller's
``quarantine_xids`` names is queued even when
the agent's catalog calls it non-fatal, and repeats of one GPU's XID within a push are one row
(``fatal_events``).
Outcomes: 202 only once every record is durable in the store (idempotent per record: a resent file is a
duplicate), so the agent deletes its spool file only when nothing can be lost.

Attestation (when the daemon built an ``AttestService``, ``[attest] enabled``): ``POST /v1/attest/nonce``
(HMAC-signed by the agent like its pushes) -> a single-use nonce, and ``POST /v1/attest/quote`` (the quote,
self-authenticating with the node's enrolled key) -> the controller-signed verdict. The bodies are the
service's (``slurm_fleetyield/attest/verify.py``: ``AttestService.route``); this listener only frames them,
and wakes the daemon on an authenticated failed verdict (it drains the node at once, as for a fatal event).

Approvals: 200 ``{"proposal_id", "status", "admin", "audit_seq"}`` when the decision took effect; otherwise
the gate's rejection code in ``{"error": <code>, "message": ...}`` with 400 (malformed, bad_lifetime), 403
(unknown_key, bad_signature), 404 (unknown_proposal), 409 (wrong_proposal, wrong_node, replayed,
already_settled, proposal_expired, expired, issued_in_future); 503 when the gate is not configured or its
audit log refuses to append. Every refusal of an authentic envelope is itself in the audit log
(``Gatekeeper.submit``).

Unauthenticated requests (an approval that is malformed, of an unknown key or badly signed; a push without a
valid HMAC; a webhook without the token) write nothing durable and take no lock: they are refused before the
gate or the store is opened, and counted through ``on_unauthenticated``
(``fleetyield_unauthenticated_requests_total{endpoint, reason}``), so a flood of them costs no disk and
cannot push real history out of the logs.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol, TypeVar

from node_agent.httpd import Limits
from node_agent.protocol import (
    EVENTS_PATH,
    NODE_HEADER,
    OUTCOMES_PATH,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    AgentEvent,
    SignatureError,
    sign,
    verify,
    verify_outcomes,
)
from slurm_fleetyield.adapters.alertmanager import WEBHOOK_PATH, AlertmanagerWebhook
from slurm_fleetyield.adapters.listener import BackgroundServer, RequestRefused, read_body, send
from slurm_fleetyield.adapters.store import LogRow, Store
from slurm_fleetyield.core.model import FatalEvent

log = logging.getLogger(__name__)
_Batch = TypeVar("_Batch")
APPROVALS_PATH = "/v1/approvals"
ATTEST_PREFIX = "/v1/attest/"
SETTLE_TIMEOUT_S = 1.0
"""How long a failed verdict's answer waits for the tick that drains the node (the Epilog that asked is
waiting for it; under the agent's 1.5 s request timeout). Past it the answer goes anyway and the Prolog's
own verdict check is what keeps the next tenant off the node."""
ATTEST_MAX_BODY_BYTES = 4 << 20
"""A quote carries every record's value (persistence manifests); = attest.verify.MAX_QUOTE_BYTES."""


class AttestRoute(Protocol):
    """``slurm_fleetyield.attest.verify.AttestService`` as the listener sees it (injected by the daemon, so
    this module imports neither the attestation code nor cryptography)."""

    def route(
        self, path: str, headers: Mapping[str, str], body: bytes, now: float, secret: bytes
    ) -> tuple[int, dict[str, Any]] | None: ...


_REJECT_STATUS = {
    "malformed": 400,
    "bad_lifetime": 400,
    "unknown_key": 403,
    "bad_signature": 403,
    "unknown_proposal": 404,
}


FOLD_WINDOW_S = 300.0
"""Repeats of one GPU's XID within this many seconds of the first are one event (dcgm-exporter's XID count
window; the agent folds with the same window)."""


def fatal_events(
    events: Sequence[AgentEvent],
    drain_xids: frozenset[int] = frozenset(),
    fold_window_s: float = FOLD_WINDOW_S,
) -> list[FatalEvent]:
    """The events of a batch the inbox keeps: those the agent calls fatal, and XIDs the controller drains for
    (``drain_xids``: its config may drain an XID the agent's catalog default does not). Repeats of one
    (GPU, XID) within ``fold_window_s`` of the first are that event, its message saying how many (an XID
    storm is one row, not thousands; the agent folds too, across pushes)."""
    kept: list[tuple[AgentEvent, int]] = []
    open_: dict[tuple[str, int | None, int | None], int] = {}  # (node, gpu, xid) -> index in kept
    for e in sorted(events, key=lambda e: e.time):
        if not (e.fatal or (e.kind == "xid" and e.xid in drain_xids)):
            continue
        key = (e.node, e.gpu, e.xid)
        i = open_.get(key) if e.kind == "xid" else None
        if i is not None and e.time - kept[i][0].time <= fold_window_s:
            kept[i] = (kept[i][0], kept[i][1] + 1)
            continue
        if e.kind == "xid":
            open_[key] = len(kept)
        kept.append((e, 1))
    out = []
    for first, n in kept:
        ev = to_fatal_event(first)
        out.append(ev if n == 1 else replace(ev, message=f"{ev.message} (x{n} within {fold_window_s:g}s)"))
    return out


def _event_data(event: AgentEvent) -> dict[str, Any]:
    return {"event_id": event.event_id, "xid": event.xid}


def to_fatal_event(event: AgentEvent) -> FatalEvent:
    return FatalEvent(
        event_id=event.event_id,
        node=event.node,
        time=event.time,
        kind=event.kind,
        gpu=event.gpu,
        uuid=event.uuid,
        xid=event.xid,
        message=event.message,
        source="agent-push",
    )


class IngestServer(BackgroundServer):
    """The push listener on a bounded server (``node_agent.httpd``) in a background thread. ``port=0``
    binds any free port (see ``.port``); ``web``: TLS and basic auth (``node_agent.webconfig``)."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes | None,
        store: Store,
        wake: threading.Event,
        *,
        max_body_bytes: int = 1 << 20,
        max_skew_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        on_accept: Callable[[int], None] | None = None,
        gate_dir: str | None = None,
        gate_url: str | None = None,
        authorized_keys: str | None = None,
        alertmanager: AlertmanagerWebhook | None = None,
        attest: AttestRoute | None = None,
        settle: Callable[[float, float], bool] | None = None,
        drain_xids: frozenset[int] = frozenset(),
        on_unauthenticated: Callable[[str, str], None] | None = None,
        max_connections: int = 1024,
        web: Any = None,
    ) -> None:
        self.drain_xids = (
            drain_xids  # the controller's quarantine_xids: kept even when the agent says non-fatal
        )
        self.on_unauthenticated = on_unauthenticated  # (endpoint, reason): ControllerStats.unauthenticated
        self.attest = attest
        self.settle = settle  # Daemon.wait_tick_after: a failed verdict is answered once its drain is applied
        self.secret = secret  # None: no agent push here (the listener serves Alertmanager's webhook only)
        self.alertmanager = alertmanager
        self.gate_dir = gate_dir
        self.gate_url = gate_url  # PostgreSQL: the gate's database (gate_dir keeps this host's audit.head)
        self.authorized_keys = authorized_keys
        self.on_accept = on_accept
        self.store = store
        self.wake = wake
        self.max_body_bytes = max_body_bytes
        self.max_skew_s = max_skew_s
        self.clock = clock
        self.accepted = 0
        self.rejected = 0
        largest = max(max_body_bytes, ATTEST_MAX_BODY_BYTES if attest is not None else 0)
        if alertmanager is not None:
            largest = max(largest, alertmanager.max_body_bytes)
        limits = Limits(max_connections=max_connections, max_body_bytes=largest)
        super().__init__(host, port, _handler_for(self), "fy-ingest", limits, web)
        self.httpd.on_unauthorized = lambda: self.unauthenticated("listener", "basic_auth")

    # -- the request ----------------------------------------------------------------------------------

    def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        """Verify, store, wake. Pure of HTTP so tests can call it directly too."""
        now = self.clock()
        batch, refused = self._verified(verify, headers, body, now)
        if batch is None:
            return refused
        fatal = fatal_events(batch.events, self.drain_xids)
        new, dup = self.store.put_events(fatal, received_at=now) if fatal else (0, 0)
        others = [e for e in batch.events if not (e.fatal or (e.kind == "xid" and e.xid in self.drain_xids))]
        if others:
            # event_id is the agent's nonce (node_agent/protocol.py): a replayed or retried event logs once
            self.store.log_agent_events(
                [
                    (e.event_id, LogRow(now, f"agent_{e.kind}", e.node, e.message, _event_data(e)))
                    for e in others
                ],
                received_at=now,
            )
        self._accepted(new)
        return 202, {"accepted": new, "duplicates": dup, "ignored_nonfatal": len(others)}

    def handle_outcomes(self, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        """Verify, store every record durably, then answer: the agent deletes its files on 2xx only."""
        now = self.clock()
        batch, refused = self._verified(verify_outcomes, headers, body, now)
        if batch is None:
            return refused
        new, dup = (
            self.store.put_outcomes(batch.node, batch.records, received_at=now) if batch.records else (0, 0)
        )
        if new:
            log.info("outcomes stored", extra={"fy": {"node": batch.node, "new": new, "duplicates": dup}})
        return 202, {"accepted": new, "duplicates": dup}

    def unauthenticated(self, endpoint: str, reason: str) -> None:
        """A request failed authentication: counted, never stored."""
        if self.on_unauthenticated is not None:
            self.on_unauthenticated(endpoint, reason)

    def handle_approval(self, body: bytes) -> tuple[int, dict]:
        """Run ``Gatekeeper.submit`` on an envelope; the reply names the decision or the rejection code."""
        from slurm_fleetyield.gate import ApprovalRejected, GateError, Gatekeeper, load_authorized_keys
        from slurm_fleetyield.gate.approvals import authenticate, parse_envelope

        if not self.gate_dir or not self.authorized_keys:
            return 503, {"error": "gate_not_configured", "message": "gate.state_dir/authorized_keys unset"}
        now = self.clock()
        try:
            keys = load_authorized_keys(self.authorized_keys)
        except GateError as exc:
            log.error("authorized keys unusable: %s", exc)
            return 503, {"error": "authorized_keys_unusable", "message": str(exc)}
        try:
            # authenticity first, before the gate is opened (opening takes its write lock)
            authenticate(parse_envelope(body), keys)
            with Gatekeeper.open(self.gate_dir, url=self.gate_url) as gk:
                applied = gk.submit(body, keys, now)
        except ApprovalRejected as rej:
            if not rej.authenticated:
                self.unauthenticated("approvals", rej.reason.value)
            log.warning(
                "approval rejected",
                extra={"fy": {"reason": rej.reason.value, "message": rej.message[:300]}},
            )
            return _REJECT_STATUS.get(rej.reason.value, 409), {
                "error": rej.reason.value,
                "message": rej.message,
            }
        except GateError as exc:  # e.g. AuditIntegrityError: the gate fails closed
            log.error("gate refused to record a decision: %s", exc)
            return 503, {"error": "gate_error", "message": str(exc)}
        p = applied.proposal
        log.info(
            "proposal decided",
            extra={
                "fy": {
                    "proposal_id": p.id,
                    "node": p.node,
                    "status": p.status.value,
                    "admin": applied.decision.admin,
                    "audit_seq": applied.audit_seq,
                }
            },
        )
        self.wake.set()
        return 200, {
            "proposal_id": p.id,
            "node": p.node,
            "status": p.status.value,
            "admin": applied.decision.admin,
            "audit_seq": applied.audit_seq,
        }

    def handle_attest(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        """The attestation exchange: the service answers, or 404 for a path it does not know."""
        if self.attest is None or self.secret is None:
            return 404, {"error": "attestation is not enabled here ([attest] enabled, push.secret_file)"}
        answer = self.attest.route(path, headers, body, self.clock(), self.secret)
        if answer is None:
            return 404, {"error": f"no such path {path!r}"}
        status, doc = answer
        if status == 200 and "status" in doc:
            fields = {"node": doc.get("node"), "status": doc["status"], "reasons": doc.get("reasons")}
            log.info("attestation verdict", extra={"fy": fields})
            if doc["status"] != "pass" and doc.get("authenticated"):
                stored = self.clock()  # the verdict is stored: a tick starting from now on drains the node
                self.wake.set()  # drain now, not at the next scheduled tick: the next job may be starting
                if self.settle is not None and not self.settle(stored, SETTLE_TIMEOUT_S):
                    log.warning("attestation failure: drain not applied in time", extra={"fy": fields})
        return status, doc

    def handle_alertmanager(self, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        """Alertmanager's webhook (adapters/alertmanager.py decides): store the events, then wake."""
        assert self.alertmanager is not None
        now = self.clock()
        status, doc, events = self.alertmanager.handle(headers, body, now)
        if events:
            new, dup = self.store.put_events(list(events), received_at=now)
            doc = {**doc, "accepted": new, "duplicates": dup}
            self._accepted(new)
        return status, doc

    def _accepted(self, new: int) -> None:
        """``new`` fatal events are stored: wake the daemon (it drains within about a second)."""
        if new:
            self.wake.set()
            if self.on_accept is not None:
                self.on_accept(new)

    def _verified(
        self, check: Callable[..., _Batch], headers: dict[str, str], body: bytes, now: float
    ) -> tuple[_Batch, None] | tuple[None, tuple[int, dict]]:
        """``check`` (``verify``/``verify_outcomes``) the signed body: (batch, None), or (None, the refusal:
        400 when the signature is good but the body is not, 401 otherwise)."""
        try:
            return check(self.secret, headers, body, now, max_skew_s=self.max_skew_s), None
        except SignatureError as exc:
            status = 400 if self._signature_valid(headers, body) else 401
            if status == 401:
                endpoint = "outcomes" if check is verify_outcomes else "events"
                self.unauthenticated(endpoint, "bad_signature")
            return None, (status, {"error": str(exc)})

    def _signature_valid(self, headers: dict[str, str], body: bytes) -> bool:
        """Whether the HMAC itself checks out (then a verify() failure is about the body: 400, not 401)."""
        lowered = {k.lower(): v for k, v in headers.items()}
        ts = lowered.get(TIMESTAMP_HEADER.lower(), "")
        sig = lowered.get(SIGNATURE_HEADER.lower(), "")
        if not ts or not sig or not lowered.get(NODE_HEADER.lower()):
            return False
        try:
            if abs(self.clock() - int(ts)) > self.max_skew_s:
                return False
        except ValueError:
            return False
        return hmac.compare_digest(sign(self.secret, ts, body).encode(), sig.encode())


def _handler_for(server: IngestServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fleetyield-ingest"
        disable_nagle_algorithm = True  # see listener.send: two writes per reply on keep-alive connections

        def _reply(self, status: int, doc: dict) -> None:
            data = json.dumps(doc).encode()
            send(self, status, data, [("Content-Type", "application/json")], close=status >= 400)
            if status >= 400:
                server.rejected += 1
                log.warning(
                    "push rejected",
                    extra={"fy": {"status": status, "peer": self.client_address[0], **doc}},
                )

        def _answer(
            self,
            max_bytes: int,
            call: Callable[[dict[str, str], bytes], tuple[int, dict]],
            unavailable: str,
            failure: str,
        ) -> tuple[int, dict]:
            """Read the body (or refuse: 411/400/413), then ``call``; a failure in it is a 503
            ``{"error": "<unavailable>: <why>"}`` (the sender retries, so never a 2xx)."""
            try:
                body = read_body(self, max_bytes)
            except RequestRefused as refused:
                return refused.status, refused.doc
            try:
                return call(dict(self.headers.items()), body)
            except Exception as exc:
                log.exception(failure)
                return 503, {"error": f"{unavailable}: {exc}"}

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == WEBHOOK_PATH and server.alertmanager is not None:
                self._alertmanager(server.alertmanager)
                return
            if path.startswith(ATTEST_PREFIX):
                self._attest(path)
                return
            if path in (EVENTS_PATH, OUTCOMES_PATH) and server.secret is None:
                self._reply(404, {"error": "agent push is not enabled here (no push.secret_file)"})
                return
            if path not in (EVENTS_PATH, OUTCOMES_PATH, APPROVALS_PATH):
                self._reply(404, {"error": f"no such path {self.path!r}"})
                return

            def route(headers: dict[str, str], body: bytes) -> tuple[int, dict]:
                if path == APPROVALS_PATH:
                    return server.handle_approval(body)
                if path == OUTCOMES_PATH:
                    return server.handle_outcomes(headers, body)
                return server.handle(headers, body)

            # the store is down: the agent must retry, so no 2xx
            status, doc = self._answer(
                server.max_body_bytes, route, "cannot store", "push could not be stored"
            )
            if status == 202 and path == EVENTS_PATH:
                server.accepted += doc["accepted"]
            self._reply(status, doc)

        def _attest(self, path: str) -> None:
            if server.attest is None or server.secret is None:
                self._reply(404, {"error": "attestation is not enabled here ([attest] enabled)"})
                return
            # the attestation store failed: the agent retries, so no 2xx
            status, doc = self._answer(
                ATTEST_MAX_BODY_BYTES,
                lambda headers, body: server.handle_attest(path, headers, body),
                "attestation unavailable",
                "attestation request failed",
            )
            self._reply(status, doc)

        def _alertmanager(self, receiver: AlertmanagerWebhook) -> None:
            # The token first: an unauthenticated sender learns nothing else (not even the size limit).
            if not receiver.authorized(dict(self.headers.items())):
                server.unauthenticated("alertmanager", "bad_token")
                self._reply(401, {"error": "missing or wrong bearer token"})
                return
            # our store failed: Alertmanager retries 5xx, so never a 2xx here
            status, doc = self._answer(
                receiver.max_body_bytes,
                server.handle_alertmanager,
                "cannot store events",
                "alertmanager webhook could not be stored",
            )
            if status == 200:
                server.accepted += doc.get("accepted", 0)
            self._reply(status, doc)

        def _not_allowed(self) -> None:
            doc = {"error": "only POST /v1/agent/events, /v1/agent/outcomes, /v1/approvals, /v1/attest/*"}
            data = b"" if self.command == "HEAD" else json.dumps(doc).encode()
            send(self, 405, data, [("Allow", "POST"), ("Content-Type", "application/json")], close=True)
            server.rejected += 1

        do_GET = do_PUT = do_DELETE = do_PATCH = _not_allowed

        def __getattr__(self, name: str) -> Any:
            """Every other method (HEAD, OPTIONS, TRACE, ...) is 405 as on the API, not the stdlib's 501."""
            if name.startswith("do_"):
                return self._not_allowed
            raise AttributeError(name)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("ingest: " + format, *args)

    return Handler
