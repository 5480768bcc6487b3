"""The read model: a tick's result rendered as JSON for the store, the API and the CLI.

Input: a ``TickResult`` with its apply report and samples. Output: ``ViewRenderer.render`` -> a
``ViewDelta`` the store commits with the tick (the header, and only the nodes whose entry changed, each as
row + floor + explanation); ``render_result`` -> the whole view as one JSON-able dict; small readers over a
view (``node_rows``, ``gate``, ``node_entry``). The API and the CLI read the same store, so ``fleetyield
status`` shows the same thing whether the daemon is up or not.

Why incremental: at 10k nodes every explanation is ~22 KB of JSON (every GPU, every signal), 224 MB per
tick, and explaining is most of the cost (~9 s of a 20 s tick). A node whose change key (``_node_key``:
decision, risk with per-GPU probabilities and fired contributions, scrape error, lifecycle, proposal,
sample age in minutes, the class features the stake rule withheld from it and its GPUs, plus the fleet-wide
learned multipliers, risk parameters and the stake rule's stakes) did not change keeps its stored row and
explanation. So a stored explanation can show raw values of signals that move no score (e.g. a temperature
far from its margin), and the job a class's stake comes from (its size, which decides, is in the key), as
they were when the node last changed; the daemon's API
explains from the live tick result instead, exactly (``StoreReadModel(explain=...)``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from slurm_fleetyield.core.explain import explain_dict, explain_text
from slurm_fleetyield.core.loop import TickResult
from slurm_fleetyield.core.model import (
    Calibration,
    Health,
    LedgerEntry,
    NodeDecision,
    NodeRisk,
    NodeSample,
    Tier,
)
from slurm_fleetyield.core.plan import (
    Action,
    CancelCanaries,
    DrainNode,
    PowerCycle,
    ProposeDrain,
    RebootNode,
    RequeueJobs,
    ResetGpu,
    ResumeNode,
    SignalJobs,
    SubmitCanary,
    UpdateNodes,
    WithdrawProposal,
)
from slurm_fleetyield.core.stake import Withheld
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
        action,
        ResetGpu
        | RebootNode
        | PowerCycle
        | SubmitCanary
        | CancelCanaries
        | WithdrawProposal
        | RequeueJobs
        | SignalJobs,
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


def breaker_rows(result: TickResult) -> list[dict[str, Any]]:
    """The stake rule's capacity breaker in this tick (core/stake.py ``stake_breaker`` events): per class
    held, its feature, the GPUs withheld (at the cap), the GPUs the rule would have withheld, the in-service
    GPUs and the message. Empty: no breaker held."""
    rows = []
    for e in result.events:
        if e.kind == "stake_breaker":
            d = e.data
            rows.append(
                {
                    "class": d.get("class"),
                    "feature": e.message.split(":", 1)[0],
                    "withheld_gpus": d.get("withheld_gpus"),
                    "would_withhold_gpus": d.get("would_withhold_gpus"),
                    "service_gpus": d.get("service_gpus"),
                    "message": e.message,
                }
            )
    return rows


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


def _header(
    tick: int,
    now: float,
    result: TickResult,
    report: ApplyReport,
    samples: Mapping[str, NodeSample],
    stages: Mapping[str, str],
    *,
    dry_run: bool,
    duration_s: float,
) -> dict[str, Any]:
    """Everything of the view but the nodes (small: plan, apply failures, summary, calibration)."""
    return {
        "tick": tick,
        "time": now,
        "duration_s": duration_s,
        "dry_run": dry_run,
        "calibration": calibration_dict(getattr(result, "calibration", None)),
        "lifecycle": dict(stages),
        "summary": {
            "nodes": len(result.nodes),
            "tiers": dict(sorted(Counter(d.tier.value for d in result.nodes.values()).items())),
            "scrape_errors": sum(1 for s in samples.values() if s.error),
            "actions": len(result.plan.actions),
            "holds": len(result.plan.holds),
            "stages": dict(sorted(Counter(stages.values()).items())),
            "settled_jobs": len(getattr(result, "ledger", ())),
        },
        "stake": {"breaker": breaker_rows(result)},
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
    }


def _row(name: str, d: NodeDecision, sample: NodeSample | None, stage: str | None) -> dict[str, Any]:
    """One node's entry without its explanation (what the table, the gate and the floor read)."""
    row = {
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
    }
    if stage is not None:
        row["stage"] = stage
    return row


