"""Benchmark persisting the controller state (``Store.commit_tick`` / ``load_state``) at fleet scale.

Input: none (bench_tick's synthetic fleet, 8 GPUs a node, settled: only 1% of the nodes have a counter
moving each tick). Output: a table on stdout, per fleet size: the cold full commit (fresh database), the
settled tick commit (min and median over ``--settled`` ticks; node rows written), the load of the stored
state on a fresh ``Store``, and the database size. ``--json PATH`` also writes the figures.

The states come from the real core (``tick``) run ``--ticks`` times at 60 s (61 ticks fill the one-hour
history ring); core tick time is not counted. Commit times include encoding the state (the daemon's whole
``commit_tick`` call). The database is a real SQLite file in WAL mode with ``synchronous=FULL`` (an fsync
per commit) under ``--dir`` (default: a temporary directory); with ``--url`` a PostgreSQL database instead
(EMPTIED before each size: its ``public`` schema is dropped).

Before/after: the script also runs against a tree whose store keeps the state as one JSON blob (schema 3):
``PYTHONPATH=/path/to/old/tree .venv/bin/python bench/bench_state_commit.py`` (it passes ``to_dict()`` there,
as the daemon did).

    .venv/bin/python bench/bench_state_commit.py [--sizes 1000,10000] [--ticks 61] [--settled 5] [--no-check]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_tick import SyntheticFleet

from slurm_fleetyield.adapters import store as store_mod
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState

ROWS = store_mod.SCHEMA_VERSION >= 4  # this tree stores the state as rows; before, one JSON blob
CHANGING_FRACTION = 0.01


def settled_fleet(nodes: int) -> SyntheticFleet:
    """bench_tick's fleet with only every 100th node's GPU 0 growing correctable ECC errors each tick."""
    fleet = SyntheticFleet(nodes * 8)
    every = round(1 / CHANGING_FRACTION)
    fleet.kind = {(name, 0): "sbe" for i, name in enumerate(fleet.names) if i % every == 0}
    return fleet


def _commit(store: Store, n: int, now: float, state: ControllerState) -> tuple[float, float]:
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    if ROWS:
        store.commit_tick(n, now, state)
    else:  # the old daemon passed ``to_dict()``: part of its commit
        store.commit_tick(n, now, state.to_dict())  # type: ignore[arg-type]
    return time.perf_counter() - t0, time.process_time() - c0


def _rows_written(store: Store, n: int) -> int | None:
    if not ROWS:
        return None
    return store._conn().execute("SELECT COUNT(*) FROM state_nodes WHERE tick = ?", (n,)).fetchone()[0]


URL: str | None = None
"""``--url``: a PostgreSQL database (emptied before each size) instead of the SQLite file."""


def _target(path: Path) -> str | Path:
    return URL or path


def _db_mb(path: Path) -> float:
    if URL:
        store = Store(URL)
        (size,) = store._conn().execute("SELECT pg_database_size(current_database())").fetchone()
        store.close()
        return size / 1e6
    conn = Store(path)._conn()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6


def run(nodes: int, ticks: int, settled: int, check: bool, workdir: Path) -> dict[str, Any]:
    fleet = settled_fleet(nodes)
    params = Params()
    rng = random.Random(0)
    now = 1_700_000_000.0
    state = ControllerState.empty()
    t_core = time.perf_counter()
    for i in range(ticks):
        if i:
            fleet.advance()
            now += 60.0
        result = tick(state, fleet.observe(now), params, now, rng)
        state = result.state
        fleet.apply(result.plan.actions)
    core_s = time.perf_counter() - t_core
    path = workdir / f"state-{nodes}.db"
    for p in workdir.glob(path.name + "*"):
        p.unlink()
    if URL:
        import psycopg

        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
    store = Store(_target(path))
    cold_s, cold_cpu = _commit(store, 1, now, state)
    cold_rows = _rows_written(store, 1)
    times, cpus, written = [], [], []
    for k in range(settled):
        fleet.advance()
        now += 60.0
        result = tick(state, fleet.observe(now), params, now, rng)
        state = result.state
        fleet.apply(result.plan.actions)
        dt, dc = _commit(store, 2 + k, now, state)
        times.append(dt)
        cpus.append(dc)
        written.append(_rows_written(store, 2 + k))
    store.close()
    db_mb = _db_mb(path)
    gc.collect()
    t0 = time.perf_counter()
    loaded = Store(_target(path)).load_state()
    load_s = time.perf_counter() - t0
    assert loaded is not None
    back = loaded.state
    load_s_total = load_s
    if not ROWS:  # the old daemon parsed the blob in load_state and built the state with from_dict
        t1 = time.perf_counter()
        back = ControllerState.from_dict(loaded.state)  # type: ignore[arg-type]
        load_s_total = load_s + time.perf_counter() - t1
    if check:
        assert back == state, "the loaded state differs from the committed one"
    blob_mb = len(json.dumps(state.to_dict(), separators=(",", ":"))) / 1e6 if check else float("nan")
    return {
        "layout": ("postgresql " if URL else "") + ("rows (schema 4+)" if ROWS else "blob (schema 3)"),
        "nodes": nodes,
        "gpus": nodes * 8,
        "ticks": ticks,
        "core_s": round(core_s, 1),
        "cold_s": round(cold_s, 3),
        "cold_cpu_s": round(cold_cpu, 3),
        "cold_rows": cold_rows,
        "settled_min_s": round(min(times), 4),
        "settled_med_s": round(statistics.median(times), 4),
        "settled_cpu_med_s": round(statistics.median(cpus), 4),
        "settled_rows": written,
        "load_s": round(load_s_total, 3),
        "db_mb": round(db_mb, 1),
        "state_json_mb": round(blob_mb, 1),
        "checked": check,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="fleet sizes in nodes (8 GPUs each)")
    ap.add_argument("--ticks", type=int, default=61, help="core ticks (60 s apart) before the cold commit")
    ap.add_argument("--settled", type=int, default=5, help="settled ticks committed after the cold one")
    ap.add_argument(
        "--no-check", action="store_true", help="skip comparing the loaded state and the state JSON size"
    )
    ap.add_argument("--dir", type=Path, default=None, help="where the databases go (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--url", default=None, help="a PostgreSQL database URL (emptied!) instead of SQLite")
    args = ap.parse_args()
    global URL
    URL = args.url
    if args.ticks < 1 or args.settled < 1:
        ap.error(f"--ticks and --settled must be >= 1, got {args.ticks} and {args.settled}")
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="fy-state-bench-") as tmp:
        workdir = args.dir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for n in sizes:
            r = run(n, args.ticks, args.settled, not args.no_check, workdir)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print()
    print(
        "| nodes | layout | cold commit s (cpu) | settled commit s min / med (cpu med) | rows/tick | load s "
        "| DB MB | state JSON MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['nodes']} | {r['layout']} | {r['cold_s']} ({r['cold_cpu_s']}) | {r['settled_min_s']} / "
            f"{r['settled_med_s']} ({r['settled_cpu_med_s']}) | {r['settled_rows']} | {r['load_s']} | "
            f"{r['db_mb']} | {r['state_json_mb']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    os.sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
