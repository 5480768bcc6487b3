"""The read-only HTTP API: fleet status, per-node decisions and explanations, the Prolog gate, /metrics.

Input: a ``ReadModel`` (the last rendered tick result and the event log, normally from the store) and a
``CollectorRegistry``. Output: JSON over a bounded server (``node_agent.httpd``; TLS and basic auth from a
web-config file), on its own listener (never the push port):

    GET /healthz                   200 while ticks are fresh, 503 when none yet or the last one is stale
    GET /v1/status                 tick, time, summary, plan, apply failures, inbox counts
    GET /v1/nodes                  one row per node (node, tier, health, risk, features, weight, state, ...)
    GET /v1/nodes/{node}           that node's full rendered decision
    GET /v1/nodes/{node}/explain   {"node", "text", "explain"}
    GET /v1/nodes/{node}/gate      {"allow": bool, "reason": str}: deny only quarantined/retired-by-us,
                                   and with [attest] on a node without a fresh passing verdict
    GET /v1/events?limit=&node=    the event log, newest first
    GET /v1/proposals?recent_s=    drain proposals: pending ones and those settled in the last recent_s
                                   (default a day), each with evidence, affected jobs, expiry, status
    GET /v1/proposals/{id}         one proposal (what ``fleetyield approve`` signs)
    GET /v1/ledger?by=&since=      goodput ledger aggregated by class|node|tier|day|cause|all (GPU-hours)
    GET /v1/calibration            reliability bins, Brier score, learned multipliers of the last tick
    GET /v1/fleet                  the floor: every node with its GPUs, compact (what the page polls)
    GET /v1/openapi.json           the OpenAPI 3.0 document of these routes (slurm_fleetyield/openapi.py)
    GET /metrics                   fleetyield_* metrics (text exposition)
    GET /, /static/{name}          the mission-control page (slurm_fleetyield/web), read-only

Any other method is 405: nothing here changes anything.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from node_agent.httpd import Limits
from slurm_fleetyield.adapters.listener import BackgroundServer, send
from slurm_fleetyield.adapters.proposals import ProposalsUnavailable, read_proposals
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.adapters.views import aggregate_ledger, gate, node_entry, node_rows
from slurm_fleetyield.core.explain import explain_text
from slurm_fleetyield.openapi import document as openapi_document
from slurm_fleetyield.web import CONTENT_SECURITY_POLICY, asset, fleet_floor

log = logging.getLogger(__name__)
MAX_EVENTS = 10_000
GZIP_MIN_BYTES = 64 << 10
"""Larger answers are gzipped for clients that accept it (the 1,000-node floor: ~600 KiB -> ~60 KiB)."""


class ReadModel(Protocol):
    def result(self) -> Mapping[str, Any] | None: ...

    # optional: ``explanation(node) -> (explain_dict document, text) | None`` for a view whose node rows
    # carry no explanation (the store's); without it a row's inline ``explain`` is served

    def events(self, limit: int, node: str | None = None) -> list[dict[str, Any]]: ...

    def status(self) -> dict[str, Any]: ...


class GateReadModel(Protocol):
    def proposals(self, recent_s: float, proposal_id: str | None = None) -> list[dict[str, Any]]: ...

    def ledger(self, by: str, since: float | None) -> dict[str, Any]: ...


class StoreReadModel:
    """Reads the store; the parsed last view (rows, no explanations) is cached per tick.

    ``explain(node) -> (tick, explain_dict document, text) | None``: the daemon's explanation from its live
    tick result, used when its tick is the store's (exact and current); otherwise, and without it (the CLI
    with the daemon down), the explanation the store keeps for the node (rendered when the node last
    changed, ``views.ViewRenderer``).
    """

    def __init__(
        self,
        store: Store,
        live: Callable[[], dict[str, Any]] | None = None,
        *,
        gate_dir: str | None = None,
        gate_url: str | None = None,
        clock: Callable[[], float] = time.time,
        explain: Callable[[str], tuple[int, dict[str, Any], str] | None] | None = None,
    ) -> None:
        self._store = store
        self._live = live
        self._explain = explain
        self._gate_dir = gate_dir
        self._gate_url = gate_url
        self._clock = clock
        self._cached: tuple[int, Mapping[str, Any]] | None = None
        self._lock = threading.Lock()

    def result(self) -> Mapping[str, Any] | None:
        tick = self._store.last_result_tick()
        if tick is None:
            return None
        with self._lock:
            if self._cached is None or self._cached[0] != tick:
                view = self._store.last_view()
                if view is None:
                    return None
                self._cached = (view.get("tick", tick), view)
            return self._cached[1]

    def explanation(self, node: str) -> tuple[dict[str, Any], str] | None:
        view = self.result()
        if view is None:
            return None
        if self._explain is not None:
            live = self._explain(node)
            if live is not None and live[0] == view.get("tick"):
                return live[1], live[2]
        entry = (view.get("nodes") or {}).get(node)
        if entry is not None and "explain" in entry:  # a view from before schema 3: inline
            return entry["explain"], entry["explain_text"]
        stored = self._store.node_explanation(node)
        return None if stored is None else (stored[1], explain_text(stored[1]))

    def events(self, limit: int, node: str | None = None) -> list[dict[str, Any]]:
        return self._store.events(limit=limit, node=node)

    def proposals(self, recent_s: float, proposal_id: str | None = None) -> list[dict[str, Any]]:
        if self._gate_dir is None:
            raise ProposalsUnavailable("no gate configured")
        if proposal_id is not None:
            return read_proposals(self._gate_dir, proposal_id=proposal_id, url=self._gate_url)
        return read_proposals(self._gate_dir, settled_since=self._clock() - recent_s, url=self._gate_url)

    def ledger(self, by: str, since: float | None) -> dict[str, Any]:
        rows = self._store.ledger(since=since)
        return {"by": by, "since": since, "groups": aggregate_ledger(rows, by)}

    def status(self) -> dict[str, Any]:
        view = self.result()
        doc: dict[str, Any] = {
            "inbox": self._store.inbox_counts(),
            "outcomes": self._store.outcome_counts(),
            "leader": self._store.leader_status(self._clock()),
        }
        if view is not None:
            doc.update(
                {k: view[k] for k in ("tick", "time", "duration_s", "dry_run", "summary", "plan", "apply")}
            )
            doc["stake"] = view.get("stake") or {"breaker": []}  # a view stored before it: none shown
        if self._live is not None:
            doc["live"] = self._live()
        return doc


class ApiServer(BackgroundServer):
    def __init__(
        self,
        host: str,
        port: int,
        model: ReadModel,
        registry: CollectorRegistry | None = None,
        *,
        stale_after_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        attest_gate: Callable[[str, float], tuple[bool, str]] | None = None,
        max_connections: int = 1024,
        web: Any = None,
        on_unauthenticated: Callable[[str, str], None] | None = None,
    ) -> None:
        self.model = model
        self.attest_gate = attest_gate  # AttestService.gate with [attest] max_age_s, when attest is on
        self.registry = registry
        self.stale_after_s = stale_after_s
        self.clock = clock
        # GET only: a request body is never needed, 64 KiB is plenty for a stray one
        limits = Limits(max_connections=max_connections, max_body_bytes=64 << 10)
        super().__init__(host, port, _handler_for(self), "fy-api", limits, web)
        if on_unauthenticated is not None:
            self.httpd.on_unauthorized = lambda: on_unauthenticated("api", "basic_auth")

    def route(self, path: str, query: Mapping[str, list[str]]) -> tuple[int, Any]:
        """(status, JSON document) for a GET; pure of HTTP so tests can call it directly."""
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/") if p]
        if parts == ["healthz"]:
            return self._health()
        if parts[:1] != ["v1"]:
            return 404, {"error": f"no such path {path!r}"}
        parts = parts[1:]
        if parts == ["status"]:
            return 200, self.model.status()
        if parts == ["nodes"]:
            return 200, node_rows(self.model.result())
        if parts == ["fleet"]:
            return 200, fleet_floor(self.model.result())
        if parts == ["openapi.json"]:
            return 200, openapi_document()
        if parts == ["calibration"]:
            view = self.model.result() or {}
            return 200, {"tick": view.get("tick"), **(view.get("calibration") or {})}
        if parts[:1] == ["proposals"] and len(parts) <= 2:
            gate_model = self.model if hasattr(self.model, "proposals") else None
            if gate_model is None:
                return 404, {"error": "no gate"}
            try:
                recent_s = float(query.get("recent_s", ["86400"])[0])
                found = gate_model.proposals(recent_s, parts[1] if len(parts) == 2 else None)  # type: ignore[attr-defined]
            except ValueError:
                return 400, {"error": f"recent_s must be a number, got {query['recent_s'][0]!r}"}
            except ProposalsUnavailable as exc:
                return 503, {"error": str(exc)}
            if len(parts) == 2:
                return (200, found[0]) if found else (404, {"error": f"no proposal {parts[1]!r}"})
            return 200, {
                "pending": [p for p in found if p["status"] == "pending"],
                "recent": [p for p in found if p["status"] != "pending"],
            }
        if parts == ["ledger"]:
            if not hasattr(self.model, "ledger"):
                return 404, {"error": "no ledger"}
            try:
                since = float(query["since"][0]) if "since" in query else None
                return 200, self.model.ledger(query.get("by", ["all"])[0], since)  # type: ignore[attr-defined]
            except ValueError as exc:
                return 400, {"error": str(exc)}
        if parts == ["events"]:
            try:
                limit = int(query.get("limit", ["100"])[0])
            except ValueError:
                return 400, {"error": f"limit must be an integer, got {query['limit'][0]!r}"}
            if not 1 <= limit <= MAX_EVENTS:
                return 400, {"error": f"limit must be within 1..{MAX_EVENTS}, got {limit}"}
            return 200, self.model.events(limit, query.get("node", [None])[0])
        if len(parts) in (2, 3) and parts[0] == "nodes":
            view = self.model.result()
            node = parts[1]
            if len(parts) == 3 and parts[2] == "gate":
                doc = gate(view, node)
                if doc["allow"] and self.attest_gate is not None:
                    attested, reason = self.attest_gate(node, self.clock())
                    if not attested:  # missing, stale or failed verdict
                        doc = {"allow": False, "reason": reason}
                return 200, doc
            entry = (view or {}).get("nodes", {}).get(node)
            if entry is None:
                return 404, {"error": f"node {node!r} is not in the last tick's result"}
            if "explain" not in entry and hasattr(self.model, "explanation"):
                found = self.model.explanation(node)
                if found is None:  # only right after a restart or a fleet-wide change, and never live
                    return 503, {"error": f"node {node!r}: explanation not rendered yet, retry in a tick"}
                entry = node_entry(entry, *found)
            if len(parts) == 2:
                return 200, entry
            if parts[2] == "explain":
                return 200, {"node": node, "text": entry["explain_text"], "explain": entry["explain"]}
        return 404, {"error": f"no such path {path!r}"}

    def _health(self) -> tuple[int, Any]:
        view = self.model.result()
        if view is None:
            return 503, {"ok": False, "reason": "no tick committed yet"}
        age = self.clock() - view["time"]
        ok = age <= self.stale_after_s
        return (200 if ok else 503), {"ok": ok, "tick": view["tick"], "last_tick_age_s": round(age, 3)}


def _handler_for(server: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "fleetyield-api"
        disable_nagle_algorithm = True  # see listener.send: two writes per reply on keep-alive connections

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            gzipped = len(body) > GZIP_MIN_BYTES and "gzip" in self.headers.get("Accept-Encoding", "")
            headers = [("Content-Type", content_type)]
            if gzipped:
                body = gzip.compress(body, compresslevel=5)
                headers += [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
            headers.append(("X-Content-Type-Options", "nosniff"))
            if content_type.startswith("text/html"):
                headers += [
                    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
                    ("Referrer-Policy", "no-referrer"),
                ]
            send(self, status, body, headers)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path == "/metrics":
                if server.registry is None:
                    self._send(404, b"no metrics\n", "text/plain")
                else:
                    self._send(200, generate_latest(server.registry), CONTENT_TYPE_LATEST)
                return
            if url.path == "/" or url.path.startswith("/static/"):
                found = asset(url.path)
                if found is None:
                    self._send(404, b"no such file\n", "text/plain; charset=utf-8")
                else:
                    self._send(200, *found)
                return
            try:
                # blank values are kept: `?since=` is a 400 (not a number), not silently no filter
                status, doc = server.route(url.path, urllib.parse.parse_qs(url.query, keep_blank_values=True))
            except Exception as exc:  # e.g. the store is locked or gone: report, do not kill the thread
                log.exception("api error on %s", self.path)
                status, doc = 500, {"error": str(exc)}
            # the floor is polled and large at fleet scale: compact; everything else is indented for people
            compact = url.path.rstrip("/") == "/v1/fleet"
            body = json.dumps(doc, indent=None if compact else 1, separators=(",", ":") if compact else None)
            self._send(status, body.encode() + b"\n", "application/json")

        def _not_allowed(self) -> None:
            send(self, 405, b"", [("Allow", "GET")], close=True)

        do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

        def __getattr__(self, name: str) -> Any:
            """Every other method (HEAD, OPTIONS, TRACE, QUERY, ...) is 405 too, not the stdlib's 501."""
            if name.startswith("do_"):
                return self._not_allowed
            raise AttributeError(name)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("api: " + format, *args)

    return Handler
