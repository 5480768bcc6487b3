"""gcpolicy.collect_after: automatic collection paused inside the block, one full collection after it."""

from __future__ import annotations

import gc
import itertools
from collections.abc import Iterator

import pytest

from slurm_fleetyield.gcpolicy import collect_after


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """The generations of the collections that start while the test runs."""
    seen: list[int] = []

    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(cb)
    was = gc.isenabled()
    gc.enable()
    try:
        yield seen
    finally:
        gc.callbacks.remove(cb)
        (gc.enable if was else gc.disable)()


def test_the_block_runs_paused_and_one_full_collection_follows(full_collections: list[int]) -> None:
    with collect_after():
        inside = gc.isenabled()
        junk = [[] for _ in range(50_000)]  # would trigger generation-0 collections if enabled
        for a, b in itertools.pairwise(junk):
            a.append(b)
            b.append(a)  # cycles: only the collector frees them
        del junk, a, b
        during = list(full_collections)
    assert inside is False and during == []
    assert gc.isenabled() and full_collections == [2]


def test_a_failing_block_still_reenables_and_collects(full_collections: list[int]) -> None:
    with pytest.raises(RuntimeError, match="tick failed"), collect_after():
        raise RuntimeError("tick failed")
    assert gc.isenabled() and full_collections == [2]


def test_a_caller_that_disabled_the_collector_keeps_it_disabled(full_collections: list[int]) -> None:
    gc.disable()
    with collect_after():
        pass
    assert not gc.isenabled() and full_collections == [2]
