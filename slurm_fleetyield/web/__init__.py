"""The mission-control page: packaged static assets, and the compact fleet floor the page polls.

Input: a request path (``/`` or ``/static/<name>``), or the rendered last tick (``views.render_result``).
Output: ``asset(path) -> (bytes, content type) | None`` for the API listener to serve, and
``fleet_floor(view)`` -> the ``/v1/fleet`` document: every node with its GPUs in a few fields each, so a
browser can redraw a 1,000-node / 8,000-GPU floor from one small request per poll (``/v1/nodes/{node}``
carries the full decision and explanation; the floor carries only what the page colours and shows on hover).

No build step: the page is plain HTML, CSS and one JavaScript file, loaded from this package and nothing
else (no CDN: controllers often have no outbound network). Only files named in ``ASSETS`` are served, so a
request path can never reach the filesystem.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from typing import Any

ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
"""Every file the page may load, with its content type; anything else under /static/ is a 404."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Sent with the page: only this listener's own script, styles and JSON; no inline script, no framing."""

REASON_MAX = 300
"""Hover text keeps the first characters of a reason; the node's page (/v1/nodes/{node}) has all of it."""


def asset(path: str) -> tuple[bytes, str] | None:
    """The packaged file for ``/`` or ``/static/<name>``, with its content type; None for anything else."""
    name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
    if name not in ASSETS or (path not in ("/", "/index.html") and not path.startswith("/static/")):
        return None
    data = resources.files(__package__).joinpath("static", name).read_bytes()
    return data, ASSETS[name]


def _risk(p: Any) -> float | None:
    """Three significant digits (the page colours on a log scale); NaN or missing is unknown (null)."""
    return float(f"{p:.3g}") if isinstance(p, int | float) and p == p else None


def _gpu(g: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "index": g.get("index"),
        "health": g.get("health", "unknown"),
        "risk": _risk(g.get("probability")),
        "xids": list(g.get("fatal_xids") or []),
    }


def fleet_floor(view: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``/v1/fleet`` document: tick, time, summary and one compact row per node (GPUs included)."""
    if not view:
        return {"tick": None, "time": None, "dry_run": None, "summary": {}, "nodes": []}
    stages = view.get("lifecycle") or {}
    floor = view.get("floor") or {}  # the store's view: proposal and compact GPUs per node
    nodes = []
    for name, n in view.get("nodes", {}).items():
        explain = floor.get(name) or n.get("explain") or {}
        nodes.append(
            {
                "node": name,
                "tier": n.get("tier"),
                "health": n.get("health"),
                "risk": _risk(n.get("risk")),
                "stage": stages.get(name, "in_service"),
                "slurm_state": n.get("slurm_state"),
                "managed": n.get("managed"),
                "reason": (n.get("reason") or "")[:REASON_MAX],
                "scrape_error": n.get("scrape_error"),
                "proposal": (explain.get("proposal") or {}).get("id"),
                "gpus": [_gpu(g) for g in explain.get("gpus") or []],
            }
        )
    return {
        "tick": view.get("tick"),
        "time": view.get("time"),
        "dry_run": view.get("dry_run"),
        "summary": view.get("summary") or {},
        "nodes": nodes,
    }
