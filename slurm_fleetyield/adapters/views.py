"""The read model: a tick's result rendered as JSON for the store, the API and the CLI.

Input: a ``TickResult`` with its apply report and samples. Output: ``render_result`` -> a JSON-able dict
(persisted as ``last_result``), and small readers over that dict (``node_rows``, ``gate``). The API and the
CLI read the same dict, so ``fleetyield status`` shows the same thing whether the daemon is up or not.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from slurm_fleetyield.core.explain import explain, explain_dict
from slurm_fleetyield.core.loop import TickResult
from slurm_fleetyield.core.model import NodeSample, Tier
from slurm_fleetyield.core.plan import Action, DrainNode, ResumeNode, UpdateNodes
from slurm_fleetyield.ports import ApplyReport

GATE_DENY_TIERS = frozenset({Tier.QUARANTINED.value, Tier.RETIRED.value})
"""The Prolog gate refuses jobs only on nodes FleetYield itself took out of service."""


def _num(x: float | None) -> float | None:
    """JSON has no NaN: an unknown risk is null."""
    return None if x is None or math.isnan(x) else x


def action_dict(action: Action) -> dict[str, Any]:
    if isinstance(action, UpdateNodes):
        return {
            "kind": "update",
            "nodes": list(action.nodes),
            "features": list(action.features),
            "weight": action.weight,
        }
    if isinstance(action, DrainNode):
        return {
            "kind": "drain",
            "node": action.node,
            "reason": action.reason,
            "requeue_jobs": list(action.requeue_jobs),
            "cause": action.cause,
        }
    if isinstance(action, ResumeNode):
        return {"kind": "resume", "node": action.node, "reason": action.reason}
    raise TypeError(f"unknown action {action!r}")


def render_result(
    tick: int,
    now: float,
    result: TickResult,
    report: ApplyReport,
    samples: Mapping[str, NodeSample],
    *,
    dry_run: bool,
    duration_s: float,
) -> dict[str, Any]:
    nodes: dict[str, Any] = {}
    for name, d in sorted(result.nodes.items()):
        sample = samples.get(name)
        nodes[name] = {
            "node": name,
            "tier": d.tier.value,
            "health": d.health.value,
            "risk": _num(d.risk),
            "features": list(d.features),
            "fy_features": list(d.fy_features),
            "weight": d.weight,
            "slurm_state": d.slurm_state,
            "reason": d.reason,
            "managed": d.managed,
            "scrape_error": sample.error if sample is not None else "not sampled",
            "explain": explain_dict(name, result),
            "explain_text": explain(name, result),
        }
    return {
        "tick": tick,
        "time": now,
        "duration_s": duration_s,
        "dry_run": dry_run,
        "summary": {
            "nodes": len(nodes),
            "tiers": dict(sorted(Counter(n["tier"] for n in nodes.values()).items())),
            "scrape_errors": sum(1 for s in samples.values() if s.error),
            "actions": len(result.plan.actions),
            "holds": len(result.plan.holds),
        },
        "plan": {
            "actions": [action_dict(a) for a in result.plan.actions],
            "holds": [
                {"node": h.node, "action": h.action, "rule": h.rule, "detail": h.detail}
                for h in result.plan.holds
            ],
        },
        "apply": {
            "calls": report.calls,
            "failed": [
                {"action": action_dict(r.action), "command": list(r.command), "detail": r.detail}
                for r in report.failed
            ],
        },
        "nodes": nodes,
    }


ROW_KEYS = ("node", "tier", "health", "risk", "features", "weight", "slurm_state", "reason", "scrape_error")


def node_rows(view: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The fleet table: one compact row per node."""
    if not view:
        return []
    return [{k: n.get(k) for k in ROW_KEYS} for n in view["nodes"].values()]


def gate(view: Mapping[str, Any] | None, node: str) -> dict[str, Any]:
    """Prolog gate: deny only when FleetYield quarantined or retired the node; otherwise allow (fail open)."""
    if not view:
        return {"allow": True, "reason": "fleetyield has no decision yet"}
    n = view["nodes"].get(node)
    if n is None:
        return {"allow": True, "reason": f"{node} is not managed by fleetyield"}
    if n["tier"] in GATE_DENY_TIERS:
        return {"allow": False, "reason": f"fleetyield: node {n['tier']}: {n['reason']}"}
    return {"allow": True, "reason": f"tier {n['tier']}"}
