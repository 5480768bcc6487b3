"""The authenticated push listener: agents POST fatal events to ``/v1/agent/events``.

Input: signed HTTP requests (``node_agent.protocol``: HMAC-SHA256 over timestamp and body, shared secret).
Output: fatal events written durably to the store's inbox BEFORE the reply, then the daemon is woken so a
fatal XID drains its node within about a second instead of waiting for the next scrape.

Replies: 202 accepted (with counts; a repeated event_id is accepted again as a duplicate, so agent retries
are safe), 400 malformed (the signature is good but the body is not a valid batch), 401 unauthenticated
(missing/stale/bad signature), 404/405 elsewhere, 411 without Content-Length, 413 too large. A rejected
request changes nothing. Non-fatal events are acknowledged and logged, not queued: the inbox feeds drains.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from node_agent.protocol import (
    EVENTS_PATH,
    NODE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    AgentEvent,
    SignatureError,
    sign,
    verify,
)
from slurm_fleetyield.adapters.store import LogRow, Store
from slurm_fleetyield.core.model import FatalEvent

log = logging.getLogger(__name__)


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


class IngestServer:
    """A ThreadingHTTPServer in a background thread. ``port=0`` binds any free port (see ``.port``)."""

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes,
        store: Store,
        wake: threading.Event,
        *,
        max_body_bytes: int = 1 << 20,
        max_skew_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        on_accept: Callable[[int], None] | None = None,
    ) -> None:
        self.secret = secret
        self.on_accept = on_accept
        self.store = store
        self.wake = wake
        self.max_body_bytes = max_body_bytes
        self.max_skew_s = max_skew_s
        self.clock = clock
        self.accepted = 0
        self.rejected = 0
        self._httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.1,), name="fy-ingest", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread:
            self._thread.join(5)

    # -- the request ----------------------------------------------------------------------------------

    def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, dict]:
        """Verify, store, wake. Pure of HTTP so tests can call it directly too."""
        now = self.clock()
        try:
            batch = verify(self.secret, headers, body, now, max_skew_s=self.max_skew_s)
        except SignatureError as exc:
            status = 400 if self._signature_valid(headers, body) else 401
            return status, {"error": str(exc)}
        fatal = [to_fatal_event(e) for e in batch.events if e.fatal]
        new, dup = self.store.put_events(fatal, received_at=now) if fatal else (0, 0)
        others = [e for e in batch.events if not e.fatal]
        if others:
            self.store.append_log(
                [
                    LogRow(now, f"agent_{e.kind}", e.node, e.message, {"event_id": e.event_id, "xid": e.xid})
                    for e in others
                ]
            )
        if new:
            self.wake.set()
            if self.on_accept is not None:
                self.on_accept(new)
        return 202, {"accepted": new, "duplicates": dup, "ignored_nonfatal": len(others)}

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

        def _reply(self, status: int, doc: dict) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)
            if status >= 400:
                server.rejected += 1
                log.warning(
                    "push rejected",
                    extra={"fy": {"status": status, "peer": self.client_address[0], **doc}},
                )

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != EVENTS_PATH:
                self._reply(404, {"error": f"no such path {self.path!r}"})
                return
            length_header = self.headers.get("Content-Length")
            if length_header is None:
                self._reply(411, {"error": "Content-Length required"})
                return
            try:
                length = int(length_header)
            except ValueError:
                self._reply(400, {"error": f"bad Content-Length {length_header!r}"})
                return
            if length < 0 or length > server.max_body_bytes:
                self._reply(413, {"error": f"body of {length} bytes exceeds {server.max_body_bytes}"})
                return
            body = self.rfile.read(length)
            try:
                status, doc = server.handle(dict(self.headers.items()), body)
            except Exception as exc:  # the store is down: the agent must retry, so no 2xx
                log.exception("push could not be stored")
                status, doc = 503, {"error": f"cannot store events: {exc}"}
            if status == 202:
                server.accepted += doc["accepted"]
            self._reply(status, doc)

        def _not_allowed(self) -> None:
            self._reply(405, {"error": "only POST /v1/agent/events"})

        do_GET = do_PUT = do_DELETE = do_PATCH = _not_allowed

        def log_message(self, format: str, *args: object) -> None:
            log.debug("ingest: " + format, *args)

    return Handler
