"""PrometheusSense without a Prometheus: query planning and the fold of recorded answers into NodeSamples.

The real-Prometheus comparison with the direct scrape is tests/promstack/test_prometheus_sense.py.
"""

from __future__ import annotations

import json

import pytest

from slurm_fleetyield.adapters.prometheus import (
    AGENT_GPUS_EXPECTED,
    CORE_FIELDS,
    PrometheusError,
    PrometheusSense,
    parse_response,
)

NOW = 1_800_000_000.0
GPU = {"UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"}


def series(labels: dict, value: float | str) -> dict:
    return {"metric": labels, "value": [NOW, str(value)]}


def fake_query(answers: dict[str, list[dict]]):
    """A Query that answers by family (the metric name the PromQL starts with)."""
    asked: list[str] = []

    def query(promql: str) -> list[dict]:
        asked.append(promql)
        name = promql.split("{", 1)[0].split("(", 1)[-1]
        if promql.startswith("timestamp("):
            name = "timestamp"
        return answers.get(name, [])

    query.asked = asked  # type: ignore[attr-defined]
    return query


def agent_answers(host: str = "gpu-01", instance: str = "10.0.0.1:9400") -> dict[str, list[dict]]:
    base = {"gpu": "0", "Hostname": host, "instance": instance, "job": "fy", **GPU}
    return {
        "DCGM_FI_DEV_GPU_TEMP": [series(base, 55)],
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": [series(base, 12)],
        "DCGM_FI_DEV_ROW_REMAP_PENDING": [series(base, float(0x7FFFFFF0))],  # int32 blank on a gauge
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": [series(base, float(0x7FFFFFF0))],  # a counter may pass 2^31
        "fleetyield_gpu_xid_errors_total": [series({**base, "xid": "48"}, 1)],
        "DCGM_EXP_XID_ERRORS_COUNT": [series({**base, "xid": "48"}, 1)],
        AGENT_GPUS_EXPECTED: [series({"instance": instance, "job": "fy"}, 2)],
        "up": [series({"instance": instance, "job": "fy"}, 1)],
        "timestamp": [series({"instance": instance, "job": "fy"}, NOW - 3)],
    }


def test_agent_node_sample():
    prom = PrometheusSense(query=fake_query(agent_answers()))
    s = prom.sample(["gpu-01"], NOW)["gpu-01"]
    assert s.error is None and s.source == "prometheus" and s.time == NOW - 3
    assert s.expected_gpus == 2  # the label-less gauge, attributed through the target's GPU series
    (g,) = s.gpus
    assert (g.index, g.uuid, g.model, g.pci_bus_id) == (0, "GPU-1", GPU["modelName"], GPU["pci_bus_id"])
    assert g.fields == {
        "DCGM_FI_DEV_GPU_TEMP": 55.0,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 12.0,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": float(0x7FFFFFF0),
    }
    assert g.xid_totals == {48: 1.0}


def test_dcgm_exporter_node_uses_the_windowed_count():
    answers = agent_answers()
    del answers["fleetyield_gpu_xid_errors_total"], answers[AGENT_GPUS_EXPECTED]
    answers["DCGM_EXP_XID_ERRORS_COUNT"].append(
        series({"gpu": "0", "Hostname": "gpu-01", "instance": "10.0.0.1:9400", "job": "fy", **GPU}, 0)
    )  # dcgm-exporter's per-GPU zero series has no xid label
    s = PrometheusSense(query=fake_query(answers)).sample(["gpu-01"], NOW)["gpu-01"]
    assert s.expected_gpus is None and s.gpus[0].xid_totals == {48: 1.0}


def test_errors_are_unknown_never_healthy():
    answers = agent_answers()
    answers["up"] = [series({"instance": "10.0.0.1:9400", "job": "fy"}, 0)]
    out = PrometheusSense(query=fake_query(answers)).sample(["gpu-01", "gpu-02"], NOW)
    assert "target down" in out["gpu-01"].error
    assert "no series" in out["gpu-02"].error
    bad = agent_answers()
    bad["DCGM_FI_DEV_GPU_TEMP"][0]["metric"]["gpu"] = "zero"
    assert "malformed" in PrometheusSense(query=fake_query(bad)).sample(["gpu-01"], NOW)["gpu-01"].error

    def down(promql: str) -> list[dict]:
        raise PrometheusError("cannot reach http://prometheus:9090/api/v1/query: refused")

    out = PrometheusSense(query=down).sample(["gpu-01", "gpu-02"], NOW)
    assert all(s.error.startswith("prometheus: cannot reach") for s in out.values())


def test_plan_one_query_per_family_with_batched_escaped_node_regex():
    prom = PrometheusSense(query=fake_query({}), selector='job="fleetyield-agent"', nodes_per_query=2)
    plan = prom.plan(["gpu.01", "gpu-02", "gpu-03"])
    per_family = len(CORE_FIELDS) + 2
    assert len(plan) == per_family * 2 + 3
    temp = [q.promql for q in plan if q.family == "DCGM_FI_DEV_GPU_TEMP"]
    assert temp == [
        'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu\\\\-02|gpu\\\\-03", job="fleetyield-agent"}',
        'DCGM_FI_DEV_GPU_TEMP{Hostname=~"gpu\\\\.01", job="fleetyield-agent"}',
    ]
    assert plan[-1].promql == 'timestamp(up{job="fleetyield-agent"})'
    assert PrometheusSense(query=fake_query({})).plan(["a"])[-2].promql == "up"
    with pytest.raises(ValueError, match="label name"):
        PrometheusSense(node_label="host-name")


def test_parse_response():
    ok = {"status": "success", "data": {"resultType": "vector", "result": [series({}, 1)]}}
    assert parse_response(json.dumps(ok).encode()) == ok["data"]["result"]
    for bad in (
        b"<html>",
        b'{"status": "error", "errorType": "bad_data", "error": "parse error"}',
        b'{"status": "success", "data": {"resultType": "matrix", "result": []}}',
    ):
        with pytest.raises(PrometheusError):
            parse_response(bad, "up")
