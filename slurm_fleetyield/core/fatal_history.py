"""Fatal history: a node's past fatal failures within ``risk.fatal_history_days``, and how they fade.

Input: ``ControllerState`` (per-node fatal history), ``Params``, ``now``. Output: the (time, GPU uuid)
events in the window and the single-fault decay factor 2^(-age / single_fault_half_life_days) (Titan: the
excess hazard after a return fades; two or more failures keep the full weight).
"""

from __future__ import annotations

from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState


def fatal_uuids(state: ControllerState, node: str, params: Params, now: float) -> list[str]:
    """GPU uuids ("" for node-wide) of the node's distinct fatal events within ``fatal_history_days``
    (``fatal_events`` without the times)."""
    return [u for _, u in fatal_events(state, node, params, now)]


def history_decay(events: list[tuple[float, str]], params: Params, now: float) -> float:
    """Scale of the repeat-offender contributions: 2^(-age / single_fault_half_life_days) when ``events``
    (``fatal_events``) is one isolated failure, else 1 (none, or a repeat offender: full weights).

    Titan (Ostrouchov et al., SC '20; olcf/TitanGPULife gc_full.csv): after a GPU's return to service
    following its first fatal event (in place or re-inserted), the hazard of a second one relative to
    never-failed GPUs fits exp(5.78 x 2^(-t / 80 d)): x342 in the first week, x106 in days 7-30, x48 in days
    30-90, x4.0 beyond (``sim/calibrate.post_failure_hazard``). The age is taken in whole
    ``single_fault_decay_step_hours`` steps, so the value is constant between steps."""
    half_life = params.risk.single_fault_half_life_days
    if half_life is None or len(events) != 1:
        return 1.0
    age = max(0.0, now - events[0][0])
    step = params.risk.single_fault_decay_step_hours * 3_600.0
    if step > 0:
        age -= age % step
    return 2.0 ** (-age / (half_life * 86_400.0))


def fatal_events(state: ControllerState, node: str, params: Params, now: float) -> list[tuple[float, str]]:
    """(time, GPU uuid or "" for node-wide) of the node's distinct fatal events within ``fatal_history_days``.

    One fault reaches the history through several reports: an XID 79 arrives as the pushed XID, the pushed
    'GPU missing' of the same GPU and the scrape's unnamed 'GPU missing'. The repeat-offender signals count
    failures (Titan: a GPU that had already failed), so reports closer than ``learn.lemon_dedup_s`` (the
    project's "one failure" window, as for lemons) are one: a GPU's repeats within it are dropped, and an
    unnamed report within it of any other report is that report's twin."""
    memory = state.nodes.get(node)
    if memory is None or not memory.fatal_history:
        return []
    start = now - params.risk.fatal_history_days * 86_400.0
    return _fatal_events(memory.fatal_history, start, params.learn.lemon_dedup_s)


def _fatal_events(
    history: tuple[tuple[float, str], ...], start: float, dedup: float
) -> list[tuple[float, str]]:
    hist = sorted(h for h in history if h[0] >= start)
    if len(hist) < 2:
        return hist
    named = [t for t, u in hist if u]
    last: dict[str, float] = {}
    out: list[tuple[float, str]] = []
    for t, u in hist:
        if u in last and t - last[u] <= dedup:
            continue
        if not u and any(abs(t - x) <= dedup for x in named):
            continue
        last[u] = t
        out.append((t, u))
    return out
