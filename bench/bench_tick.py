"""Benchmark one decide+plan tick of the pure core on synthetic fleets of 1k, 10k and 100k GPUs.

Input: none (synthetic observations, fixed seed). Output: a table on stdout: per fleet size the wall time of
a cold tick (no history) and of a warm tick (history present, Slurm already holding the features of the
previous plan), per-GPU microseconds, Slurm calls (UpdateNodes groups plus drains) and the ratio to the goal
(100k GPUs in under 1 s on one core).

The fleet is not idle: every tick 30% of GPUs accumulate power/thermal violation time (loaded GPUs), 1% grow
correctable ECC errors, 0.2% grow NVLink CRC errors and 0.1% carry a pending row remap; admin features vary
over 16 racks. Numbers from generated data, not from any real cluster.

    .venv/bin/python bench/bench_tick.py [--sizes 1000,10000,100000] [--ticks 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import GpuReading, NodeSample, Observations, SlurmNode
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import UpdateNodes
from slurm_fleetyield.core.state import ControllerState

GOAL_S_PER_100K = 1.0
MODEL = "NVIDIA H100 80GB HBM3"


def _admin(i: int) -> tuple[str, ...]:
    return (f"rack{i % 16}", "ib")


class SyntheticFleet:
    def __init__(self, gpus: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.rng = rng
        self.n_nodes = gpus // 8
        self.names = [f"n{i:06d}" for i in range(self.n_nodes)]
        self.fields: dict[str, list[dict[str, float]]] = {}
        self.kind: dict[tuple[str, int], str] = {}
        for name in self.names:
            per = []
            for g in range(8):
                f = {
                    s.GPU_TEMP: rng.uniform(40, 75),
                    s.SLOWDOWN_TEMP: 87.0,
                    "DCGM_FI_DEV_POWER_USAGE": rng.uniform(200, 700),
                    "DCGM_FI_DEV_GPU_UTIL": rng.uniform(0, 100),
                    "DCGM_FI_DEV_FB_USED": rng.uniform(0, 80_000),
                    s.FB_TOTAL: 81_559.0,
                    s.SBE_VOL: 0.0,
                    s.ROWS_CORR: 0.0,
                    s.ROWS_UNCORR: 0.0,
                    s.REMAP_FAILURE: 0.0,
                    s.REMAP_PENDING: 0.0,
                    s.NVLINK_CRC_FLIT: 0.0,
                    s.NVLINK_CRC_DATA: 0.0,
                    s.NVLINK_REPLAY: 0.0,
                    s.NVLINK_RECOVERY: 0.0,
                    s.PCIE_REPLAY: 0.0,
                    s.THERMAL_VIOLATION: 0.0,
                    s.POWER_VIOLATION: 0.0,
                    s.THROTTLE_REASONS: 0.0,
                }
                r = rng.random()
                if r < 0.001:
                    f[s.REMAP_PENDING] = 1.0
                    self.kind[(name, g)] = "remap"
                elif r < 0.003:
                    self.kind[(name, g)] = "nvlink"
                elif r < 0.013:
                    self.kind[(name, g)] = "sbe"
                elif r < 0.313:
                    self.kind[(name, g)] = "loaded"
                per.append(f)
            self.fields[name] = per
        self.slurm = {
            n: SlurmNode(n, frozenset({"MIXED"}), "", _admin(i), _admin(i), 1, "h100", 8)
            for i, n in enumerate(self.names)
        }

    def advance(self) -> None:
        for (name, g), kind in self.kind.items():
            f = self.fields[name][g]
            if kind == "loaded":
                f[s.POWER_VIOLATION] += 3e6 * self.rng.random()
                f[s.THERMAL_VIOLATION] += 1e5 * self.rng.random()
            elif kind == "sbe":
                f[s.SBE_VOL] += 2
            elif kind == "nvlink":
                f[s.NVLINK_CRC_FLIT] += 50

    def observe(self, now: float) -> Observations:
        samples = {}
        for name in self.names:
            per = self.fields[name]
            gpus = tuple(GpuReading(g, f"GPU-{name}-{g}", MODEL, "", dict(f), {}) for g, f in enumerate(per))
            samples[name] = NodeSample(name, now, gpus, 8)
        return Observations(now, dict(self.slurm), samples)

    def apply(self, plan_actions: tuple) -> None:
        for a in plan_actions:
            if isinstance(a, UpdateNodes):
                for n in a.nodes:
                    old = self.slurm[n]
                    feats = a.features
                    self.slurm[n] = SlurmNode(
                        n, old.states, old.reason, feats, feats, a.weight, old.gpu_type, old.gpu_count
                    )


def run(gpus: int, ticks: int, freeze_gc: bool) -> dict[str, float]:
    fleet = SyntheticFleet(gpus)
    params = Params()
    state = ControllerState.empty()
    rng = random.Random(0)
    now = 1_700_000_000.0
    rows = []
    for i in range(ticks):
        if i:
            fleet.advance()
            now += 60.0
        obs = fleet.observe(now)
        if freeze_gc:  # what a long-running daemon can do after loading its state: keep it out of GC scans
            gc.collect()
            gc.freeze()
        t0 = time.perf_counter()
        result = tick(state, obs, params, now, rng)
        dt = time.perf_counter() - t0
        state = result.state
        fleet.apply(result.plan.actions)
        calls = len(result.plan.actions)
        updated = sum(len(a.nodes) for a in result.plan.actions if isinstance(a, UpdateNodes))
        rows.append((dt, calls, updated))
    cold = rows[0]
    warm = min(rows[1:], key=lambda r: r[0]) if len(rows) > 1 else rows[0]
    warm_worst = max(rows[1:], key=lambda r: r[0]) if len(rows) > 1 else rows[0]
    return {
        "gpus": gpus,
        "nodes": fleet.n_nodes,
        "cold_s": cold[0],
        "cold_calls": cold[1],
        "cold_updated": cold[2],
        "warm_s": warm[0],
        "warm_worst_s": warm_worst[0],
        "warm_calls": warm[1],
        "warm_updated": warm[2],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--ticks", type=int, default=4, help="ticks per size (first is cold)")
    ap.add_argument("--freeze-gc", action="store_true", help="gc.freeze() before each tick (daemon option)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"gc: {'frozen before each tick' if args.freeze_gc else 'default (enabled)'}")
    head = (
        "GPUs",
        "nodes",
        "cold s",
        "calls",
        "upd.nodes",
        "warm s",
        "worst",
        "us/GPU",
        "calls",
        "upd.nodes",
        "goal s",
        "warm/goal",
    )
    print(" ".join(f"{h:>9}" for h in head))
    for n in sizes:
        r = run(n, args.ticks, args.freeze_gc)
        goal = GOAL_S_PER_100K * n / 100_000
        row = (
            f"{r['gpus']}",
            f"{r['nodes']}",
            f"{r['cold_s']:.3f}",
            f"{r['cold_calls']}",
            f"{r['cold_updated']}",
            f"{r['warm_s']:.3f}",
            f"{r['warm_worst_s']:.3f}",
            f"{1e6 * r['warm_s'] / n:.2f}",
            f"{r['warm_calls']}",
            f"{r['warm_updated']}",
            f"{goal:.3f}",
            f"{r['warm_s'] / goal:.2f}",
        )
        print(" ".join(f"{c:>9}" for c in row))


if __name__ == "__main__":
    main()