def node_entry(row: Mapping[str, Any], explain_doc: Any, text: str | None) -> dict[str, Any]:
    """A node's full entry (``/v1/nodes/{node}``): its row with the explanation, in the rendered order."""
    entry = {k: v for k, v in row.items() if k != "stage"}
    entry["explain"] = explain_doc
    entry["explain_text"] = text
    if "stage" in row:
        entry["stage"] = row["stage"]
    return entry


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
    """The whole view with every node's explanation in one dict (tests, tools; the daemon renders a
    ``ViewDelta`` with ``ViewRenderer`` instead, which explains only the nodes that changed)."""
    stages = lifecycle_stages(result.state)
    nodes: dict[str, Any] = {}
    for name, d in sorted(result.nodes.items()):
        x = explain_dict(name, result)
        nodes[name] = node_entry(_row(name, d, samples.get(name), stages.get(name)), x, explain_text(x))
    header = _header(tick, now, result, report, samples, stages, dry_run=dry_run, duration_s=duration_s)
    return {**header, "nodes": nodes}


# --------------------------------------------------------------------------------------------------------
# Incremental rendering: what the daemon persists each tick
# --------------------------------------------------------------------------------------------------------

AGE_GRAIN_S = 60.0
"""A node's sample age enters its change key in whole minutes: the age of a fresh sample jitters by a
fraction of a second every tick, which must not re-explain the whole fleet."""


