"""The OpenAPI 3.0 document of the read-only API (``GET /v1/openapi.json``).

Input: nothing (the document is data, written beside ``adapters/api.py``'s route table). Output:
``document() -> dict``. Every public route is a GET; nothing here describes a state change, because the
listener has none (POST/PUT/DELETE/PATCH answer 405; approvals, agent pushes and the Alertmanager webhook
live on the authenticated push listener, which is not part of this document). ``tests/test_openapi.py``
checks that the paths here and the routes in ``api.py``'s docstring agree, that each answers as documented,
and fuzzes the live server against this document with schemathesis.

Schemas name the fields clients rely on (``required``) and allow more (``additionalProperties`` is left
open): the rendered decision grows as stages are added, and a new field must not break a client.
"""

from __future__ import annotations

import copy
from typing import Any

TIERS = ["green", "yellow", "red", "quarantined", "canary", "probation", "retired", "unknown"]
HEALTH = ["ok", "warn", "bad", "unknown"]
LEDGER_GROUPS = ["class", "node", "tier", "day", "cause", "all"]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "nullable": True}


NUM = {"type": "number"}
INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
OBJ = {"type": "object"}
STRS = {"type": "array", "items": STR}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": STR}},
    "Health": {
        "type": "object",
        "required": ["ok"],
        "properties": {"ok": BOOL, "tick": INT, "last_tick_age_s": NUM, "reason": STR},
    },
    "Counts": {
        "type": "object",
        "required": ["pending", "processed"],
        "properties": {"pending": INT, "processed": INT},
    },
    "Status": {
        "type": "object",
        "required": ["inbox", "outcomes"],
        "properties": {
            "inbox": _ref("Counts"),
            "outcomes": _ref("Counts"),
            "tick": INT,
            "time": NUM,
            "duration_s": NUM,
            "dry_run": BOOL,
            "summary": OBJ,
            "plan": {
                "type": "object",
                "properties": {
                    "actions": {"type": "array", "items": OBJ},
                    "holds": {"type": "array", "items": OBJ},
                },
            },
            "apply": OBJ,
            "live": OBJ,
            "leader": {
                "type": "object",
                "description": "Which controller leads: mode single (SQLite, one controller) or lease "
                "(PostgreSQL: the lease's holder, null when lapsed, its fencing token, seconds left).",
                "required": ["mode"],
                "properties": {"mode": {"type": "string", "enum": ["single", "lease"]}},
            },
        },
    },
    "NodeRow": {
        "type": "object",
        "required": ["node", "tier", "health", "risk", "features", "weight", "slurm_state", "reason"],
        "properties": {
            "node": STR,
            "tier": {"type": "string", "enum": TIERS},
            "health": {"type": "string", "enum": HEALTH},
            "risk": _nullable(NUM),
            "features": STRS,
            "weight": _nullable(INT),
            "slurm_state": _nullable(STR),
            "reason": _nullable(STR),
            "scrape_error": _nullable(STR),
        },
    },
    "Node": {
        "description": "The node's full rendered decision of the last tick.",
        "allOf": [
            _ref("NodeRow"),
            {
                "type": "object",
                "required": ["fy_features", "managed", "explain", "explain_text"],
                "properties": {
                    "fy_features": STRS,
                    "managed": BOOL,
                    "explain": _ref("Explanation"),
                    "explain_text": STR,
                    "stage": STR,
                },
            },
        ],
    },
    "Explanation": {
        "type": "object",
        "required": ["node", "gpus", "lifecycle"],
        "properties": {
            "node": STR,
            "tier": STR,
            "health": STR,
            "risk": _nullable(NUM),
            "reason": _nullable(STR),
            "evidence": STRS,
            "lifecycle": {"type": "object", "required": ["stage"], "properties": {"stage": STR}},
            "proposal": _nullable(OBJ),
            "gpus": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "health"],
                    "properties": {
                        "index": INT,
                        "uuid": _nullable(STR),
                        "model": _nullable(STR),
                        "health": STR,
                        "probability": _nullable(NUM),
                        "fatal_xids": {"type": "array", "items": INT},
                        "signals": {"type": "array", "items": OBJ},
                    },
                },
            },
        },
    },
    "Explain": {
        "type": "object",
        "required": ["node", "text", "explain"],
        "properties": {"node": STR, "text": STR, "explain": _ref("Explanation")},
    },
    "Gate": {"type": "object", "required": ["allow", "reason"], "properties": {"allow": BOOL, "reason": STR}},
    "Event": {
        "type": "object",
        "required": ["seq", "time", "kind", "node", "message"],
        "properties": {
            "seq": INT,
            "time": NUM,
            "tick": _nullable(INT),
            "node": _nullable(STR),
            "kind": STR,
            "message": _nullable(STR),
            "data": _nullable(OBJ),
        },
    },
    "Proposal": {
        "type": "object",
        "required": ["id", "node", "gpus", "risk", "evidence", "affected_jobs", "expires_at", "status"],
        "properties": {
            "id": {"type": "string", "pattern": "^p-[0-9a-f]{12}$"},
            "node": STR,
            "gpus": {"type": "array", "items": INT},
            "risk": NUM,
            "evidence": STR,
            "affected_jobs": {"type": "array", "items": {}},
            "created_at": NUM,
            "expires_at": NUM,
            "status": STR,
            "settled_at": _nullable(NUM),
            "settled_by": _nullable(STR),
        },
    },
    "Proposals": {
        "type": "object",
        "required": ["pending", "recent"],
        "properties": {
            "pending": {"type": "array", "items": _ref("Proposal")},
            "recent": {"type": "array", "items": _ref("Proposal")},
        },
    },
    "LedgerGroup": {
        "type": "object",
        "required": ["group", "jobs", "failures", "useful_gpu_h", "wasted_gpu_h", "net_goodput_gpu_h"],
        "properties": {
            "group": STR,
            "jobs": NUM,
            "failures": NUM,
            "useful_gpu_h": NUM,
            "wasted_gpu_h": NUM,
            "net_goodput_gpu_h": NUM,
            "premium_misuse_gpu_h": NUM,
        },
    },
    "Ledger": {
        "type": "object",
        "required": ["by", "groups"],
        "properties": {
            "by": {"type": "string", "enum": LEDGER_GROUPS},
            "since": _nullable(NUM),
            "groups": {"type": "array", "items": _ref("LedgerGroup")},
        },
    },
    "Calibration": {
        "type": "object",
        "required": ["tick"],
        "properties": {
            "tick": _nullable(INT),
            "bins": {"type": "array", "items": OBJ},
            "brier": _nullable(NUM),
            "resolved": INT,
            "multipliers": OBJ,
            "open_predictions": INT,
        },
    },
    "FleetGpu": {
        "type": "object",
        "required": ["index", "health", "risk", "xids"],
        "properties": {
            "index": _nullable(INT),
            "health": STR,
            "risk": _nullable(NUM),
            "xids": {"type": "array", "items": INT},
        },
    },
    "FleetNode": {
        "type": "object",
        "required": ["node", "tier", "health", "risk", "stage", "slurm_state", "reason", "gpus"],
        "properties": {
            "node": STR,
            "tier": {"type": "string", "enum": TIERS},
            "health": STR,
            "risk": _nullable(NUM),
            "stage": STR,
            "slurm_state": _nullable(STR),
            "managed": _nullable(BOOL),
            "reason": STR,
            "scrape_error": _nullable(STR),
            "proposal": _nullable(STR),
            "gpus": {"type": "array", "items": _ref("FleetGpu")},
        },
    },
    "Fleet": {
        "type": "object",
        "required": ["tick", "time", "dry_run", "summary", "nodes"],
        "properties": {
            "tick": _nullable(INT),
            "time": _nullable(NUM),
            "dry_run": _nullable(BOOL),
            "summary": OBJ,
            "nodes": {"type": "array", "items": _ref("FleetNode")},
        },
    },
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _text(media: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": STR}}}


NOT_FOUND = _json(_ref("Error"), "Not found.")
BAD_QUERY = _json(_ref("Error"), "A query parameter is invalid (the message names it).")
NODE_PARAM = {
    "name": "node",
    "in": "path",
    "required": True,
    "schema": STR,
    "description": "Slurm node name.",
}


def _get(op_id: str, summary: str, responses: dict[str, Any], parameters: list[Any] | None = None) -> dict:
    op: dict[str, Any] = {"operationId": op_id, "summary": summary, "responses": responses}
    if parameters:
        op["parameters"] = parameters
    return {"get": op}


PATHS: dict[str, Any] = {
    "/healthz": _get(
        "healthz",
        "200 while ticks are fresh; 503 before the first tick or when the last one is stale.",
        {"200": _json(_ref("Health"), "Fresh."), "503": _json(_ref("Health"), "No tick yet, or stale.")},
    ),
    "/v1/status": _get(
        "status",
        "Tick, time, summary, plan, apply failures, inbox counts, the loop's live state.",
        {"200": _json(_ref("Status"), "The controller's status.")},
    ),
    "/v1/nodes": _get(
        "nodes",
        "One compact row per node.",
        {"200": _json({"type": "array", "items": _ref("NodeRow")}, "Rows.")},
    ),
    "/v1/nodes/{node}": _get(
        "node",
        "The node's full rendered decision.",
        {"200": _json(_ref("Node"), "The decision."), "404": NOT_FOUND},
        [NODE_PARAM],
    ),
    "/v1/nodes/{node}/explain": _get(
        "explain",
        "Why the node is where it is: text and structure.",
        {"200": _json(_ref("Explain"), "The explanation."), "404": NOT_FOUND},
        [NODE_PARAM],
    ),
    "/v1/nodes/{node}/gate": _get(
        "gate",
        "The Prolog gate: deny only nodes FleetYield quarantined or retired; everything else is allowed.",
        {"200": _json(_ref("Gate"), "The verdict.")},
        [NODE_PARAM],
    ),
    "/v1/events": _get(
        "events",
        "The event log, newest first.",
        {"200": _json({"type": "array", "items": _ref("Event")}, "Events."), "400": BAD_QUERY},
        [
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 100},
            },
            {"name": "node", "in": "query", "schema": STR, "description": "Only this node's events."},
        ],
    ),
    "/v1/proposals": _get(
        "proposals",
        "Drain proposals: pending ones and those settled in the last recent_s seconds.",
        {
            "200": _json(_ref("Proposals"), "Proposals."),
            "400": BAD_QUERY,
            "404": _json(_ref("Error"), "No gate behind this listener."),
            "503": _json(_ref("Error"), "The gate database does not exist yet or cannot be read."),
        },
        [{"name": "recent_s", "in": "query", "schema": {"type": "number", "default": 86400}}],
    ),
    "/v1/proposals/{id}": _get(
        "proposal",
        "One proposal (what `fleetyield approve` signs).",
        {
            "200": _json(_ref("Proposal"), "The proposal."),
            "404": NOT_FOUND,
            "503": _json(_ref("Error"), "The gate database does not exist yet or cannot be read."),
        },
        [{"name": "id", "in": "path", "required": True, "schema": STR}],
    ),
    "/v1/ledger": _get(
        "ledger",
        "The goodput ledger in GPU-hours, aggregated by a dimension (days are UTC).",
        {
            "200": _json(_ref("Ledger"), "Groups."),
            "400": BAD_QUERY,
            "404": _json(_ref("Error"), "No ledger behind this listener."),
        },
        [
            {
                "name": "by",
                "in": "query",
                "schema": {"type": "string", "enum": LEDGER_GROUPS, "default": "all"},
            },
            {
                "name": "since",
                "in": "query",
                "schema": NUM,
                "description": "Jobs that ended at or after (epoch s).",
            },
        ],
    ),
    "/v1/calibration": _get(
        "calibration",
        "Reliability bins, Brier score and learned multipliers of the last tick.",
        {"200": _json(_ref("Calibration"), "Calibration.")},
    ),
    "/v1/fleet": _get(
        "fleet",
        "The floor: every node with its GPUs, compact (what the mission-control page polls).",
        {"200": _json(_ref("Fleet"), "The floor.")},
    ),
    "/v1/openapi.json": _get("openapi", "This document.", {"200": _json(OBJ, "The OpenAPI 3.0 document.")}),
    "/metrics": _get(
        "metrics",
        "The controller's fleetyield_* metrics (Prometheus text exposition).",
        {
            "200": _text("text/plain", "Metrics."),
            "404": _text("text/plain", "Metrics are not enabled on this listener."),
        },
    ),
    "/": _get("page", "The mission-control page.", {"200": _text("text/html", "The page.")}),
    "/static/{name}": _get(
        "static",
        "A file of the page (only the packaged ones: index.html, app.js, style.css, favicon.svg).",
        {
            "200": {
                "description": "The file.",
                "content": {
                    m: {"schema": STR} for m in ("text/html", "text/javascript", "text/css", "image/svg+xml")
                },
            },
            "404": _text("text/plain", "No such file."),
        },
        [{"name": "name", "in": "path", "required": True, "schema": STR}],
    ),
}


def document(version: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document (a fresh copy: callers may change it)."""
    if version is None:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as pkg_version

        try:
            version = pkg_version("fleetyield")
        except PackageNotFoundError:
            version = "0+unknown"
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "FleetYield controller: read-only API",
            "version": version,
            "description": "Everything the mission-control page shows, as JSON. Every route is a GET; any "
            "other method is 405. State changes (agent pushes, job outcomes, signed approvals, the "
            "Alertmanager webhook) live on the separate authenticated push listener.",
        },
        "paths": copy.deepcopy(PATHS),
        "components": {"schemas": copy.deepcopy(SCHEMAS)},
    }
