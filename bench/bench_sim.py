"""Benchmark: wall time of one policy run as the fleet grows (openb-derived workload).

Usage: ``taskset -c 0 .venv/bin/python bench/bench_sim.py [--nodes 32,100,300,1000] [--days 90]
[--policies baseline,fleetyield] [--repeat 3] [--stages] [--churn] [--recompute]``.
``--tick-modes plain,event`` runs the simulator's tick modes alternately (event: grid ticks skipped where
nothing the core reads changed and no wake time is due; the line adds how many were skipped).
Prints one line per (nodes, policy): jobs, ticks, wall seconds (best of ``--repeat`` runs of a fresh
``Simulation`` on the same inputs), of which inside ``tick`` (the core), and the core's cost per GPU per tick.
``--stages`` adds, from one more run, where the time went: each core stage (the functions
``core.loop.tick`` calls) and the simulator's scheduling pass, sampling and Slurm reads, in seconds (the
wrappers add a little overhead of their own). ``--churn`` adds, from one more run, how many nodes change per
tick (mean / median / 90th percentile over the ticks): Slurm's view of the node (state, features or weight),
the node's risk and the node's decision, compared by value with the previous tick. That is the work an
incremental tick (only the nodes that changed) could not skip: the floor of such a rewrite.
``--recompute`` adds, from one more run, the cost of a recomputed node: the run's last tick replayed with
the memo of reusable per-node results kept, then emptied (every node recomputed); median of 7 replays each.
Targets: 1,000 nodes x 8 GPUs x 90 days of openb in < 60 s per policy run on one core (issue #5);
``--workload frontier --nodes 512,1024,2048 --days 30``: 2,048 nodes x 30 days in < 120 s (issue #26).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from slurm_fleetyield.core import loop
from slurm_fleetyield.sim import runner
from slurm_fleetyield.sim.cluster import SimSlurm

STAGES = (
    (loop.carry_sense, "sense"),
    (loop.quarantine, "find_fatal"),
    (loop.carry, "risk"),
    (loop.carry, "profile"),
    (loop.quarantine, "decide"),
    (loop.gate, "decide"),
    (loop.rehab, "rehabilitate"),
    (loop.carry_place, "price"),
    (loop.premium, "widen"),
    (loop.gangs, "widen"),
    (loop.reclaim, "reclaim"),
    (loop.stake, "withhold"),
    (loop.spares, "spares"),
    (loop.carry_place, "route"),
    (loop.keep_open, "keep_open"),
    (loop.gate, "propose"),
    (loop.carry, "remember"),
    (loop.settle, "settle"),
    (loop.learn, "learn"),
    (loop.wake, "wake_at"),
    (runner.Simulation, "_sched"),
    (runner.Simulation, "_samples"),
    (SimSlurm, "read_jobs"),
    (SimSlurm, "read_nodes"),
)


def _timed(f: Callable[..., Any], key: str, acc: dict[str, float]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0

    return wrapper


def instrument(acc: dict[str, float]) -> Callable[[], None]:
    """Wrap every stage with a timer adding into ``acc``; returns the function that unwraps them."""
    saved = []
    for owner, name in STAGES:
        f = getattr(owner, name)
        label = getattr(owner, "__name__", "").rsplit(".", 1)[-1]
        saved.append((owner, name, f))
        setattr(owner, name, _timed(f, f"{label}.{name}", acc))

    def undo() -> None:
        for owner, name, f in saved:
            setattr(owner, name, f)

    return undo


def _tapped_run(cfg: runner.SimConfig, policy: str, inputs: runner.Inputs, tap: Callable[..., None]) -> None:
    """One run with ``tap(state, obs, params, now, result)`` called after every tick (``runner.tick`` wrapped
    for the run, restored after)."""
    inner = runner.tick

    def tapped(state: Any, obs: Any, params: Any, now: float, rng: Any) -> Any:
        result = inner(state, obs, params, now, rng)
        tap(state, obs, params, now, result)
        return result

    runner.tick = tapped
    try:
        runner.Simulation(cfg, policy, inputs).run()
    finally:
        runner.tick = inner


def churn(cfg: runner.SimConfig, policy: str, inputs: runner.Inputs) -> dict[str, list[int]]:
    """Per tick: nodes whose Slurm view, risk or decision differs (by value) from the previous tick's."""
    counts: dict[str, list[int]] = {"slurm": [], "risk": [], "decision": []}
    last: dict[str, dict[str, Any]] = {k: {} for k in counts}

    def count(state: Any, obs: Any, params: Any, now: float, result: Any) -> None:
        for key, now_view in (
            ("slurm", {n: (v.states, v.active_features, v.weight) for n, v in obs.slurm.items()}),
            ("risk", result.risks),
            ("decision", result.nodes),
        ):
            before = last[key]
            counts[key].append(sum(1 for n, v in now_view.items() if before.get(n) != v))
            last[key] = dict(now_view)

    _tapped_run(cfg, policy, inputs, count)
    return counts