EXPLAIN_PER_TICK = 1000
"""At most this many nodes are explained per tick (~0.5 ms and ~10 KB each): a tick where every node
changed (the first one on an empty store, a daemon restart, new learned multipliers) writes every node's
row and floor but explains only this many, non-green nodes first; the rest follow over the next ticks
(10 ticks at 10k nodes) and meanwhile have no stored explanation (the API explains them live)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ViewDelta:
    """One tick's view as the store writes it (``Store.commit_tick(view=...)``): the header, and the nodes
    whose entry changed as (node, row JSON, floor JSON, explanation JSON or None: not explained yet)."""

    tick: int
    header: Mapping[str, Any]
    nodes: tuple[tuple[str, str, str, str | None], ...]
    deletes: tuple[str, ...] = ()
    replace: bool = False  # the renderer remembers nothing: every stored node is replaced
    keys: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict, repr=False)
    globals_key: tuple[Any, ...] = ()
    unexplained: frozenset[str] = frozenset()  # nodes whose stored explanation is missing after this tick


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def _node_key(
    d: NodeDecision,
    r: NodeRisk | None,
    sample: NodeSample | None,
    stage: str | None,
    state: Any,
    name: str,
    wh: Withheld | None = None,
) -> tuple[Any, ...]:
    """Everything a node's row, floor and explanation are computed from, except the raw signal values
    that move no score (a temperature far from its margin) and the sample age below ``AGE_GRAIN_S``."""
    risk_key = None
    if r is not None:
        age = None if r.stale_s is None else int(r.stale_s // AGE_GRAIN_S)
        risk_key = (r.health, _num(r.probability), r.gpus, r.reason, age)
    return (
        d.tier,
        d.health,
        _num(d.risk),
        d.fy_features,
        d.features,
        d.weight,
        d.slurm_state,
        d.reason,
        d.envelope,
        d.managed,
        tuple(e for e in d.evidence if not e.startswith("sample age ")),
        sample.error if sample is not None else "not sampled",
        stage,
        state.lifecycle.get(name),
        state.proposals.get(name),
        risk_key,
        None if wh is None else (wh.nodes.get(name), wh.gpus.get(name)),
    )


def _stakes_key(result: TickResult) -> tuple[Any, ...]:
    """The stake rule's fleet-wide figures an explanation shows (not the source job: it changes with the
    queue while the rounded size that decides stays)."""
    wh = getattr(result, "withheld", None)
    return () if wh is None else tuple((x.workload, x.gpus, x.lost_s) for x in wh.stakes)


class ViewRenderer:
    """Renders each tick as a ``ViewDelta`` against the last committed one: every node's change key is
    compared with the previous tick's; only nodes whose key changed (or that are new) get their row and
    floor written, and are explained, serialized and written (at most ``explain_per_tick`` explanations a
    tick, see ``EXPLAIN_PER_TICK``). At 10k nodes a steady tick explains nothing.

    ``accept(delta)`` after the store committed it; a failed commit leaves the memory as it was, so the
    next tick writes the same nodes again. A new renderer (daemon restart) remembers nothing and replaces
    every stored node on its first tick.
    """

    def __init__(self, explain_per_tick: int = EXPLAIN_PER_TICK) -> None:
        self.explain_per_tick = explain_per_tick
        self._keys: dict[str, tuple[Any, ...]] = {}
        self._globals: tuple[Any, ...] | None = None
        self._unexplained: frozenset[str] = frozenset()

    @property
    def unexplained(self) -> frozenset[str]:
        """Nodes with no stored explanation as of the last accepted tick."""
        return self._unexplained

    def render(
        self,
        tick: int,
        now: float,
        result: TickResult,
        report: ApplyReport,
        samples: Mapping[str, NodeSample],
        *,
        dry_run: bool,
        duration_s: float,
    ) -> ViewDelta:
        stages = lifecycle_stages(result.state)
        header = _header(tick, now, result, report, samples, stages, dry_run=dry_run, duration_s=duration_s)
        learn = getattr(result.state, "learn", None)
        multipliers = tuple(sorted(getattr(learn, "multipliers", {}).items()))
        glob = (
            multipliers,
            result.signals,
            _num(result.horizon_days),
            _num(result.base_probability),
            _stakes_key(result),
        )
        replace = self._globals is None
        old = {} if replace or glob != self._globals else self._keys
        keys: dict[str, tuple[Any, ...]] = {}
        changed: set[str] = set()
        state = result.state
        wh = getattr(result, "withheld", None)
        for name, d in result.nodes.items():
            key = _node_key(d, result.risks.get(name), samples.get(name), stages.get(name), state, name, wh)
            keys[name] = key
            if old.get(name) != key:
                changed.add(name)
        # explain the changed and the still unexplained nodes, the ones worth a look first
        todo = sorted(
            changed | (self._unexplained & keys.keys()),
            key=lambda n: (_boring(result.nodes[n], stages.get(n), state.proposals.get(n)), n),
        )
        explain_now = set(todo[: self.explain_per_tick])
        rows = []
        for name in sorted(changed | explain_now):
            d = result.nodes[name]
            x = _dumps(explain_dict(name, result)) if name in explain_now else None
            row = _row(name, d, samples.get(name), stages.get(name))
            rows.append((name, _dumps(row), _dumps(_floor(result, name)), x))
        deletes = () if replace else tuple(sorted(set(self._keys) - set(keys)))
        unexplained = frozenset(todo[self.explain_per_tick :])
        return ViewDelta(tick, header, tuple(rows), deletes, replace, keys, glob, unexplained)

    def accept(self, delta: ViewDelta) -> None:
        """The store committed ``delta``: remember its keys as the base of the next tick's diff."""
        self._keys = dict(delta.keys)
        self._globals = delta.globals_key
        self._unexplained = delta.unexplained

    def forget(self) -> None:
        """Next tick replaces every stored node (e.g. after a failed commit)."""
        self._keys, self._globals, self._unexplained = {}, None, frozenset()


def _boring(d: NodeDecision, stage: str | None, proposal: Any) -> bool:
    return d.tier is Tier.GREEN and d.health is Health.OK and stage is None and proposal is None


def _floor(result: TickResult, name: str) -> dict[str, Any]:
    """What the floor (``/v1/fleet``) reads of a node's explanation: the open proposal and its GPUs
    without their signals (``web.fleet_floor``), from the tick result directly."""
    r = result.risks.get(name)
    prop = result.state.proposals.get(name)
    return {
        "proposal": None if prop is None else {"id": prop.proposal_id},
        "gpus": [
            {
                "index": g.index,
                "health": g.health.value,
                "probability": g.probability,
                "fatal_xids": list(g.fatal_xids),
            }
            for g in (r.gpus if r is not None else ())
        ],
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
