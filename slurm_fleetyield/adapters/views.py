"""The read model: a tick's result rendered as JSON for the store, the API and the CLI.

Input: a ``TickResult`` with its apply report and samples. Output: ``render_result`` -> a JSON-able dict
(persisted as ``last_result``), and small readers over that dict (``node_rows``, ``gate``). The API and the
CLI read the same dict, so ``fleetyield status`` shows the same thing whether the daemon is up or not.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from slurm_fleetyield.core.explain import explain, explain_dict
from slurm_fleetyield.core.loop import TickResult
from slurm_fleetyield.core.model import Calibration, LedgerEntry, NodeSample, Tier
from slurm_fleetyield.core.plan import (
    Action,
    CancelCanaries,
    DrainNode,
    PowerCycle,
    ProposeDrain,
    RebootNode,
    ResetGpu,
    ResumeNode,
    SubmitCanary,
    UpdateNodes,
    WithdrawProposal,
)
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
    if isinstance(
        action, ResetGpu | RebootNode | PowerCycle | SubmitCanary | CancelCanaries | WithdrawProposal
    ):
        return {"kind": action.kind, **dataclasses.asdict(action)}
    if isinstance(action, ProposeDrain):
        doc = dataclasses.asdict(action)
        doc["evidence"] = action.evidence[:2000]
        return {"kind": action.kind, **doc}
    raise TypeError(f"unknown action {action!r}")


def calibration_dict(cal: Calibration | None) -> dict[str, Any]:
    """The risk model's track record: reliability bins, Brier score, learned multipliers (JSON-safe)."""
    if cal is None:
        return {"bins": [], "brier": None, "resolved": 0, "multipliers": {}, "open_predictions": 0}
    return {
        "bins": [
            {
                "lower": b.lower,
                "upper": b.upper,
                "predicted_mean": _num(b.predicted_mean),
                "observed_frequency": _num(b.observed_frequency),
                "count": b.count,
            }
            for b in cal.bins
        ],
        "brier": _num(cal.brier),
        "resolved": cal.resolved,
        "multipliers": {str(k): v for k, v in sorted(cal.multipliers.items(), key=lambda kv: str(kv[0]))},
        "open_predictions": cal.open_predictions,
    }


def ledger_row(entry: LedgerEntry) -> dict[str, Any]:
    """A ``LedgerEntry`` as the store's ledger row (``adapters/store.py LEDGER_COLUMNS``)."""
    doc = dataclasses.asdict(entry)
    doc["workload"] = None if entry.workload is None else str(entry.workload.value)
    doc["nodes"] = list(entry.nodes)
    return doc


def lifecycle_stages(state: Any) -> dict[str, str]:
    """node -> rehabilitation stage, for nodes the lifecycle holds (others are in service)."""
    return {
        n: str(getattr(m.stage, "value", m.stage)) for n, m in sorted(getattr(state, "lifecycle", {}).items())
    }


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
    stages = lifecycle_stages(result.state)
    for name, stage in stages.items():
        if name in nodes:
            nodes[name]["stage"] = stage
    return {
        "tick": tick,
        "time": now,
        "duration_s": duration_s,
        "dry_run": dry_run,
        "calibration": calibration_dict(getattr(result, "calibration", None)),
        "lifecycle": stages,
        "summary": {
            "nodes": len(nodes),
            "tiers": dict(sorted(Counter(n["tier"] for n in nodes.values()).items())),
            "scrape_errors": sum(1 for s in samples.values() if s.error),
            "actions": len(result.plan.actions),
            "holds": len(result.plan.holds),
            "stages": dict(sorted(Counter(stages.values()).items())),
            "settled_jobs": len(getattr(result, "ledger", ())),
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


# --------------------------------------------------------------------------------------------------------
# The goodput ledger, aggregated (``fleetyield ledger``, ``/v1/ledger``)
# --------------------------------------------------------------------------------------------------------

LEDGER_GROUPS = ("class", "node", "tier", "day", "cause", "all")


def _group_keys(row: Mapping[str, Any], by: str) -> list[tuple[str, float]]:
    """(group, share) pairs: a job's GPU-seconds go to its group; by node, split evenly over its nodes."""
    if by == "class":
        return [(row.get("workload") or "unclassified", 1.0)]
    if by == "tier":
        return [(row.get("tier_at_start") or "unknown", 1.0)]
    if by == "cause":
        return [(row.get("cause") or "unknown", 1.0)]
    if by == "day":
        import time as _time

        return [(_time.strftime("%Y-%m-%d", _time.gmtime(row["end"])), 1.0)]
    if by == "node":
        nodes = list(row.get("nodes") or []) or ["unknown"]
        return [(n, 1.0 / len(nodes)) for n in nodes]
    return [("all", 1.0)]


def aggregate_ledger(rows: list[Mapping[str, Any]], by: str = "all") -> list[dict[str, Any]]:
    """Useful, wasted and net (useful - wasted) goodput, failures and premium misuse, in GPU-hours, per
    group (sorted by group). Days are UTC. A multi-node job counts once per group, split by node."""
    if by not in LEDGER_GROUPS:
        raise ValueError(f"group by one of {', '.join(LEDGER_GROUPS)}, not {by!r}")
    groups: dict[str, dict[str, float]] = {}
    for row in rows:
        for key, share in _group_keys(row, by):
            g = groups.setdefault(
                key, {"jobs": 0.0, "failures": 0.0, "useful": 0.0, "wasted": 0.0, "premium_misuse": 0.0}
            )
            g["jobs"] += share
            g["failures"] += share * bool(row.get("failure"))
            g["useful"] += share * float(row.get("useful_gpu_s") or 0.0)
            g["wasted"] += share * float(row.get("wasted_gpu_s") or 0.0)
            g["premium_misuse"] += share * float(row.get("premium_misuse_gpu_s") or 0.0)
    out = []
    for key, g in sorted(groups.items()):
        out.append(
            {
                "group": key,
                "jobs": round(g["jobs"], 3),
                "failures": round(g["failures"], 3),
                "useful_gpu_h": round(g["useful"] / 3600.0, 4),
                "wasted_gpu_h": round(g["wasted"] / 3600.0, 4),
                "net_goodput_gpu_h": round((g["useful"] - g["wasted"]) / 3600.0, 4),
                "premium_misuse_gpu_h": round(g["premium_misuse"] / 3600.0, 4),
            }
        )
    return out
