"""The Alertmanager path end to end on 127.0.0.1: fake agent -> Prometheus (shipped rules) -> Alertmanager
(webhook with a bearer credentials_file) -> the controller's listener -> durable inbox -> tick quarantines.

Also validates the shipped contrib files with the real tools: ``promtool check/test rules``,
``amtool check-config``, and every Grafana panel query against the running Prometheus.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from promstack.stack import REPO, Agent, AlertPath, http_json
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import Observations, SlurmNode
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState

CONTRIB = REPO / "contrib"
DASHBOARD = CONTRIB / "grafana" / "fleetyield.json"


@pytest.fixture(scope="module")
def alert_path(stack_bins, workdir: Path) -> Iterator[AlertPath]:
    agents = [Agent(f"node-{i}", workdir, gpus=2, seed=10 + i) for i in range(2)]
    path = AlertPath(stack_bins, workdir, agents, interval="1s")
    try:
        for a in agents:
            a.start()
        yield path.start()
    finally:
        path.stop()
        for a in agents:
            a.stop()


def test_xid79_reaches_the_inbox_and_quarantines(alert_path: AlertPath):
    agent = alert_path.agents[0]
    latency, event = alert_path.inject_and_wait(agent, gpu=1, xid=79)
    assert (event.node, event.kind, event.source) == (agent.hostname, "alert", "alertmanager")
    assert event.message.startswith("FleetYieldGpuMissing")
    assert alert_path.wake.is_set()
    assert latency < 10, latency  # 1 s scrape + 1 s evaluation; bench/bench_alert_latency.py measures it
    (pending,) = [e for e in alert_path.store.pending() if e.node == agent.hostname]
    # the same decision as the direct path: the node is drained (quarantined)
    slurm = {
        a.hostname: SlurmNode(name=a.hostname, states=frozenset({"IDLE"}), gpu_type="h100", gpu_count=2)
        for a in alert_path.agents
    }
    now = time.time()
    obs = Observations(time=now, slurm=slurm, samples={}, fatal_events=(pending,))
    result = tick(ControllerState.empty(), obs, Params(), now, random.Random(0))
    assert result.nodes[agent.hostname].tier.value == "quarantined"
    drains = [a for a in result.plan.actions if a.kind == "drain"]
    assert [a.node for a in drains] == [agent.hostname]
    # Alertmanager keeps re-sending the firing alert (group_interval 1s): still one event
    time.sleep(3)
    assert [e for e in alert_path.store.stored.values() if e[1].node == agent.hostname] == [
        alert_path.store.stored[event.event_id]
    ]
    assert alert_path.listener.rejected == 0


def test_resolved_alert_resumes_nothing(alert_path: AlertPath):
    agent = alert_path.agents[1]
    alert_path.inject_and_wait(agent, gpu=1, xid=79)
    before = dict(alert_path.store.stored)
    agent.cli("reset", "--gpu", "1")  # GPU back: the alert resolves; Alertmanager sends "resolved"
    deadline = time.time() + 20
    while time.time() < deadline:
        alerts = alert_path.prom.query(f'ALERTS{{alertname="FleetYieldGpuMissing", node="{agent.hostname}"}}')
        if not alerts["data"]["result"]:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the GPU-missing alert never resolved")
    time.sleep(3)  # resolved notifications go out on the next group_interval
    assert alert_path.store.stored == before  # nothing new stored, in particular nothing "resumed"
    assert alert_path.listener.rejected == 0


# -- the shipped files, checked by the real tools ---------------------------------------------------------


def _run(*cmd: str) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, f"{' '.join(cmd)}:\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def test_promtool_checks_and_unit_tests_the_rules(stack_bins):
    rules = CONTRIB / "prometheus" / "fleetyield-rules.yml"
    assert "SUCCESS" in _run(stack_bins["promtool"], "check", "rules", str(rules))
    for test_file in sorted((CONTRIB / "prometheus" / "tests").glob("*.yml")):
        assert "SUCCESS" in _run(stack_bins["promtool"], "test", "rules", str(test_file))
    example = CONTRIB / "prometheus" / "prometheus.yml"
    assert "SUCCESS" in _run(stack_bins["promtool"], "check", "config", str(example))


def test_amtool_checks_the_alertmanager_example(stack_bins):
    out = _run(stack_bins["amtool"], "check-config", str(CONTRIB / "alertmanager" / "alertmanager.yml"))
    assert "SUCCESS" in out


def test_rules_load_and_evaluate_in_prometheus(alert_path: AlertPath):
    rules = http_json(f"{alert_path.prom.url}/api/v1/rules")["data"]["groups"]
    names = {g["name"] for g in rules}
    assert {"fleetyield-recording", "fleetyield-fatal", "fleetyield-health"} <= names
    bad = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r.get("health") == "err"]
    assert not bad, bad


def _panel_queries(doc: dict) -> list[tuple[str, str]]:
    out = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"]))
    for a in doc["annotations"]["list"]:
        out.append((a["name"], a["expr"]))
    return out


def test_grafana_dashboard_structure():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["title"] and doc["uid"] == "fleetyield" and doc["schemaVersion"] >= 30
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    graphs = [p for p in doc["panels"] if p["type"] != "row"]
    assert len(graphs) >= 10
    for p in graphs:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() and t["refId"] for t in p["targets"]), p["title"]
        assert {"x", "y", "w", "h"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    titles = " ".join(p["title"].lower() for p in graphs)
    for topic in ("tier", "risk", "proposals", "drains", "holds"):
        assert topic in titles, topic


def test_every_grafana_query_is_accepted_by_prometheus(alert_path: AlertPath):
    doc = json.loads(DASHBOARD.read_text())
    subst = {"$node": ".*", "$tier": ".*", "$__rate_interval": "1m", "$__interval": "15s"}
    for title, expr in _panel_queries(doc):
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert not re.search(r"\$\w+", expr), (title, expr)
        answer = alert_path.prom.query(expr)
        assert answer["status"] == "success", (title, expr, answer)


def test_grafana_panels_read_both_host_label_spellings():
    """dcgm-exporter main labels the host `hostname`, older releases and the agent `Hostname`: a panel that
    selects or labels by one must do it by the other too, or it is empty on half the fleets."""
    doc = json.loads(DASHBOARD.read_text())
    checked = 0
    for p in doc["panels"]:
        for t in p.get("targets", []):
            expr, legend = t["expr"], t.get("legendFormat", "")
            upper = re.findall(r"\bHostname=~", expr)
            assert len(upper) == len(re.findall(r"\bhostname=~", expr)), (p["title"], expr)
            if "{{Hostname}}" in legend:
                assert "{{hostname}}" in legend, (p["title"], legend)
            if re.search(r"by \([^)]*\bHostname\b", expr):
                assert re.search(r"by \([^)]*\bhostname\b", expr), (p["title"], expr)
            checked += bool(upper)
    assert checked >= 8
