"""The ledger aggregation of the read model (``fleetyield ledger``, ``/v1/ledger``)."""

from __future__ import annotations

import pytest

from slurm_fleetyield.adapters.views import aggregate_ledger

ROWS = [
    {
        "job_id": 1,
        "end": 86_400.0 * 2 + 5,
        "workload": "pretrain",
        "nodes": ["a", "b"],
        "useful_gpu_s": 7200.0,
        "wasted_gpu_s": 3600.0,
        "premium_misuse_gpu_s": 0.0,
        "failure": True,
        "tier_at_start": "green",
        "cause": "hardware",
    },
    {
        "job_id": 2,
        "end": 86_400.0 * 2 + 9,
        "workload": "batch",
        "nodes": ["a"],
        "useful_gpu_s": 3600.0,
        "wasted_gpu_s": 0.0,
        "premium_misuse_gpu_s": 1800.0,
        "failure": False,
        "tier_at_start": "yellow",
        "cause": "completed",
    },
    {
        "job_id": 3,
        "end": 86_400.0 * 3,
        "workload": None,
        "nodes": ["b"],
        "useful_gpu_s": 0.0,
        "wasted_gpu_s": 7200.0,
        "premium_misuse_gpu_s": 0.0,
        "failure": True,
        "tier_at_start": "red",
        "cause": "node_fail",
    },
]


def test_total_and_by_class():
    (total,) = aggregate_ledger(ROWS)
    assert total == {
        "group": "all",
        "jobs": 3.0,
        "failures": 2.0,
        "useful_gpu_h": 3.0,
        "wasted_gpu_h": 3.0,
        "net_goodput_gpu_h": 0.0,
        "premium_misuse_gpu_h": 0.5,
    }
    by_class = {g["group"]: g for g in aggregate_ledger(ROWS, "class")}
    assert (
        by_class["pretrain"]["net_goodput_gpu_h"] == 1.0 and by_class["unclassified"]["wasted_gpu_h"] == 2.0
    )


def test_by_node_splits_multi_node_jobs_and_by_day_is_utc():
    by_node = {g["group"]: g for g in aggregate_ledger(ROWS, "node")}
    assert by_node["a"]["useful_gpu_h"] == 2.0 and by_node["a"]["jobs"] == 1.5
    assert by_node["b"]["wasted_gpu_h"] == 2.5
    days = [g["group"] for g in aggregate_ledger(ROWS, "day")]
    assert days == ["1970-01-03", "1970-01-04"]
    assert [g["group"] for g in aggregate_ledger(ROWS, "tier")] == ["green", "red", "yellow"]
    with pytest.raises(ValueError, match="group by"):
        aggregate_ledger(ROWS, "user")
