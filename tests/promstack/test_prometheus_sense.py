"""PrometheusSense against a real Prometheus scraping real fake agents: the same samples, the same decisions.

Three ``fleetyield-agent serve --backend fake`` processes (faults: XID 48, XID 79 = a GPU gone, baked ECC
and NVLink counters) are scraped every second by a real Prometheus. The direct ``AgentScraper`` and
``PrometheusSense`` must then produce the same ``NodeSample`` per node (every field the core reads,
xid_totals, expected_gpus, GPU identity), and ``tick`` on either must give identical features, weights,
tiers and plan.
"""

from __future__ import annotations

import random
import time

from slurm_fleetyield.adapters.prometheus import CORE_FIELDS, PrometheusSense
from slurm_fleetyield.adapters.scrape import AgentScraper, fetch_url
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import NodeSample, Observations, SlurmNode
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState

NODES = ("gpu-a", "gpu-b", "gpu-c", "gpu-nowhere")


def _direct(fleet) -> AgentScraper:
    urls = {f"http://{name}/metrics": a.url for name, a in fleet.items()}
    return AgentScraper(
        "http://{node}/metrics",
        timeout_s=2,
        fetch=lambda u, t: fetch_url(urls.get(u, "http://127.0.0.1:1/"), t),
    )


def _view(sample: NodeSample, fields: frozenset[str]) -> tuple:
    """Everything the decision code reads from a sample (time aside: Prometheus reports its scrape time)."""
    if sample.error:
        return ("error",)
    return (
        sample.expected_gpus,
        tuple(
            (
                g.index,
                g.uuid,
                g.model,
                g.pci_bus_id,
                {k: v for k, v in g.fields.items() if k in fields},
                dict(g.xid_totals),
            )
            for g in sample.gpus
        ),
    )


def _slurm() -> dict[str, SlurmNode]:
    return {
        n: SlurmNode(
            name=n,
            states=frozenset({"IDLE"}),
            available_features=("h100",),
            active_features=("h100",),
            gpu_type="h100",
            gpu_count=2,
        )
        for n in NODES
    }


def _same_round(fleet, prometheus):
    """A direct scrape, a Prometheus sample and another direct scrape that agree (the fake agents' gauges
    move every 5 s; Prometheus' copy is up to 1 s old, so a round may straddle a change: retry)."""
    direct, prom = _direct(fleet), PrometheusSense(prometheus.url)
    fields = frozenset(prom.fields)
    last = None
    for _ in range(30):
        now = time.time()
        d1 = direct.sample(NODES, now)
        p = prom.sample(NODES, now)
        d2 = direct.sample(NODES, now)
        views = [{n: _view(s[n], fields) for n in NODES} for s in (d1, p, d2)]
        if views[0] == views[1] == views[2]:
            return now, d1, p, prom
        last = views
        time.sleep(0.3)
    raise AssertionError(f"direct and Prometheus samples never agreed: {last}")


def test_same_samples_as_the_direct_scrape(fleet, prometheus):
    now, direct, prom_samples, _ = _same_round(fleet, prometheus)
    a, b, c = (prom_samples[n] for n in ("gpu-a", "gpu-b", "gpu-c"))
    # the faults are visible, identically
    assert a.gpus[0].xid_totals == {48: 1.0} and direct["gpu-a"].gpus[0].xid_totals == {48: 1.0}
    assert len(b.gpus) == 1 and b.expected_gpus == 2  # XID 79: GPU 1 fell off the bus
    assert c.gpus[1].fields["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] > 0
    assert c.gpus[0].fields["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] > 0
    # every field the core reads that the agent exports came through
    for node in ("gpu-a", "gpu-b", "gpu-c"):
        for d, p in zip(direct[node].gpus, prom_samples[node].gpus, strict=True):
            assert set(p.fields) == set(d.fields) & set(CORE_FIELDS)
            assert p.fields == {k: v for k, v in d.fields.items() if k in CORE_FIELDS}
        assert prom_samples[node].source == "prometheus" and prom_samples[node].error is None
        assert now - prom_samples[node].time < 5  # the target's last scrape, not "now"
    # a node Prometheus has never seen is an error (UNKNOWN), like an unreachable agent
    assert direct["gpu-nowhere"].error and "no series" in (prom_samples["gpu-nowhere"].error or "")


def test_tick_decides_the_same_on_both(fleet, prometheus):
    now, direct, prom_samples, _ = _same_round(fleet, prometheus)
    slurm = _slurm()
    results = [
        tick(
            ControllerState.empty(),
            Observations(time=now, slurm=slurm, samples=s),
            Params(),
            now,
            random.Random(0),
        )
        for s in (direct, prom_samples)
    ]
    d, p = results
    for node in NODES:
        dn, pn = d.nodes[node], p.nodes[node]
        assert (dn.tier, dn.features, dn.weight, dn.health) == (pn.tier, pn.features, pn.weight, pn.health), (
            node
        )
        assert repr(d.risks[node].probability) == repr(p.risks[node].probability)  # nan for UNKNOWN
    assert d.plan.actions == p.plan.actions
    assert d.nodes["gpu-b"].tier.value == "quarantined"  # GPU missing drains on both paths
    assert d.nodes["gpu-nowhere"].health.value == "unknown"


def test_queries_scale_with_families_not_nodes(prometheus):
    prom = PrometheusSense(prometheus.url)
    few = prom.plan(NODES)
    many = prom.plan([f"node-{i:05d}" for i in range(4000)])
    assert len(few) == len(many) == len(CORE_FIELDS) + 2 + 3
    batched = PrometheusSense(prometheus.url, nodes_per_query=1000).plan([f"n{i}" for i in range(4000)])
    assert len(batched) == (len(CORE_FIELDS) + 2) * 4 + 3
    # every planned query is valid PromQL that Prometheus accepts
    for q in few:
        assert prometheus.query(q.promql)["status"] == "success", q.promql


def test_prometheus_down_is_unknown_not_healthy(prometheus):
    from promstack.stack import free_port

    dead = PrometheusSense(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    out = dead.sample(NODES, time.time())
    assert all(s.error and s.error.startswith("prometheus:") for s in out.values())
