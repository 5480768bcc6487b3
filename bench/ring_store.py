"""What one tick's ring work costs a moving GPU under three stores for the trend ring (#30): a model, not the
controller.

Per GPU: a ring of 61 steps of 19 channels whose channels 8 and 9 move every step (bench_tick.py's loaded
GPUs move two counters). One tick: new adjusted values with those two channels moved, one step appended
and the oldest dropped, three base values read. The GPUs are visited in random order, so with many GPUs
the working set is not in the processor's cache, as in a 100k tick. Stores:

- ``tuples``: a tuple of point tuples, unchanged channels sharing their float objects (core/history.py
  today);
- ``array``: one flat ``array('d')`` per ring (copies without refcounts, 19 values a step);
- ``channel``: a float array per moved channel only, beside the last adjusted tuple.

Output: microseconds per GPU per store, three rounds.

    taskset -c 1 .venv/bin/python bench/ring_store.py [--gpus 30000]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from array import array
from collections.abc import Callable

CHANNELS, STEPS, MOVED = 19, 61, (8, 9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=30_000)
    n = ap.parse_args().gpus
    rng = random.Random(0)
    tuples: list[tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]] = []
    for _ in range(n):
        point = [rng.random() for _ in range(CHANNELS)]
        steps = []
        for _ in range(STEPS):
            point = point[:]
            for c in MOVED:
                point[c] += rng.random()
            steps.append(tuple(point))
        tuples.append((steps[-1], tuple(steps)))
    flat = [(array("d", last), array("d", [x for p in steps for x in p])) for last, steps in tuples]
    chans = [(last, {c: array("d", [p[c] for p in steps]) for c in MOVED}) for last, steps in tuples]
    order = list(range(n))
    rng.shuffle(order)
    a, b = MOVED

    def moved(last: tuple[float, ...]) -> tuple[float, ...]:
        adj = list(last)
        adj[a] += 1.0
        adj[b] += 2.0
        return tuple(adj)

    def tick_tuples() -> float:
        out = 0.0
        for i in order:
            last, steps = tuples[i]
            new = moved(last)
            out += (new[a] - steps[1][a]) + (new[b] - steps[-10][b]) + (new[a] - steps[-1][a])
            tuples[i] = (new, (*steps[1:], new))
        return out

    def tick_array() -> float:
        out = 0.0
        k = CHANNELS
        for i in order:
            last, steps = flat[i]
            new = array("d", last)
            new[a] += 1.0
            new[b] += 2.0
            out += (new[a] - steps[k + a]) + (new[b] - steps[(STEPS - 10) * k + b]) + (new[a] - steps[-k + a])
            flat[i] = (new, steps[k:] + new)
        return out

    def tick_channel() -> float:
        out = 0.0
        for i in order:
            last, rings = chans[i]
            new = moved(last)
            ra, rb = rings[a], rings[b]
            out += (new[a] - ra[1]) + (new[b] - rb[-10]) + (new[a] - ra[-1])
            na, nb = ra[1:], rb[1:]
            na.append(new[a])
            nb.append(new[b])
            chans[i] = (new, {a: na, b: nb})
        return out

    stores: dict[str, Callable[[], float]] = {
        "tuples": tick_tuples,
        "array": tick_array,
        "channel": tick_channel,
    }
    gc.disable()
    for _ in range(3):
        row = []
        for name, fn in stores.items():
            t0 = time.perf_counter()
            fn()
            row.append(f"{name} {(time.perf_counter() - t0) / n * 1e6:.2f} us")
        print(f"{n} GPUs: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
