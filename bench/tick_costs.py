"""Where the 100k tick goes (#30): the sense, risk and profile stages' cost per quiet GPU, per node and per
moving GPU, measured on bench_tick.py's synthetic fleet.

Three fleets of the same node count, each run to steady state (every trend ring at 61 points) by the real
tick: every GPU quiet at 8 GPUs a node, every GPU quiet at 4 GPUs a node, and bench_tick.py's own fleet (30%
of GPUs moving every tick). On the inputs of one more tick, each stage's plain function (``sense.sense``,
``risk.assess``, ``profile.profile``: every node, no carry) is timed alone, min of ``--repeat`` runs with the
collector paused. From them, per stage: a quiet GPU's cost (the slope from 4 to 8 GPUs a node), a node's own
cost (the intercept), and a moving GPU's extra cost (bench_tick's fleet against the all-quiet one).

A moving GPU is also timed in the processor's cache: sense over the same 50 nodes again and again, against
sense over every node once (the fleet's trend rings do not fit in the cache). Numbers from generated data.

    taskset -c 1 .venv/bin/python bench/tick_costs.py [--gpus 20000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections.abc import Callable
from typing import Any

from bench_tick import MODEL, SyntheticFleet

from slurm_fleetyield.core import profile, risk, sense
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import GpuReading, NodeSample, Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.scoring import Scorer, compile_signals
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.gcpolicy import collect_after

WARM_TICKS = 66  # the longest window (3,600 s) at one sample a minute fills a ring at 61 points


class CostFleet(SyntheticFleet):
    """bench_tick's fleet with ``per_node`` GPUs a node, every GPU quiet unless ``moving``."""

    def __init__(self, gpus: int, per_node: int, moving: bool) -> None:
        super().__init__(gpus)
        self.per_node = per_node
        if not moving:
            self.kind = {}
        self.slurm = {n: dataclasses.replace(row, gpu_count=per_node) for n, row in self.slurm.items()}

    def observe(self, now: float) -> Observations:
        samples = {}
        for name in self.names:
            per = self.fields[name][: self.per_node]
            gpus = tuple(GpuReading(g, f"GPU-{name}-{g}", MODEL, "", dict(f), {}) for g, f in enumerate(per))
            samples[name] = NodeSample(name, now, gpus, self.per_node)
        return Observations(now, dict(self.slurm), samples)


def _steady(fleet: CostFleet, params: Params) -> tuple[Observations, ControllerState, float]:
    """The next tick's observations and the state the real tick reached after ``WARM_TICKS`` ticks."""
    state = ControllerState.empty()
    rng = random.Random(0)
    now = 1_700_000_000.0
    for i in range(WARM_TICKS):
        if i:
            fleet.advance()
            now += 60.0
        with collect_after():
            result = tick(state, fleet.observe(now), params, now, rng)
        state = result.state
        fleet.apply(result.plan.actions)
    fleet.advance()
    now += 60.0
    return fleet.observe(now), state, now


def _best(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        with collect_after():  # the collector paused while timed, a full collection after, as the daemon
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return min(times)


def stages(gpus: int, per_node: int, moving: bool, repeat: int) -> dict[str, float]:
    """Seconds per stage over every node (min of ``repeat``), and sense over 50 nodes in the cache."""
    params = Params()
    fleet = CostFleet(gpus, per_node, moving)
    obs, state, now = _steady(fleet, params)
    layout = state.layout
    sensed = sense.sense(obs, state.history, layout, layout, params.sense, now)
    scorer = Scorer(compile_signals(params, layout), params, layout)
    out = {
        "sense": _best(lambda: sense.sense(obs, state.history, layout, layout, params.sense, now), repeat),
        "risk": _best(lambda: risk.assess(sensed, (), state, params, now, None, scorer), repeat),
        "profile": _best(lambda: profile.profile(sensed, obs, params.profile), repeat),
    }
    few = fleet.names[:50]
    small = Observations(now, {n: obs.slurm[n] for n in few}, {n: obs.samples[n] for n in few})
    history = {n: state.history[n] for n in few}

    def sense_few() -> None:
        for _ in range(20):
            sense.sense(small, history, layout, layout, params.sense, now)

    out["sense_50"] = _best(sense_few, repeat) / 20
    out["moving"] = sum(1 for g in sensed.nodes.values() for x in g.gpus if x.rates is not None)
    out["moving_50"] = sum(1 for n in few for x in sensed.nodes[n].gpus if x.rates is not None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=20_000, help="GPUs of the 8-a-node fleets (nodes = gpus / 8)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    nodes = args.gpus // 8
    q8 = stages(args.gpus, 8, False, args.repeat)
    q4 = stages(args.gpus, 4, False, args.repeat)
    mv = stages(args.gpus, 8, True, args.repeat)
    print(f"{nodes} nodes; {mv['moving']:.0f} of {args.gpus} GPUs moving in bench_tick's fleet")
    print(f"{'stage':<8} {'quiet x8 ms':>11} {'quiet x4 ms':>11} {'moving ms':>10} {'us/quiet GPU':>13} "
          f"{'us/node':>8} {'us/moving GPU extra':>20}")  # fmt: skip
    for stage in ("sense", "risk", "profile"):
        per_gpu = (q8[stage] - q4[stage]) / (4 * nodes)
        per_node = q4[stage] / nodes - 4 * per_gpu
        extra = (mv[stage] - q8[stage]) / mv["moving"]
        print(f"{stage:<8} {q8[stage] * 1e3:>11.1f} {q4[stage] * 1e3:>11.1f} {mv[stage] * 1e3:>10.1f} "
              f"{per_gpu * 1e6:>13.2f} {per_node * 1e6:>8.2f} {extra * 1e6:>20.2f}")  # fmt: skip
    if mv["moving_50"]:
        cached = (mv["sense_50"] - q8["sense_50"]) / mv["moving_50"]
        fleetwide = (mv["sense"] - q8["sense"]) / mv["moving"]
        print(f"sense, a moving GPU's extra cost: {cached * 1e6:.2f} us in the cache (50 nodes again and "
              f"again), {fleetwide * 1e6:.2f} us over the whole fleet")  # fmt: skip


if __name__ == "__main__":
    main()
