"""Capacity: idle GPUs per node, and whether pending work fits them.

Input: one tick's ``Observations`` (Slurm's nodes and jobs); per-node free GPU counts and a job's per-node
pieces. Output: idle GPUs per in-service node (``idle_gpus``), a job's whole-node pieces (``node_pieces``),
best fit of pieces into free GPUs (``best_fit``, ``place``). Premium widening, reclaim, gang widening and keep
open read them.

``idle_gpus`` keeps its last answer with the very ``Observations`` it was counted from (``_IDLE``), so the
several stages of one tick that ask do not count again (the answer for that object cannot change while a
tick reads it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slurm_fleetyield.core.model import JobView, Observations, SlurmNode

_RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
_OUT = frozenset(
    {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN"}
)


_IDLE: list[tuple[Observations, dict[str, int]]] = []  # the last answer and its Observations (held)


def idle_gpus(obs: Observations) -> dict[str, int]:
    """Idle GPUs per schedulable node: IDLE -> all, ALLOCATED -> none, else Gres minus running jobs' share.

    ``JobView.gpus`` is the job's total; a multi-node job uses gpus / len(nodes) on each of its nodes (the
    running jobs are read only when some node is neither IDLE nor ALLOCATED). Several stages ask within one
    tick: the answer for the very same ``Observations`` (one per tick, unchanged while it runs) is counted
    once and handed out as a copy."""
    if _IDLE and _IDLE[0][0] is obs:
        return dict(_IDLE[0][1])
    out = _idle_gpus(obs)
    _IDLE[:] = [(obs, out)]
    return dict(out)


def _idle_gpus(obs: Observations) -> dict[str, int]:
    slurm = obs.slurm
    base, partly = _idle_base(slurm)
    out = dict(base)
    if partly:
        used: dict[str, float] = {}
        for j in obs.job_index.holding:
            if j.state in _RUNNING and j.nodes and j.gpus > 0:
                share = j.gpus / len(j.nodes)
                for n in j.nodes:
                    used[n] = used.get(n, 0.0) + share
        for name in partly:
            out[name] = max(0, slurm[name].gpu_count - math.ceil(used.get(name, 0.0) - 1e-9))
    return out


def _idle_base(slurm: Mapping[str, SlurmNode]) -> tuple[dict[str, int], frozenset[str]]:
    """Per in-service node, in Slurm's order: its Gres count when IDLE, else 0; and the nodes neither IDLE
    nor ALLOCATED (their idle GPUs depend on the running jobs)."""
    base: dict[str, int] = {}
    partly: set[str] = set()
    for name, s in slurm.items():
        kind = _idle_kind(s)
        if kind is not None:
            base[name] = kind[0]
            if kind[1]:
                partly.add(name)
    return base, frozenset(partly)


def _idle_kind(s: SlurmNode) -> tuple[int, bool] | None:
    """An in-service node's idle GPUs as far as its state tells (IDLE: all, else 0) and whether it is partly
    allocated (neither IDLE nor ALLOCATED: the running jobs tell the rest); None: out of service."""
    if out_of_service(s):
        return None
    if "IDLE" in s.states:
        return s.gpu_count, False
    return 0, "ALLOCATED" not in s.states


def out_of_service(s: SlurmNode) -> bool:
    return not s.states or not _OUT.isdisjoint(s.states)


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
