"""The controller's own Prometheus metrics, read at scrape time from the last tick.

Input: ``ControllerStats``, which the daemon updates once per tick (the last ``TickResult``, its apply
report, timings) and which counts drains, Slurm calls and scrape errors across ticks. Output: a Collector
(``collect() -> Iterable[Metric]``, fresh families every scrape) in a non-global ``CollectorRegistry``.
Nothing in the core sets a gauge: metrics are a view of the tick's result, like the API.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from slurm_fleetyield.core.keep_open import NEEDS
from slurm_fleetyield.core.loop import TickResult
from slurm_fleetyield.core.model import Tier
from slurm_fleetyield.ports import ApplyReport

CLASS_FEATURES = tuple(f for f, _ in NEEDS)  # fy_ok_train, fy_ok_finetune, fy_ok_decode


@dataclass(frozen=True, slots=True)
class TickSnapshot:
    """One finished tick as the metrics need it."""

    tick: int
    time: float
    duration_s: float
    result: TickResult
    report: ApplyReport
    slurm_ok: bool
    scrape_errors: int


class ControllerStats:
    """Thread-safe holder of the last tick and the cumulative counters (the daemon writes, scrapes read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: TickSnapshot | None = None
        self.counts: Counter[str] = Counter()
        self.gauges: dict[str, float] = {}
        self.ledger: dict[str, float] = {}
        self.unauth: Counter[tuple[str, str]] = Counter()

    def record_tick(self, snap: TickSnapshot) -> None:
        kinds = Counter(r.action.kind for r in snap.report.results if r.ok)
        with self._lock:
            self.last = snap
            self.counts["ticks_ok"] += 1
            self.counts["drains"] += kinds["drain"]
            self.counts["resumes"] += kinds["resume"]
            self.counts["updates"] += kinds["update"]
            self.counts["slurm_calls"] += snap.report.calls
            self.counts["slurm_failures"] += len(snap.report.failed)
            self.counts["scrape_errors"] += snap.scrape_errors

    def record_failure(self) -> None:
        with self._lock:
            self.counts["ticks_failed"] += 1

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def unauthenticated(self, endpoint: str, reason: str) -> None:
        """A listener refused a request that failed authentication (nothing of it was stored)."""
        with self._lock:
            self.unauth[(endpoint, reason)] += 1

    def read_unauthenticated(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.unauth)

    def set_gauge(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = value

    def set_ledger(self, totals: dict[str, float]) -> None:
        """Ledger table totals (the store's sums), refreshed by the daemon when a tick settles jobs."""
        with self._lock:
            self.ledger = dict(totals)

    def read(self) -> tuple[TickSnapshot | None, dict[str, int]]:
        with self._lock:
            return self.last, dict(self.counts)

    def read_extra(self) -> tuple[dict[str, float], dict[str, float]]:
        with self._lock:
            return dict(self.gauges), dict(self.ledger)


class ControllerCollector:
    def __init__(self, stats: ControllerStats) -> None:
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        return []  # no collect() at register time

    def collect(self) -> Iterable[Metric]:
        last, counts = self._stats.read()
        ticks = CounterMetricFamily("fleetyield_ticks", "Controller ticks by outcome.", labels=["outcome"])
        ticks.add_metric(["ok"], counts.get("ticks_ok", 0))
        ticks.add_metric(["error"], counts.get("ticks_failed", 0))
        yield ticks
        for name, key, doc in (
            ("fleetyield_drains", "drains", "Nodes drained by FleetYield (successful scontrol calls)."),
            ("fleetyield_resumes", "resumes", "Nodes resumed by FleetYield."),
            ("fleetyield_node_updates", "updates", "Feature/weight update actions applied."),
            ("fleetyield_slurm_calls", "slurm_calls", "Slurm commands run to apply plans."),
            (
                "fleetyield_slurm_action_failures",
                "slurm_failures",
                "Plan actions whose Slurm command failed.",
            ),
            (
                "fleetyield_scrape_errors",
                "scrape_errors",
                "Node scrapes that failed (timeout, refused, malformed).",
            ),
            (
                "fleetyield_push_events_accepted",
                "push_accepted",
                "Fatal events accepted from agents' pushes.",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=counts.get(key, 0))
        unauth = CounterMetricFamily(
            "fleetyield_unauthenticated_requests",
            "Requests refused before authentication (approvals: malformed/unknown_key/bad_signature; agent "
            "pushes: bad_signature; Alertmanager: bad_token). They write no durable row.",
            labels=["endpoint", "reason"],
        )
        for (endpoint, reason), n in sorted(self._stats.read_unauthenticated().items()):
            unauth.add_metric([endpoint, reason], n)
        yield unauth
        gauges, ledger = self._stats.read_extra()
        if "proposals_pending" in gauges:
            yield GaugeMetricFamily(
                "fleetyield_proposals_pending",
                "Drain proposals waiting for an admin's signed decision.",
                value=gauges["proposals_pending"],
            )
        if ledger:
            useful, wasted = ledger.get("useful_gpu_s", 0.0), ledger.get("wasted_gpu_s", 0.0)
            for name, value, doc in (
                ("fleetyield_ledger_useful_gpu_seconds", useful, "GPU-seconds of settled jobs that counted."),
                ("fleetyield_ledger_wasted_gpu_seconds", wasted, "GPU-seconds lost to hardware failures."),
                (
                    "fleetyield_ledger_premium_misuse_gpu_seconds",
                    ledger.get("premium_misuse_gpu_s", 0.0),
                    "GPU-seconds of non-premium work on premium GPUs while premium work waited.",
                ),
                ("fleetyield_ledger_jobs", ledger.get("jobs", 0), "Job attempts settled in the ledger."),
                (
                    "fleetyield_ledger_failures",
                    ledger.get("failures", 0),
                    "Settled job attempts that failed.",
                ),
            ):
                yield CounterMetricFamily(name, doc, value=value)
            yield GaugeMetricFamily(
                "fleetyield_net_goodput_gpu_seconds",
                "Net goodput of all settled jobs: useful minus wasted GPU-seconds.",
                value=useful - wasted,
            )
        if last is None:
            return
        yield GaugeMetricFamily(
            "fleetyield_last_tick_timestamp_seconds", "End of the last tick.", value=last.time
        )
        yield GaugeMetricFamily(
            "fleetyield_tick_duration_seconds", "Duration of the last tick.", value=last.duration_s
        )
        yield GaugeMetricFamily(
            "fleetyield_slurm_up", "1 when the last tick could read Slurm.", value=int(last.slurm_ok)
        )
        yield GaugeMetricFamily(
            "fleetyield_scrape_errors_last_tick",
            "Nodes whose scrape failed in the last tick.",
            value=last.scrape_errors,
        )
        result = last.result
        calibration = getattr(result, "calibration", None)
        if calibration is not None and calibration.resolved and not math.isnan(calibration.brier):
            yield GaugeMetricFamily(
                "fleetyield_calibration_brier",
                "Brier score of the risk model's resolved predictions (lower is better).",
                value=calibration.brier,
            )
        stages = Counter(
            str(getattr(m.stage, "value", m.stage)) for m in getattr(result.state, "lifecycle", {}).values()
        )
        by_stage = GaugeMetricFamily(
            "fleetyield_nodes_lifecycle", "Nodes per rehabilitation stage (not in service).", labels=["stage"]
        )
        for stage, n in sorted(stages.items()):
            by_stage.add_metric([stage], n)
        yield by_stage
        tiers = Counter(d.tier for d in result.nodes.values())
        by_tier = GaugeMetricFamily("fleetyield_nodes", "Nodes per tier in the last tick.", labels=["tier"])
        for tier in Tier:
            by_tier.add_metric([tier.value], tiers.get(tier, 0))
        yield by_tier
        yield from _breaker(result)
        holds = GaugeMetricFamily(
            "fleetyield_holds",
            "Destructive actions withheld by a safety rule in the last tick.",
            labels=["rule"],
        )
        for rule, n in sorted(Counter(h.rule for h in result.plan.holds).items()):
            holds.add_metric([rule], n)
        yield holds
        actions = GaugeMetricFamily("fleetyield_plan_actions", "Actions in the last plan.", labels=["kind"])
        kinds = Counter(a.kind for a in result.plan.actions)
        for kind in ("update", "drain", "resume", "requeue"):
            actions.add_metric([kind], kinds.get(kind, 0))
        yield actions
        reclaim = getattr(result.state, "reclaim", None)
        walls = GaugeMetricFamily(
            "fleetyield_reclaim_walled_nodes",
            "Premium nodes whose batch jobs were requeued for a pending premium job and that carry no "
            "fy_ok_batch until it starts (core/reclaim.py).",
        )
        walls.add_metric([], len(reclaim.walls) if reclaim is not None else 0)
        yield walls
        blocked = GaugeMetricFamily(
            "fleetyield_reclaim_blocked_jobs",
            "Pending premium-needing jobs that fit no idle premium GPUs but would once batch left them.",
        )
        blocked.add_metric([], len(reclaim.blocked) if reclaim is not None else 0)
        yield blocked
        kept = dict(getattr(result.state, "kept_open", ()))
        opened = GaugeMetricFamily(
            "fleetyield_class_feature_kept_open",
            "1 when no other node carries this class feature and a yellow node keeps it open (keep_open).",
            labels=["feature"],
        )
        refused = GaugeMetricFamily(
            "fleetyield_class_feature_unsubmittable",
            "1 when no node can carry this class feature: Slurm refuses the class's jobs at submission.",
            labels=["feature"],
        )
        for feature in CLASS_FEATURES:
            node = kept.get(feature)
            opened.add_metric([feature], int(bool(node)))
            refused.add_metric([feature], int(node == ""))
        yield opened
        yield refused
        node_risk = GaugeMetricFamily(
            "fleetyield_node_risk",
            "P(fatal GPU failure within the horizon) per node.",
            labels=["node", "tier"],
        )
        for name, decision in sorted(result.nodes.items()):
            node_risk.add_metric([name, decision.tier.value], decision.risk)
        yield node_risk
        gpu_risk = GaugeMetricFamily(
            "fleetyield_gpu_risk",
            "P(fatal failure within the horizon) per GPU.",
            labels=["node", "gpu", "UUID"],
        )
        for name, risk in sorted(result.risks.items()):
            for gpu in risk.gpus:
                gpu_risk.add_metric([name, str(gpu.index), gpu.uuid], gpu.probability)
        yield gpu_risk


def _breaker(result: TickResult) -> Iterable[Metric]:
    """The stake rule's capacity breaker in the last tick (its ``stake_breaker`` events): 1 per class held
    at the cap, with the GPUs the rule would have withheld and the in-service GPUs the cap is a share of.
    Every class of ``stake.classes`` is exported (0 when not held) while the rule is on, so an alert can tell
    "not held" from "not exported"."""
    params = getattr(result, "params", None)
    held = {e.data.get("class"): e.data for e in result.events if e.kind == "stake_breaker"}
    if params is not None and params.stake.enabled:
        classes = sorted(set(params.stake.classes) | set(held))
    else:
        classes = sorted(held)
    if not classes:
        return
    tripped = GaugeMetricFamily(
        "fleetyield_stake_breaker_tripped",
        "1 when withholding this class's fy_ok_* feature by expected loss would pass "
        "stake.withhold_cap_fraction of the in-service GPUs while the class has pending work: the breaker "
        "holds the withheld share at the cap and riskier nodes keep the feature (core/stake.py).",
        labels=["class"],
    )
    would = GaugeMetricFamily(
        "fleetyield_stake_breaker_would_withhold_gpus",
        "GPUs the stake rule would have withheld the class from without the breaker (0 when not held).",
        labels=["class"],
    )
    withheld = GaugeMetricFamily(
        "fleetyield_stake_breaker_withheld_gpus",
        "GPUs the class is withheld from while the breaker holds (at most the cap; 0 when not held).",
        labels=["class"],
    )
    for c in classes:
        d = held.get(c)
        tripped.add_metric([str(c)], int(d is not None))
        would.add_metric([str(c)], d.get("would_withhold_gpus", 0) if d else 0)
        withheld.add_metric([str(c)], d.get("withheld_gpus", 0) if d else 0)
    yield tripped
    yield would
    yield withheld


def make_registry(stats: ControllerStats) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(stats))
    return registry