def recompute(cfg: runner.SimConfig, policy: str, inputs: runner.Inputs) -> tuple[float, float]:
    """Milliseconds of the run's last tick replayed with the memo kept and with it emptied (medians of 7)."""
    last: list[tuple[Any, Any, Any, float]] = []

    def keep_last(state: Any, obs: Any, params: Any, now: float, result: Any) -> None:
        last[:] = [(state, obs, params, now)]

    _tapped_run(cfg, policy, inputs, keep_last)
    state, obs, params, now = last[0]

    def replay(clear: bool) -> float:
        times = []
        for _ in range(7):
            memo = {} if clear else {k: copy.copy(v) for k, v in state.memo.items()}
            st = replace(state, memo=memo)
            t0 = time.perf_counter()
            runner.tick(st, obs, params, now, random.Random(0))
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    return replay(False), replay(True)


def _spread(xs: list[int]) -> str:
    if not xs:
        return "-"
    s = sorted(xs)
    return f"{sum(s) / len(s):.0f} / {s[len(s) // 2]} / {s[int(len(s) * 0.9)]}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="32,100,300,1000")
    ap.add_argument("--workload", default="openb", help="openb | synthetic | frontier (all-H100 fleet)")
    ap.add_argument("--days", type=float, default=90.0)
    ap.add_argument("--policies", default="baseline,fleetyield")
    ap.add_argument("--control-interval", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per line; the best wall time is printed")
    ap.add_argument(
        "--tick-modes",
        default="plain",
        help="comma-separated SimConfig.tick_mode values (plain, event), run alternately in each repeat",
    )
    ap.add_argument("--stages", action="store_true", help="time each stage in one more, instrumented run")
    ap.add_argument("--churn", action="store_true", help="nodes changed per tick (one more run)")
    ap.add_argument("--recompute", action="store_true", help="cost of a recomputed node (one more run)")
    a = ap.parse_args()
    head = ("nodes", "policy", "jobs", "ticks", "wall_s", "tick_s", "us/GPU/tick")
    print(" ".join(head))
    for n in (int(x) for x in a.nodes.split(",")):
        cfg = runner.make_config(
            nodes=n,
            days=a.days,
            seed=a.seed,
            control_interval_s=a.control_interval,
            workload=a.workload,
            premium_share=1.0 if a.workload == "frontier" else 0.5,
        )
        t0 = time.perf_counter()
        inputs = runner.build_inputs(cfg)
        build_s = time.perf_counter() - t0
        print(f"{n:>6} {'(inputs)':<11} {len(inputs.jobs):>8} {'':>6} {build_s:>8.2f}", flush=True)
        modes = a.tick_modes.split(",")
        for p in a.policies.split(","):
            bests: dict[str, tuple[float, float, int, int]] = {}
            walls: dict[str, list[float]] = {m: [] for m in modes}
            for _ in range(a.repeat):
                for mode in modes:  # alternately, so both see the same state of a shared box
                    sim = runner.Simulation(replace(cfg, tick_mode=mode), p, inputs)
                    t0 = time.perf_counter()
                    sim.run()
                    wall = time.perf_counter() - t0
                    walls[mode].append(wall)
                    if mode not in bests or wall < bests[mode][0]:
                        bests[mode] = (wall, sim.tick_s, sim.ticks, sim.ticks_skipped)
            for mode in modes:
                wall, tick_s, ticks, skipped = bests[mode]
                ran = ticks - skipped
                per = tick_s / ran / (n * cfg.gpus_per_node) * 1e6 if ran else 0.0
                runs = "" if a.repeat == 1 else "  runs: " + ", ".join(f"{w:.1f}" for w in walls[mode])
                label = p if modes == ["plain"] else f"{p}/{mode}"
                skip = f"  skipped {skipped} of {ticks} ticks" if mode != "plain" else ""
                print(
                    f"{n:>6} {label:<11} {len(inputs.jobs):>8} {ticks:>6} {wall:>8.2f} {tick_s:>8.2f} "
                    f"{per:>11.2f}" + skip + runs,
                    flush=True,
                )
            if a.stages:
                acc: dict[str, float] = {}
                undo = instrument(acc)
                try:
                    sim = runner.Simulation(cfg, p, inputs)
                    t0 = time.perf_counter()
                    sim.run()
                    total = time.perf_counter() - t0
                finally:
                    undo()
                parts = sorted(acc.items(), key=lambda kv: -kv[1])
                print(
                    f"{'':>6} stages (instrumented run, {total:.1f} s): "
                    + ", ".join(f"{k} {v:.1f}" for k, v in parts if v >= 0.01),
                    flush=True,
                )
            if a.churn and p != "baseline" and p != "oracle":
                c = churn(cfg, p, inputs)
                print(
                    f"{'':>6} nodes changed per tick (mean / median / p90 of {len(c['slurm'])} ticks): "
                    + ", ".join(f"{k} {_spread(v)}" for k, v in c.items()),
                    flush=True,
                )
            if a.recompute and p != "baseline" and p != "oracle":
                kept, cleared = recompute(cfg, p, inputs)
                per = (cleared - kept) / n * 1e3
                print(
                    f"{'':>6} last tick replayed: {kept:.1f} ms reusing, {cleared:.1f} ms recomputing "
                    f"every node ({per:.0f} us per recomputed node)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
