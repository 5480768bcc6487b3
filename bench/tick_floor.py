"""A lower bound for the 100k tick (#30): the least sense + risk work per GPU, in pure Python, per channel.

Not the controller and not a model of its rules: a yardstick for a redesign. On bench_tick.py's synthetic
fleet (the same readings, 30% of GPUs moving every tick, rings filled for 70 ticks) it does per tick what
any sense + risk must: read each GPU's counters, compare them with the last sample, and only for the
channels that moved keep a ring of (time, value) and their window growth; score a moving GPU from the
channels with growth and a quiet one from its level fields and temperature margin; multiply a node's
survival. ``--objects`` also builds, per GPU, what today's output model builds: one ``SensedGpu`` and one
``GpuRisk`` (frozen dataclasses). Output: steady-state min / median tick time of the last 8 ticks; compare
with bench_tick.py's sense + risk share (docs/results.md, "What a per-channel sense and risk could reach").

    taskset -c 1 .venv/bin/python bench/tick_floor.py [--gpus 20000] [--objects]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from bisect import bisect_left
from itertools import compress
from operator import itemgetter, ne

from bench_tick import SyntheticFleet

from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import GpuRisk, Health, Observations
from slurm_fleetyield.core.signals import COUNTER_CHANNELS, GPU_TEMP, SLOWDOWN_TEMP
from slurm_fleetyield.core.trends import SensedGpu

N_CHANNELS = len(COUNTER_CHANNELS)
PICK = itemgetter(*COUNTER_CHANNELS)
LEVEL_FIELDS = (s.REMAP_FAILURE, s.REMAP_PENDING, s.ROWS_UNCORR, s.THROTTLE_REASONS)
WINDOWS = (600.0, 3600.0)
BASE = 1e-4


class Floor:
    """Per-channel trend memory: last raw counters per GPU, a ring per moved (GPU, channel), and per GPU the
    channels with growth inside the longest window (until when)."""

    def __init__(self, objects: bool) -> None:
        self.objects = objects
        self.last: dict[str, tuple[float | None, ...]] = {}
        self.rings: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
        self.active: dict[str, dict[int, float]] = {}

    def tick(self, obs: Observations, now: float) -> dict[str, float]:
        z0 = math.log(BASE / (1 - BASE))
        longest = max(WINDOWS)
        out = {}
        for name, sample in obs.samples.items():
            survive = 1.0
            for r in sample.gpus:
                raw = PICK(r.fields)
                uuid = r.uuid
                prev = self.last.get(uuid)
                self.last[uuid] = raw
                act = self.active.get(uuid)
                if prev is not None and raw != prev:
                    if act is None:
                        act = self.active[uuid] = {}
                    for c in compress(range(N_CHANNELS), map(ne, raw, prev)):
                        ring = self.rings.get((uuid, c))
                        if ring is None:
                            ring = self.rings[(uuid, c)] = ([now - 60.0], [prev[c] or 0.0])
                        ring[0].append(now)
                        ring[1].append(raw[c] or 0.0)
                        act[c] = now + longest
                if act:
                    p, rates = self._moving(uuid, raw, act, now, z0)
                    g = SensedGpu(r, raw, rates, rates) if self.objects else None
                else:
                    get = r.fields.get
                    margin = (get(SLOWDOWN_TEMP) or 87.0) - (get(GPU_TEMP) or 0.0)
                    p = 2 * BASE if any(map(get, LEVEL_FIELDS)) or margin < 5 else BASE
                    g = SensedGpu(r, raw, None, None) if self.objects else None
                if g is not None:
                    GpuRisk(name, r.index, uuid, r.model, Health.OK, p, ())
                survive *= 1.0 - p
            out[name] = 1.0 - survive
        return out

    def _moving(
        self, uuid: str, raw: tuple[float | None, ...], act: dict[int, float], now: float, z0: float
    ) -> tuple[float, tuple[float, ...]]:
        z = z0
        rates = [0.0] * N_CHANNELS
        for c, until in list(act.items()):
            if until <= now:
                del act[c]
                continue
            times, values = self.rings[(uuid, c)]
            cut = bisect_left(times, now - max(WINDOWS))
            if cut:
                del times[:cut]
                del values[:cut]
            v = raw[c] or 0.0
            for w in WINDOWS:
                j = bisect_left(times, now - w)
                rate = (v - values[j]) * 3600.0 / max(w, now - times[j])
                if rate > rates[c]:
                    rates[c] = rate
            if rates[c] > 0:
                z += 0.5
        return 1 / (1 + math.exp(-z)), tuple(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=20_000)
    ap.add_argument("--ticks", type=int, default=70, help="ticks run; the last 8 are timed")
    ap.add_argument("--objects", action="store_true", help="also build a SensedGpu and a GpuRisk per GPU")
    args = ap.parse_args()
    fleet = SyntheticFleet(args.gpus)
    floor = Floor(args.objects)
    now = 1_700_000_000.0
    times = []
    for i in range(args.ticks):
        if i:
            fleet.advance()
            now += 60.0
        obs = fleet.observe(now)
        t0 = time.perf_counter()
        floor.tick(obs, now)
        times.append(time.perf_counter() - t0)
    last = times[-8:]
    what = "with a SensedGpu and a GpuRisk per GPU" if args.objects else "no object per GPU"
    print(f"{args.gpus} GPUs, {what}: steady min {min(last):.3f} s, median {statistics.median(last):.3f} s")


if __name__ == "__main__":
    main()
