"""When the controller's process runs Python's cyclic garbage collector: after a tick, not inside it.

Input: a block of work (one tick of the daemon's loop). Output: the block's result; the collector ran
once the block was done, whether it succeeded or raised.

Why: a tick builds the fleet's next state (per GPU: sensed values, risks, history points) while the last
one is still referenced. CPython triggers its generational collector by allocation counts, so inside a tick
it scans the young state again and again and, every few collections, the whole heap: 0.6-0.7 s of a ~2 s
warm tick at 100k GPUs (``bench/bench_tick.py --gc default`` against ``--gc daemon``). Nothing in a tick
needs the cyclic collector: the core's values are immutable dataclasses and tuples, which reference
counting frees as soon as the next state replaces them. The loop sleeps for most of each interval, so the
one full collection belongs there: automatic collection is paused while the block runs and a full
``gc.collect()`` runs after it (at 100k GPUs with full trend rings about 1 s: bench_tick.py's ``gc after``
column, 1.04 s on 2026-12-08; off the tick's critical path; a fatal push that arrives meanwhile waits).

The pause is process-wide (the listeners' threads allocate too): their cyclic garbage, if any, waits for
the end of the tick, never longer. A caller that had disabled the collector itself keeps it disabled.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collect_after() -> Iterator[None]:
    """Run the block with automatic collection paused, then collect once (also when the block raises)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()
