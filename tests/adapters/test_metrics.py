"""Controller metrics: a Collector over the last tick, in its own registry."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from slurm_fleetyield.adapters.metrics import ControllerStats, TickSnapshot, make_registry


def scrape(stats: ControllerStats) -> dict[tuple[str, tuple], float]:
    text = generate_latest(make_registry(stats)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_before_any_tick_only_counters():
    values = scrape(ControllerStats())
    assert values[("fleetyield_ticks_total", (("outcome", "ok"),))] == 0
    assert not any(name == "fleetyield_nodes" for name, _ in values)


def test_metrics_over_the_last_tick(tick_parts):
    result, report, _ = tick_parts
    stats = ControllerStats()
    stats.record_failure()
    stats.record_tick(TickSnapshot(7, 1000.0, 0.25, result, report, True, 1))
    stats.add("push_accepted", 2)
    values = scrape(stats)
    tiers = {dict(k)["tier"]: v for (n, k), v in values.items() if n == "fleetyield_nodes"}
    assert tiers["quarantined"] == 1 and sum(tiers.values()) == len(result.nodes)
    assert values[("fleetyield_ticks_total", (("outcome", "error"),))] == 1
    assert values[("fleetyield_tick_duration_seconds", ())] == 0.25
    assert values[("fleetyield_last_tick_timestamp_seconds", ())] == 1000.0
    assert values[("fleetyield_slurm_calls_total", ())] == report.calls
    assert values[("fleetyield_slurm_action_failures_total", ())] == 1
    assert values[("fleetyield_scrape_errors_total", ())] == 1
    assert values[("fleetyield_push_events_accepted_total", ())] == 2
    assert values[("fleetyield_holds", (("rule", "drain_cap"),))] == 1
    risks = {dict(k)["node"]: v for (n, k), v in values.items() if n == "fleetyield_node_risk"}
    assert set(risks) == set(result.nodes)
    gpus = [k for (n, k) in values if n == "fleetyield_gpu_risk"]
    assert len(gpus) == sum(len(r.gpus) for r in result.risks.values()) and gpus


def test_gate_ledger_and_lifecycle_metrics(tick_parts):
    result, report, _ = tick_parts
    stats = ControllerStats()
    stats.record_tick(TickSnapshot(7, 1000.0, 0.25, result, report, True, 0))
    stats.set_gauge("proposals_pending", 2)
    stats.set_ledger(
        {"jobs": 3, "useful_gpu_s": 100.0, "wasted_gpu_s": 30.0, "premium_misuse_gpu_s": 5.0, "failures": 1}
    )
    values = scrape(stats)
    assert values[("fleetyield_proposals_pending", ())] == 2
    assert values[("fleetyield_ledger_useful_gpu_seconds_total", ())] == 100.0
    assert values[("fleetyield_ledger_wasted_gpu_seconds_total", ())] == 30.0
    assert values[("fleetyield_net_goodput_gpu_seconds", ())] == 70.0
    stages = {dict(k)["stage"]: v for (n, k), v in values.items() if n == "fleetyield_nodes_lifecycle"}
    assert stages == {
        str(m.stage.value): float(sum(1 for x in result.state.lifecycle.values() if x.stage == m.stage))
        for m in result.state.lifecycle.values()
    }


def test_kept_open_and_unsubmittable_class_features(tick_parts):
    from dataclasses import replace

    result, report, _ = tick_parts
    state = replace(result.state, kept_open=(("fy_ok_decode", ""), ("fy_ok_train", "gpu001")))
    stats = ControllerStats()
    stats.record_tick(TickSnapshot(7, 1000.0, 0.25, replace(result, state=state), report, True, 0))
    values = scrape(stats)

    def family(name: str) -> dict[str, float]:
        return {dict(k)["feature"]: v for (n, k), v in values.items() if n == name}

    assert family("fleetyield_class_feature_kept_open") == {
        "fy_ok_train": 1.0,
        "fy_ok_finetune": 0.0,
        "fy_ok_decode": 0.0,
    }
    assert family("fleetyield_class_feature_unsubmittable") == {
        "fy_ok_train": 0.0,
        "fy_ok_finetune": 0.0,
        "fy_ok_decode": 1.0,
    }


def test_reclaim_gauges_and_requeue_actions(tick_parts):
    from dataclasses import replace

    from slurm_fleetyield.core.plan import Plan, RequeueJobs
    from slurm_fleetyield.core.state import ReclaimMemory

    result, report, _ = tick_parts
    state = replace(result.state, reclaim=ReclaimMemory(((9, 1.0), (10, 2.0)), (("gpu001", 9, 3.0),)))
    plan = Plan((RequeueJobs("gpu001", (4, 5), 9, "premium reclaim"),))
    stats = ControllerStats()
    stats.record_tick(TickSnapshot(7, 1000.0, 0.25, replace(result, state=state, plan=plan), report, True, 0))
    values = scrape(stats)
    assert values[("fleetyield_reclaim_walled_nodes", ())] == 1
    assert values[("fleetyield_reclaim_blocked_jobs", ())] == 2
    assert values[("fleetyield_plan_actions", (("kind", "requeue"),))] == 1
    assert values[("fleetyield_plan_actions", (("kind", "drain"),))] == 0


def test_unauthenticated_requests_are_counted_by_endpoint_and_reason():
    # issue #27 item 4: refusals before authentication write nothing durable; this counter is their trace
    stats = ControllerStats()
    assert not any(n == "fleetyield_unauthenticated_requests_total" for n, _ in scrape(stats))
    for _ in range(3):
        stats.unauthenticated("approvals", "bad_signature")
    stats.unauthenticated("events", "bad_signature")
    values = scrape(stats)
    key = "fleetyield_unauthenticated_requests_total"
    assert values[(key, (("endpoint", "approvals"), ("reason", "bad_signature")))] == 3
    assert values[(key, (("endpoint", "events"), ("reason", "bad_signature")))] == 1


def _breaker_result():
    """A real tick whose capacity breaker holds for pretrain: 4 nodes, one about to fail, a 1,000-GPU gang
    pending (withholding that one node would pass 20% of the in-service GPUs)."""
    from core.builders import Fleet, Runner

    from slurm_fleetyield.core import signals as s
    from slurm_fleetyield.core.model import JobView, WorkloadClass

    f = Fleet(4)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)
    f.set("gpu000", 3, s.REMAP_FAILURE, 1)
    f.jobs = [JobView(17, "PENDING", (), True, WorkloadClass.PRETRAIN, 1000)]
    return Runner(f).tick()


def test_the_capacity_breaker_is_a_metric_per_class(tick_parts):
    from slurm_fleetyield.ports import ApplyReport

    stats = ControllerStats()
    result = _breaker_result()
    assert [e.kind for e in result.events if e.kind == "stake_breaker"] == ["stake_breaker"]
    stats.record_tick(TickSnapshot(1, 1000.0, 0.1, result, ApplyReport(), True, 0))
    values = scrape(stats)

    def family(name: str) -> dict[str, float]:
        return {dict(k)["class"]: v for (n, k), v in values.items() if n == name}

    assert family("fleetyield_stake_breaker_tripped") == {
        "batch": 0.0,
        "decode": 0.0,
        "finetune": 0.0,
        "pretrain": 1.0,
    }
    assert family("fleetyield_stake_breaker_would_withhold_gpus")["pretrain"] == 8
    assert family("fleetyield_stake_breaker_withheld_gpus")["pretrain"] == 0
    # a tick without it: every class 0 (exported, not absent)
    result, report, _ = tick_parts
    stats.record_tick(TickSnapshot(2, 1001.0, 0.1, result, report, True, 0))
    values = scrape(stats)
    assert family("fleetyield_stake_breaker_tripped") == dict.fromkeys(
        ("batch", "decode", "finetune", "pretrain"), 0.0
    )


def test_the_shipped_alert_rule_reads_the_breaker_metric():
    import re
    from pathlib import Path

    import yaml

    rules = Path(__file__).parents[2] / "contrib" / "prometheus" / "fleetyield-rules.yml"
    alerts = {
        r["alert"]: r for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"] if "alert" in r
    }
    rule = alerts["FleetYieldStakeBreaker"]
    (metric,) = re.findall(r"fleetyield_[a-z_]+", rule["expr"])
    stats = ControllerStats()
    from slurm_fleetyield.ports import ApplyReport

    stats.record_tick(TickSnapshot(1, 1000.0, 0.1, _breaker_result(), ApplyReport(), True, 0))
    assert (metric, (("class", "pretrain"),)) in scrape(stats)
    assert rule["labels"]["severity"] == "warning" and "fleetyield_action" not in rule["labels"]
