"""Settle: the ledger of finished jobs, the measure FleetYield is judged by (net goodput = useful - wasted).

Input: this tick's ``JobOutcome``s (each delivered once by the shell; a job id already settled is ignored),
the pending jobs of ``Observations`` (to record when premium-needing work waited), the previous state (fatal
history, lifecycle, tiers, the record of pending intervals) and ``SettleParams``. Output: one ``LedgerEntry``
per newly settled job and the next ``SettleMemory``. Pure accounting: nothing here changes a decision.

Per job (GPU-seconds = job GPUs x seconds):
- completed: all of the run is useful;
- lost to hardware (NODE_FAIL; or a fatal event on one of its nodes between its start and
  ``fatal_slack_s`` after its end; or one of its nodes quarantined by us during the run, e.g. an approved
  drain requeued it): useful up to its last checkpoint, the rest wasted (the whole run without a checkpoint);
- requeued by premium reclaim (core/reclaim.py; the requeue recorded in ``ControllerState.reclaim``, at or
  before the attempt's end): useful up to its last checkpoint, the rest wasted -- FleetYield's own cost --
  and no failure, whatever fault follows within ``fatal_slack_s``;
- any other end (application failure, timeout, cancel): useful up to the last checkpoint, nothing counted as
  wasted by hardware (``failure`` says whether the job failed);
- premium misuse: a job not of a premium-needing class on premium GPUs, for the part of its run during which
  premium-needing work was pending (intervals recorded at tick resolution).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from slurm_fleetyield.core.lifecycle import LifecycleMemory, Stage
from slurm_fleetyield.core.model import JobOutcome, LedgerEntry, Observations
from slurm_fleetyield.core.params import SettleParams
from slurm_fleetyield.core.state import ControllerState, SettleMemory

FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT", "BOOT_FAIL", "DEADLINE"})


def settle(
    obs: Observations,
    mem: SettleMemory,
    state: ControllerState,
    lifecycle: Mapping[str, LifecycleMemory],
    sp: SettleParams,
    now: float,
) -> tuple[tuple[LedgerEntry, ...], SettleMemory]:
    """``state``: the remembered state of this tick (its fatal history includes this tick's evidence);
    ``lifecycle``: this tick's lifecycle memories."""
    pending = _track_pending(mem.pending, obs, sp, now)
    if not obs.outcomes:
        return (), SettleMemory(mem.settled, pending) if pending != mem.pending else mem
    state = replace(state, lifecycle=lifecycle)
    done = set(mem.settled)
    settled = list(mem.settled)
    entries = []
    for o in obs.outcomes:
        if o.job_id in done:
            continue
        done.add(o.job_id)
        settled.append(o.job_id)
        entries.append(settle_job(o, state, pending, sp))
    return tuple(entries), SettleMemory(tuple(settled[-sp.max_settled_ids :]), pending)


def settle_job(
    o: JobOutcome,
    state: ControllerState,
    pending: tuple[tuple[float, float | None], ...],
    sp: SettleParams,
) -> LedgerEntry:
    run = max(0.0, o.end - o.start)
    total = o.gpus * run
    ckpt = (
        o.last_checkpoint if o.last_checkpoint is not None and o.start <= o.last_checkpoint <= o.end else None
    )
    saved = o.gpus * (ckpt - o.start) if ckpt is not None else 0.0
    cause = _hardware_cause(o, state, sp)
    if o.state != "COMPLETED" and _reclaimed(o, state):
        useful, wasted, failure, cause = saved, total - saved, False, "reclaimed"
    elif o.state == "COMPLETED" and not cause:
        useful, wasted, failure, cause = total, 0.0, False, "completed"
    elif cause:
        useful, wasted, failure = saved, total - saved, True
    else:
        useful, wasted = saved, 0.0
        failure = o.state in FAILED_STATES
        cause = {"TIMEOUT": "timeout", "CANCELLED": "cancelled"}.get(o.state, "job")
    misuse = 0.0
    if _premium(o, state) and o.workload is not None and o.workload.value not in sp.premium_needing_classes:
        misuse = o.gpus * _overlap(o.start, o.end, pending)
    return LedgerEntry(
        o.job_id,
        o.workload,
        o.node_list,
        o.gpus,
        o.start,
        o.end,
        o.state,
        useful,
        wasted,
        misuse,
        failure,
        _tier_at(o, state),
        cause,
    )


def _hardware_cause(o: JobOutcome, state: ControllerState, sp: SettleParams) -> str:
    if o.state == "COMPLETED":
        return ""
    if o.state == "NODE_FAIL":
        return "node_fail"
    for n in o.node_list:
        m = state.nodes.get(n)
        if m is not None and any(o.start <= t <= o.end + sp.fatal_slack_s for t in m.fatal_times):
            return "hardware"
    for n in o.node_list:
        lc = state.lifecycle.get(n)
        if (
            lc is not None
            and lc.stage is not Stage.IN_SERVICE
            and o.start <= lc.since <= o.end + sp.fatal_slack_s
        ):
            return "drain"
    return ""


REQUEUE_LAG_S = 10.0  # from the controller's decision to the attempt's end in sacct (seconds at most)


def _reclaimed(o: JobOutcome, state: ControllerState) -> bool:
    """Did premium reclaim requeue this attempt: a requeue decided during the run, the attempt ending at most
    ``REQUEUE_LAG_S`` later (sacct keeps whole seconds: one second earlier counts too)?"""
    for j, t in state.reclaim.requeued:
        if j == o.job_id and o.start <= t and t - 1.0 <= o.end <= t + REQUEUE_LAG_S:
            return True
    return False


def _premium(o: JobOutcome, state: ControllerState) -> bool:
    if o.premium is not None:
        return o.premium
    for n in o.node_list:
        m = state.nodes.get(n)
        if m is not None and "fy_premium" in m.fy_features:
            return True
    return False


def _tier_at(o: JobOutcome, state: ControllerState) -> str:
    """The first node's tier when the job started, if the remembered tier was already in force then."""
    m = state.nodes.get(o.node_list[0]) if o.node_list else None
    if m is None or m.since > o.start:
        return "unknown"
    return m.tier.value


def _overlap(start: float, end: float, intervals: tuple[tuple[float, float | None], ...]) -> float:
    total = 0.0
    for a, b in intervals:
        hi = min(end, b if b is not None else end)
        lo = max(start, a)
        if hi > lo:
            total += hi - lo
    return total


def _track_pending(
    intervals: tuple[tuple[float, float | None], ...], obs: Observations, sp: SettleParams, now: float
) -> tuple[tuple[float, float | None], ...]:
    classes = sp.premium_needing_classes
    waiting = any(w is not None and w.value in classes for w in obs.job_index.pending_by)
    open_ = bool(intervals) and intervals[-1][1] is None
    out = intervals
    if waiting and not open_:
        out = (*intervals, (now, None))
    elif not waiting and open_:
        out = (*intervals[:-1], (intervals[-1][0], now))
    horizon = now - sp.pending_memory_s
    if out and out[0][1] is not None and out[0][1] < horizon:
        out = tuple(iv for iv in out if iv[1] is None or iv[1] >= horizon)
    return out[-sp.max_pending_intervals :]


def totals(entries: tuple[LedgerEntry, ...]) -> Mapping[str, float]:
    """Sums over entries (useful, wasted, net goodput, premium misuse), for reports and tests."""
    useful = sum(e.useful_gpu_s for e in entries)
    wasted = sum(e.wasted_gpu_s for e in entries)
    return {
        "useful_gpu_s": useful,
        "wasted_gpu_s": wasted,
        "net_goodput_gpu_s": useful - wasted,
        "premium_misuse_gpu_s": sum(e.premium_misuse_gpu_s for e in entries),
    }
