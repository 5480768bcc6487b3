"""core/history.py: a GPU track's point at one ring time is what expanding the whole ring gives there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from slurm_fleetyield.core.history import GpuTrack


@given(
    changes=st.lists(st.booleans(), min_size=1, max_size=40),
    lead=st.integers(min_value=0, max_value=5),
)
def test_point_at_is_the_expanded_ring_at_that_time(changes: list[bool], lead: int) -> None:
    """A ring of node times (every 30 s); the GPU's stored point changes where ``changes`` says; its track
    starts ``lead`` ring times after the node's first (a GPU that appeared later)."""
    node_times = tuple(1_000.0 + 30.0 * i for i in range(len(changes) + lead))
    steps: list[tuple[float, tuple[float | None, ...]]] = []
    value = 0.0
    for t, changed in zip(node_times[lead:], changes, strict=True):
        if changed:
            value += 1.0
        if not steps or steps[-1][1] != (value, None):
            steps.append((t, (value, None)))
    track = GpuTrack((value, None), (value, None), tuple(t for t, _ in steps), tuple(p for _, p in steps))
    ring = track.ring(node_times)
    assert [track.point_at(t) for t in ring] == list(track.points(ring))
