"""Capacity: idle GPUs per node, and whether pending work fits them.

Input: one tick's ``Observations`` (Slurm's nodes and jobs); per-node free GPU counts and a job's per-node
pieces. Output: idle GPUs per in-service node (``idle_gpus``), a job's whole-node pieces (``node_pieces``),
best fit of pieces into free GPUs (``best_fit``, ``place``). Premium widening, reclaim, gang widening and keep
open read them.

The idle count is a fact of the tick's observations (``Observations.idle``, core/observe.py): counted once
however many stages of the tick ask.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_fleetyield.core.model import JobView, Observations
from slurm_fleetyield.core.observe import out_of_service

__all__ = ["best_fit", "best_fit_hist", "idle_gpus", "node_pieces", "out_of_service", "place"]


def idle_gpus(obs: Observations) -> dict[str, int]:
    """Idle GPUs per in-service node (``Observations.idle``, counted once a tick), as a copy to change."""
    return dict(obs.idle)


def node_pieces(j: JobView, max_node: int) -> list[int]:
    """Per-node pieces of a pending job (its nodes are not chosen yet): whole nodes of ``max_node`` GPUs."""
    if max_node <= 0 or j.gpus <= max_node:
        return [j.gpus]
    full, rest = divmod(j.gpus, max_node)
    return [max_node] * full + ([rest] if rest else [])


def place(chunks: list[int], free: Mapping[str, int], lent: frozenset[str]) -> dict[str, int] | None:
    """All-or-nothing best fit of one job's per-node ``chunks`` (largest first): each on the node with the
    fewest free GPUs that holds it, unlent nodes before lent ones, then by name. None: some chunk fits
    nowhere. A whole-node chunk empties its node, so a gang's chunks land on distinct nodes."""
    left = dict(free)
    used: dict[str, int] = {}
    for c in sorted(chunks, reverse=True):
        best = min(((n in lent, f, n) for n, f in left.items() if f >= c), default=None)
        if best is None:
            return None
        n = best[2]
        left[n] -= c
        used[n] = used.get(n, 0) + c
    return used


def best_fit(chunks: list[int], free: list[int]) -> list[int]:
    """Best fit of ``chunks`` (largest first) into per-node ``free`` GPUs; returns the chunks that fit
    nowhere. A histogram of free counts keeps this O(chunks x GPUs per node)."""
    if not chunks:
        return []
    hist: dict[int, int] = {}
    for f in free:
        if f > 0:
            hist[f] = hist.get(f, 0) + 1
    return best_fit_hist(chunks, hist)


def best_fit_hist(chunks: list[int], hist: dict[int, int]) -> list[int]:
    """``best_fit`` over ``hist`` (free count > 0 -> nodes with that many free, every count > 0), which it
    uses up."""
    if not chunks:
        return []
    if not hist:
        return list(chunks)
    top = max(hist)  # the largest free count left (hist[top] > 0 while top > 0)
    unfit: list[int] = []
    for i, c in enumerate(chunks):
        if c > top:
            unfit.append(c)
            continue
        k = c
        while not hist.get(k):  # the smallest free count that takes c (ends at top at the latest)
            k += 1
        left = hist[k] - 1
        hist[k] = left
        if k - c > 0:
            hist[k - c] = hist.get(k - c, 0) + 1
        if not left and k == top:
            top = max((f for f, m in hist.items() if m > 0), default=0)
            if not top:  # nothing free anywhere: the rest fits nowhere
                unfit.extend(chunks[i + 1 :])
                break
    return unfit
