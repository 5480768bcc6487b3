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


# --------------------------------------------------------------------------------------------------------
# Incremental rendering (ViewRenderer -> Store view tables), through the real daemon tick
# --------------------------------------------------------------------------------------------------------

from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel  # noqa: E402
from slurm_fleetyield.adapters.store import Store  # noqa: E402
from slurm_fleetyield.adapters.views import ViewRenderer, render_result  # noqa: E402
from slurm_fleetyield.config import Config  # noqa: E402
from slurm_fleetyield.core.explain import explain, explain_dict  # noqa: E402
from slurm_fleetyield.core.model import GpuReading, NodeSample  # noqa: E402
from slurm_fleetyield.daemon import Daemon  # noqa: E402
from slurm_fleetyield.sim.cluster import SimSlurm  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


class FakeSense:
    """8 healthy H100s per node; ``remap`` nodes have a pending row remap, ``down`` nodes do not answer."""

    def __init__(self) -> None:
        self.remap: set[str] = {"n2"}
        self.down: set[str] = set()

    def sample(self, nodes, now):
        out = {}
        for name in nodes:
            if name in self.down:
                out[name] = NodeSample(name, now, error="connection failed: refused")
                continue
            gpus = []
            for g in range(8):
                f = {"DCGM_FI_DEV_GPU_TEMP": 40.0 + g, "DCGM_FI_DEV_FB_TOTAL": 81559.0}
                if g == 0 and name in self.remap:
                    f["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1.0
                gpus.append(GpuReading(g, f"GPU-{name}-{g}", H100, fields=f))
            out[name] = NodeSample(name, now, tuple(gpus), expected_gpus=8)
        return out


def fleet(tmp_path, n: int = 6, **kw):
    slurm = SimSlurm([(f"n{i}", 8, "h100", ("h100", "nvlink")) for i in range(n)])
    sense = FakeSense()
    clock = {"now": 1_768_212_200.0}
    daemon = Daemon(Config(), slurm, sense, Store(tmp_path / "fy.db"), clock=lambda: clock["now"], **kw)
    return daemon, slurm, sense, clock


def stored_ticks(store: Store) -> dict[str, int]:
    return dict(store._conn().execute("SELECT node, tick FROM view_nodes").fetchall())


def test_a_node_whose_entry_did_not_change_is_not_rewritten(tmp_path):
    daemon, slurm, sense, clock = fleet(tmp_path)
    daemon.tick_once()
    assert stored_ticks(daemon.store) == {f"n{i}": 1 for i in range(6)}
    clock["now"] += 30
    daemon.tick_once()  # features applied on tick 1 are in Slurm now: tick 2 settles
    clock["now"] += 30
    written = []
    real_commit = daemon.store.commit_tick
    daemon.store.commit_tick = lambda *a, **kw: written.append(kw["view"]) or real_commit(*a, **kw)
    daemon.tick_once()  # nothing changed
    assert written[0].nodes == () and written[0].deletes == ()
    ticks = stored_ticks(daemon.store)
    assert max(ticks.values()) <= 2 and daemon.store.last_result_tick() == 3
    # one node stops answering: only its entry is written
    sense.down.add("n4")
    clock["now"] += 30
    daemon.tick_once()
    assert [n[0] for n in written[1].nodes] == ["n4"]
    after = stored_ticks(daemon.store)
    assert after["n4"] == 4 and {k: v for k, v in after.items() if k != "n4"} == {
        k: v for k, v in ticks.items() if k != "n4"
    }
    assert daemon.store.last_view()["nodes"]["n4"]["scrape_error"].startswith("connection failed")
    # a node Slurm no longer lists is deleted from the view
    del slurm.nodes["n5"], slurm._views["n5"]
    clock["now"] += 30
    daemon.tick_once()
    assert written[2].deletes == ("n5",) and "n5" not in stored_ticks(daemon.store)
    daemon.store.close()


def test_the_stored_view_is_the_rendered_view(tmp_path):
    """The store's whole view (rows + explanations) equals ``render_result`` of the same tick."""
    daemon, *_ = fleet(tmp_path)
    out = daemon.tick_once()
    whole = render_result(1, out.result.now, out.result, out.report, out.samples, dry_run=False, duration_s=0)
    stored = daemon.store.last_result()
    assert stored["nodes"] == whole["nodes"]
    assert {k: v for k, v in stored.items() if k not in ("nodes", "duration_s")} == {
        k: v for k, v in whole.items() if k not in ("nodes", "duration_s")
    }
    daemon.store.close()


def test_explain_a_green_node_from_the_store_and_from_the_api(tmp_path):
    daemon, _, _, clock = fleet(tmp_path)
    for _ in range(3):
        out = daemon.tick_once()
        clock["now"] += 30
    result = out.result
    green = next(n for n, d in result.nodes.items() if d.tier.value == "green")
    # the API: live from the daemon's last tick
    server = ApiServer("127.0.0.1", 0, StoreReadModel(daemon.store, explain=daemon.explain))
    status, doc = server.route(f"/v1/nodes/{green}/explain", {})
    assert (
        status == 200
        and doc["explain"] == explain_dict(green, result)
        and doc["text"] == explain(green, result)
    )
    status, entry = server.route(f"/v1/nodes/{green}", {})
    whole = render_result(3, result.now, result, out.report, out.samples, dry_run=False, duration_s=0)
    assert status == 200 and list(entry) == list(whole["nodes"][green]) and entry == whole["nodes"][green]
    fleet_doc = server.route("/v1/fleet", {})[1]
    assert [n["gpus"] for n in fleet_doc["nodes"]] == [
        [{"index": g["index"], "health": g["health"], "risk": float(f"{g['probability']:.3g}"), "xids": []}
         for g in explain_dict(n, result)["gpus"]]
        for n in sorted(result.nodes)
    ]  # fmt: skip
    server._httpd.server_close()
    daemon.store.close()
    # the daemon is down: the read-only store still explains it (rendered when the node last changed)
    ro = StoreReadModel(Store(tmp_path / "fy.db", readonly=True))
    x, text = ro.explanation(green)
    assert (
        x["node"] == green and x["tier"] == "green" and len(x["gpus"]) == 8 and text == explain(green, result)
    )


def test_explanations_past_the_budget_follow_over_the_next_ticks(tmp_path):
    daemon, *_ = fleet(tmp_path, n=7)
    daemon.views = ViewRenderer(explain_per_tick=3)
    out = daemon.tick_once()
    explained = {n for n in out.result.nodes if daemon.store.node_explanation(n) is not None}
    assert len(explained) == 3 and "n2" in explained  # the yellow node (row remap pending) first
    assert daemon.views.unexplained == frozenset(out.result.nodes) - explained
    # not explained yet: the store says so (no stale or wrong explanation); the API explains it live
    missing = sorted(daemon.views.unexplained)[0]
    assert StoreReadModel(daemon.store).explanation(missing) is None
    server = ApiServer("127.0.0.1", 0, StoreReadModel(daemon.store))
    assert server.route(f"/v1/nodes/{missing}/explain", {})[0] == 503
    server._httpd.server_close()
    live = StoreReadModel(daemon.store, explain=daemon.explain).explanation(missing)
    assert live is not None and live[0]["node"] == missing
    daemon.tick_once()
    daemon.tick_once()
    assert daemon.views.unexplained == frozenset()
    assert all(daemon.store.node_explanation(n) is not None for n in out.result.nodes)
    daemon.store.close()


def test_a_failed_commit_rewrites_every_node_next_tick(tmp_path):
    daemon, _, _, clock = fleet(tmp_path)
    daemon.tick_once()
    real_commit = daemon.store.commit_tick

    def boom(*a, **kw):
        raise OSError("disk full")

    daemon.store.commit_tick = boom
    clock["now"] += 30
    with pytest.raises(OSError):
        daemon.tick_once()
    daemon.store.commit_tick = real_commit
    clock["now"] += 30
    daemon.tick_once()
    assert set(stored_ticks(daemon.store).values()) == {3}
    daemon.store.close()
