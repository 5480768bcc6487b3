"""Benchmark the read model's share of a daemon tick without Slurm: render (``ViewRenderer``) and commit.

Input: none (a ``SimSlurm`` of ``--nodes`` nodes, half 8x H100, half 8x L40S, and the synthetic telemetry of
``_fleet.py``, shared with ``bench_reconcile.py``: healthy except 1% remap pending, 1% uncorrectable
remapped rows, 0.4% remap failure, 0.2% not answering). Output: a table on stdout: per tick wall and CPU
seconds of the whole ``Daemon.tick_once``, of decide (``tick``), render and commit, the view rows written
and the explanations rendered, and the size of the state JSON the commit also writes. Ticks: cold (empty
store), steady (nothing changed, explanations still backfilling), the backfill ticks (counted), settled
(nothing changed, every node explained). CPU time is the steadier figure on a shared machine.

    .venv/bin/python bench/bench_render.py [--nodes 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from _fleet import SyntheticSense, sim_nodes

from slurm_fleetyield import daemon as daemon_mod
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.config import Config
from slurm_fleetyield.sim.cluster import SimSlurm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    slurm = SimSlurm(sim_nodes(args.nodes))
    store = Store(os.path.join(tempfile.mkdtemp(), "fy.db"))
    clock = {"now": 1_768_212_200.0}
    d = daemon_mod.Daemon(Config(), slurm, SyntheticSense(), store, clock=lambda: clock["now"])
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    views: list = []

    def timed(name, fn):
        def wrapper(*a, **kw):
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **kw)
            finally:
                wall[name] = wall.get(name, 0.0) + time.perf_counter() - w
                cpu[name] = cpu.get(name, 0.0) + time.process_time() - c

        return wrapper

    daemon_mod.tick = timed("decide", daemon_mod.tick)
    d.views.render = timed("render", d.views.render)
    commit = store.commit_tick
    store.commit_tick = timed("commit", lambda *a, **kw: views.append(kw.get("view")) or commit(*a, **kw))
    print(
        f"{args.nodes:,} nodes ({args.nodes * 8:,} GPUs), SimSlurm, synthetic telemetry; seconds wall / cpu"
    )
    cols = ("tick", "total", "decide", "render", "commit", "rows", "explained", "state MB")
    print("  ".join(f"{c:>15}" for c in cols))
    backfill = 0
    for name in ("cold", "steady", "settled"):
        if name == "settled":
            while d.views.unexplained:
                clock["now"] += 30
                d.tick_once()
                backfill += 1
        clock["now"] += 30
        wall.clear(), cpu.clear(), views.clear()
        w, c = time.perf_counter(), time.process_time()
        d.tick_once()
        wall["total"], cpu["total"] = time.perf_counter() - w, time.process_time() - c
        state_mb = len(json.dumps(d.state.to_dict(), separators=(",", ":"))) / 1e6
        view = views[0]
        row = [name] + [f"{wall[k]:.2f} / {cpu[k]:.2f}" for k in ("total", "decide", "render", "commit")]
        row += [len(view.nodes), sum(1 for n in view.nodes if n[3] is not None), f"{state_mb:.1f}"]
        print("  ".join(f"{v!s:>15}" for v in row), flush=True)
    print(f"backfill: {backfill} ticks between steady and settled")


if __name__ == "__main__":
    main()
