"""The page at 1,000 nodes x 8 GPUs: one canvas, measured render time, through the real API server.

The read model is synthetic (a 1,000-node rendered tick, 30 days of ledger, open proposals); everything from
the HTTP server to the canvas is the real code. The floor's draw time is measured in the browser
(``performance.now()`` around the draw, ``window.fleetyield.state.lastRenderMs``) and printed.
"""

from __future__ import annotations

import gzip
import json
import random
import time
import urllib.request

import pytest
from webharness import artifacts_dir, console_errors, wait_for

from slurm_fleetyield.adapters.api import ApiServer

N_NODES = 1000
N_GPUS = 8
RENDER_BUDGET_MS = 250.0
"""Generous for a shared CI runner; a laptop draws the floor in a few ms."""

TIERS = ["green"] * 70 + ["yellow"] * 20 + ["red", "quarantined", "canary", "probation", "retired", "unknown"]


class SyntheticFleet:
    def __init__(self, now: float) -> None:
        rng = random.Random(5)
        self.now = now
        nodes, lifecycle = {}, {}
        for i in range(N_NODES):
            name = f"gpu-{i:04d}"
            tier = rng.choice(TIERS)
            gpus = [
                {
                    "index": k,
                    "uuid": f"GPU-{i:04d}-{k}",
                    "model": "h100",
                    "health": "bad" if tier == "quarantined" and k == 3 else "ok",
                    "probability": min(0.99, rng.lognormvariate(-6, 1.5)),
                    "fatal_xids": [79] if tier == "quarantined" and k == 3 else [],
                    "signals": [],
                }
                for k in range(N_GPUS)
            ]
            if tier in ("quarantined", "canary", "probation", "retired"):
                lifecycle[name] = tier
            nodes[name] = {
                "node": name,
                "tier": tier,
                "health": "ok",
                "risk": rng.random() * 0.1,
                "features": ["h100", f"fy_tier_{tier}"],
                "fy_features": [f"fy_tier_{tier}"],
                "weight": 100,
                "slurm_state": "IDLE",
                "reason": f"<script>tier {tier}</script>",
                "managed": True,
                "scrape_error": None,
                "explain": {
                    "node": name,
                    "gpus": gpus,
                    "lifecycle": {"stage": lifecycle.get(name, "in_service")},
                },
                "explain_text": f"node {name}",
            }
        tiers: dict[str, int] = {}
        for n in nodes.values():
            tiers[n["tier"]] = tiers.get(n["tier"], 0) + 1
        self.view = {
            "tick": 42,
            "time": now,
            "duration_s": 0.8,
            "dry_run": True,
            "lifecycle": lifecycle,
            "summary": {"nodes": N_NODES, "tiers": tiers, "holds": 2},
            "plan": {"actions": [], "holds": []},
            "apply": {"calls": 0, "failed": []},
            "calibration": {},
            "nodes": nodes,
        }

    def result(self):
        return self.view

    def events(self, limit, node=None):
        kinds = ["tier_change", "drain", "applied", "job_outcome", "proposed", "lifecycle", "agent_xid"]
        return [
            {"seq": i, "time": self.now - i, "tick": 42, "node": f"gpu-{i:04d}", "kind": kinds[i % 7],
             "message": "<i>m</i>", "data": {}}
            for i in range(min(limit, 200))
        ]  # fmt: skip

    def status(self):
        return {"inbox": {"pending": 0, "processed": 9}, "outcomes": {"pending": 0, "processed": 0},
                "tick": 42, "live": {"slurm_ok": True}}  # fmt: skip

    def proposals(self, recent_s, proposal_id=None):
        return [
            {"id": f"p-00000000000{i}", "node": f"gpu-{i:04d}", "gpus": [1], "risk": 0.6, "evidence": "e",
             "affected_jobs": [100 + i], "created_at": self.now, "expires_at": self.now + 3600,
             "status": "pending", "settled_at": None, "settled_by": None}
            for i in range(3)
        ]  # fmt: skip

    def ledger(self, by, since):
        days = [time.strftime("%Y-%m-%d", time.gmtime(self.now - 86400 * d)) for d in range(29, -1, -1)]
        groups = [
            {"group": d, "jobs": 40.0 + i, "failures": float(i % 4), "useful_gpu_h": 900.0 + 10 * i,
             "wasted_gpu_h": 40.0 + (i % 5) * 15, "net_goodput_gpu_h": 860.0 + 10 * i - (i % 5) * 15,
             "premium_misuse_gpu_h": 0.0}
            for i, d in enumerate(days)
        ]  # fmt: skip
        return {"by": by, "since": since, "groups": groups}


