"""Benchmark: wall time of one policy run as the fleet grows (openb-derived workload).

Usage: ``python bench/bench_sim.py [--nodes 100,300,1000] [--days 90] [--policies baseline,fleetyield]``.
Prints one line per (nodes, policy): jobs, ticks, wall seconds, of which inside ``tick`` (the core), and the
core's cost per GPU per tick. Target (issue): 1,000 nodes x 8 GPUs x 90 days in < 60 s per policy run.
"""

from __future__ import annotations

import argparse
import time

from slurm_fleetyield.sim import runner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", default="100,300,1000")
    ap.add_argument("--days", type=float, default=90.0)
    ap.add_argument("--policies", default="baseline,oracle,fleetyield")
    ap.add_argument("--control-interval", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    head = ("nodes", "policy", "jobs", "ticks", "wall_s", "tick_s", "us/GPU/tick")
    print(" ".join(head))
    for n in (int(x) for x in a.nodes.split(",")):
        cfg = runner.make_config(nodes=n, days=a.days, seed=a.seed, control_interval_s=a.control_interval)
        t0 = time.perf_counter()
        inputs = runner.build_inputs(cfg)
        build_s = time.perf_counter() - t0
        print(f"{n:>6} {'(inputs)':<11} {len(inputs.jobs):>8} {'':>6} {build_s:>8.2f}", flush=True)
        for p in a.policies.split(","):
            sim = runner.Simulation(cfg, p, inputs)
            t0 = time.perf_counter()
            sim.run()
            wall = time.perf_counter() - t0
            per = sim.tick_s / sim.ticks / (n * cfg.gpus_per_node) * 1e6 if sim.ticks else 0.0
            print(
                f"{n:>6} {p:<11} {len(inputs.jobs):>8} {sim.ticks:>6} {wall:>8.2f} {sim.tick_s:>8.2f} "
                f"{per:>11.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