@pytest.fixture
def big_api():
    model = SyntheticFleet(time.time())
    server = ApiServer("127.0.0.1", 0, model, None, stale_after_s=600)
    server.start()
    yield server
    server.stop()


def test_floor_of_1000_nodes_renders_on_one_canvas_quickly(browser, big_api):
    url = f"http://127.0.0.1:{big_api.port}"
    with urllib.request.urlopen(url + "/v1/fleet", timeout=10) as r:
        body = r.read()
    fleet = json.loads(body)
    gz_req = urllib.request.Request(url + "/v1/fleet", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(gz_req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        wire = r.read()
    assert json.loads(gzip.decompress(wire)) == fleet
    assert len(fleet["nodes"]) == N_NODES and all(len(n["gpus"]) == N_GPUS for n in fleet["nodes"])

    browser.get(url + "/?poll=60000")
    wait_for(
        lambda: browser.execute_script("return document.getElementById('floor').dataset.nodes") == "1000",
        what="the 1,000-node floor drawn",
    )
    # repaint a few times (resize re-runs the draw) and take the worst
    timings = [browser.execute_script("return window.fleetyield.state.lastRenderMs")]
    for width in (1300, 1400, 1200):
        renders = browser.execute_script("return window.fleetyield.state.renders")
        browser.set_window_size(width, 1100)
        wait_for(
            lambda r=renders: browser.execute_script("return window.fleetyield.state.renders") > r,
            what="a repaint",
        )
        timings.append(browser.execute_script("return window.fleetyield.state.lastRenderMs"))
    fetch_ms = browser.execute_script("return window.fleetyield.state.lastFetchMs")
    print(
        f"\n1,000 nodes x 8 GPUs: /v1/fleet {len(body) / 1024:.0f} KiB ({len(wire) / 1024:.0f} KiB gzipped), "
        f"poll fetch {fetch_ms:.0f} ms, "
        f"floor draw ms {', '.join(f'{t:.1f}' for t in timings)}"
    )
    (artifacts_dir() / "render-1000.json").write_text(
        json.dumps(
            {"fleet_bytes": len(body), "gzip_bytes": len(wire), "fetch_ms": fetch_ms, "draw_ms": timings}
        )
    )
    assert max(timings) < RENDER_BUDGET_MS
    # one element draws the whole floor: no per-GPU DOM nodes
    assert browser.execute_script("return document.querySelectorAll('#floor-wrap *').length") <= 3
    attention = browser.execute_script("return document.querySelectorAll('#attention tbody tr').length")
    listed = sum(1 for n in fleet["nodes"] if n["tier"] != "green" or n["stage"] != "in_service")
    assert attention == min(200, listed)  # capped at 200; the heading says how many there are
    assert browser.execute_script(
        "return window.__pwned === undefined && !document.querySelector('main script')"
    )
    assert browser.execute_script("return document.querySelectorAll('#ledger svg rect').length") == 60
    assert browser.execute_script("return document.querySelectorAll('#proposals .proposal').length") == 3
    cmd = browser.execute_script("return document.querySelector('#proposals code').textContent")
    assert cmd == "fleetyield approve p-000000000000 --key ADMIN.key"
    browser.save_screenshot(str(artifacts_dir() / "page-1000-nodes.png"))
    errors = console_errors(browser)
    browser.get("about:blank")
    assert errors == []
