"""Quarantine: fatal evidence in, drains (or holds) out.

Input: pushed ``FatalEvent``s, the sensed nodes (quarantine XIDs whose scrape totals grew, missing GPUs),
the Slurm view, state (processed event ids, recent drains) and ``QuarantineParams``. Output: ``find_fatal``
(core/evidence.py) returns the fatal findings of this tick; ``decide`` turns them into ``DrainNode``
actions, at most once per node, or into ``Hold``s when a safety rule forbids the drain.

Safety rules, in the order they are checked:
- a node unknown to Slurm, or whose Slurm state is unknown, is never drained (held: ``slurm_state_unknown``);
- a node drained by someone else is left alone; one already drained by us is not drained again;
- ``drain_cap``: FleetYield never holds more than ``drain_cap_fraction`` of the fleet out of service: every
  node Slurm shows drained by us, whatever its lifecycle stage (RETIRED and NEEDS_HUMAN included: a parked
  node is capacity FleetYield took), the nodes it resumed for canaries only (``owned``: out of normal
  service though not drained), plus the new drains of this tick;
- ``drain_rate``: at most ``max_new_drains_per_window`` new drains per ``window_s``.
Evidence must be fresh: scrape findings only come from fresh, successful samples (sense never derives them
from stale data); a pushed event is fresh evidence by itself and drains even when the node's scrape is stale.
Held findings are not marked processed and are kept in ``ControllerState.held_fatal`` (the shell hands a
pushed event in once; an XID shows as *new* in one scrape only), so ``find_fatal`` brings them back every
tick until the cap allows the drain or the node is moot (drained, unknown to Slurm), for at most
``held_evidence_max_age_s``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.evidence import (
    AGENT_MARKER_KINDS,
    ATTESTATION_FAILED,
    MAX_REASON_LEN,
    MISSING_KEY_PREFIX,
    PUSHED_FATAL_KINDS,
    PUSHED_XID_PREFIX,
    RECOVERY_KINDS,
    XID_TEXT,
    Fatal,
    Processed,
    _most_specific,
    expired_held,
    find_fatal,
    held_finding,
    processed,
    pushed_marker,
    to_held,
)
from slurm_fleetyield.core.model import (
    HOLDING_STATES,
    JobView,
    LogEvent,
    Observations,
    SlurmNode,
)
from slurm_fleetyield.core.params import QuarantineParams
from slurm_fleetyield.core.plan import DrainNode, Hold
from slurm_fleetyield.core.state import ControllerState

__all__ = [
    "AGENT_MARKER_KINDS",
    "ATTESTATION_FAILED",
    "MAX_REASON_LEN",
    "MISSING_KEY_PREFIX",
    "PUSHED_FATAL_KINDS",
    "PUSHED_XID_PREFIX",
    "XID_TEXT",
    "DrainBudget",
    "Drains",
    "Fatal",
    "Processed",
    "decide",
    "expired_held",
    "faulted_gpus",
    "find_fatal",
    "held_finding",
    "processed",
    "pushed_marker",
    "to_held",
]


@dataclass(frozen=True, slots=True)
class Drains:
    drains: tuple[DrainNode, ...] = ()
    holds: tuple[Hold, ...] = ()
    draining: frozenset[str] = frozenset()  # nodes drained by this tick's plan
    held: Mapping[str, Hold] = field(default_factory=dict)  # node -> the hold withholding its drain
    fenced: frozenset[str] = frozenset()  # held nodes whose agent's fatal marker refuses jobs: no fy_ok_*
    processed: tuple[Fatal, ...] = ()  # findings acted on (drained, or moot): remembered, never redone
    events: tuple[LogEvent, ...] = ()
    cap: DrainBudget | None = None  # what is left of the caps after these drains (approved drains use it)


@dataclass
class DrainBudget:
    """The drain caps as a budget shared by every new drain of a tick (fatal first, then approved)."""

    cap_nodes: int
    drained: int  # nodes FleetYield holds out of service (drained by us, canary-only) plus this tick's drains
    in_window: int  # drains in the rate window plus this tick's new drains
    qp: QuarantineParams

    def blocked(self, slurm: SlurmNode) -> tuple[str, str]:
        return _blocked(slurm, self.drained, self.cap_nodes, self.in_window, self.qp)

    def take(self) -> None:
        self.drained += 1
        self.in_window += 1


def decide(
    fatal: tuple[Fatal, ...],
    obs: Observations,
    state: ControllerState,
    qp: QuarantineParams,
    now: float,
    owned: frozenset[str] = frozenset(),
) -> Drains:
    """``owned``: nodes FleetYield holds out of normal service besides its drains (the lifecycle's canary
    nodes); those Slurm does not show drained by us count against the cap too."""
    by_node: dict[str, list[Fatal]] = {}
    for f in fatal:
        by_node.setdefault(f.node, []).append(f)
    fleet = len(obs.slurm)
    cap_nodes = max(qp.drain_cap_min_nodes, math.floor(qp.drain_cap_fraction * fleet))
    drained_by_us = sum(1 for n in obs.slurm.values() if n.reason and n.drained_by_us)  # most have no reason
    # nodes held out of service (canary) that Slurm does not show drained by us: they count too
    held_undrained = frozenset(
        n for n in owned if (s := obs.slurm.get(n)) is not None and not s.drained_by_us
    )
    drained_by_us += len(held_undrained)
    recent = sum(1 for t in state.drain_times if t > now - qp.window_s)
    drains: list[DrainNode] = []
    holds: dict[str, Hold] = {}
    fenced: set[str] = set()
    processed: list[Fatal] = []
    events: list[LogEvent] = list(expired_held(state, now, qp)) if state.held_fatal else []
    for name, findings in by_node.items():  # already in (time, node) order: oldest evidence first
        first = _most_specific(findings)
        slurm = obs.slurm.get(name)
        data = {"keys": [f.key for f in findings], "reason": first.reason}
        if slurm is None:
            events.append(
                LogEvent(now, name, "fatal_unknown_node", "fatal event for a node Slurm does not know", data)
            )
            processed.extend(findings)
            continue
        if slurm.drained_by_other:
            events.append(
                LogEvent(now, name, "fatal_left_alone", f"drained by someone else: {slurm.reason}", data)
            )
            processed.extend(findings)
            continue
        if slurm.drained_by_us:
            processed.extend(findings)  # already quarantined: remember the evidence, nothing to do
            continue
        # a node FleetYield already holds (in canary) is counted already: draining it takes no more room
        counted = drained_by_us + len(drains) - (name in held_undrained)
        rule, detail = _blocked(slurm, counted, cap_nodes, recent + len(drains), qp)
        if rule:
            hold = Hold(name, "drain", rule, f"{first.reason}: {detail}")
            holds[name] = hold
            if qp.fence_held_agent_evidence and any(_agent_marked(f) for f in findings):
                fenced.add(name)
            events.append(
                LogEvent(now, name, "hold", f"drain held by {rule}: {detail}", {**data, "rule": rule})
            )
            continue
        gpus = None if qp.requeue_whole_node else faulted_gpus(findings)
        drains.append(
            DrainNode(name, first.reason, _requeue(obs.job_index.holding, name, gpus), cause="fatal")
        )
        processed.extend(findings)
        events.append(LogEvent(now, name, "drain", first.reason, data))
    return Drains(
        tuple(drains),
        tuple(holds.values()),
        frozenset(d.node for d in drains),
        holds,
        frozenset(fenced),
        tuple(processed),
        tuple(events),
        DrainBudget(cap_nodes, drained_by_us + len(drains), recent + len(drains), qp),
    )


def _agent_marked(f: Fatal) -> bool:
    """Evidence the node's own agent pushed and keeps in its fatal marker (the Prolog refuses jobs on it)."""
    return f.source == "push" and f.kind in AGENT_MARKER_KINDS


def _blocked(
    slurm: SlurmNode, drained: int, cap_nodes: int, in_window: int, qp: QuarantineParams
) -> tuple[str, str]:
    if not slurm.states or "UNKNOWN" in slurm.states:
        return "slurm_state_unknown", f"Slurm state {'+'.join(sorted(slurm.states)) or 'absent'}"
    if drained + 1 > cap_nodes:
        return (
            "drain_cap",
            f"{drained} nodes already drained by FleetYield, "
            f"cap {cap_nodes} ({qp.drain_cap_fraction:g} of fleet)",
        )
    if in_window + 1 > qp.max_new_drains_per_window:
        return (
            "drain_rate",
            f"{in_window} drains in the last {qp.window_s:g}s, max {qp.max_new_drains_per_window}",
        )
    return "", ""


def faulted_gpus(findings: list[Fatal]) -> frozenset[int] | None:
    """The GPUs this node's evidence names, or None when any of it is node-wide (no GPU index: an
    Alertmanager alert, a failed check or attestation, or GPUs missing from a scrape's count that the
    indexed evidence does not explain; the agent pushes a missing GPU with its index). An XID 79 and its
    GPU vanishing from the scrape arrive together: a count of missing GPUs no larger than the GPUs the
    indexed evidence names is those GPUs (which ones are gone is not in the count)."""
    gpus = {f.gpu for f in findings if f.kind in _GPU_KINDS and f.gpu is not None}
    for f in findings:
        if f.kind in _GPU_KINDS and f.gpu is not None:
            continue  # an XID, or a GPU the agent itself reports gone (pushed with its index)
        if f.kind == "gpu_missing" and gpus and _missing_count(f) <= len(gpus):
            continue
        return None
    return frozenset(gpus)


_GPU_KINDS = frozenset({"xid", "gpu_missing", *RECOVERY_KINDS})


def _missing_count(f: Fatal) -> int:
    """GPUs missing per a gpu_missing key (``missing:<node>:<seen>/<expected>``); huge if unreadable."""
    try:
        seen, expected = f.key.rsplit(":", 1)[1].split("/")
        return int(expected) - int(seen)
    except (IndexError, ValueError):
        return 1 << 30


def _requeue(jobs: tuple[JobView, ...], node: str, gpus: frozenset[int] | None = None) -> tuple[int, ...]:
    """Running jobs on the node that allow requeue -- with ``gpus``, only those holding one of them (or whose
    GPUs Slurm did not say); the others are left to finish (drain lets them; remediation waits for them).

    Not COMPLETING ones: their processes have exited and only Slurm's cleanup (the Epilog) runs; requeueing
    would run finished work again -- e.g. the job whose Epilog hand-over just reported a failed attestation.
    """
    return tuple(
        sorted(
            j.job_id
            for j in jobs
            if j.requeue
            and j.state in HOLDING_STATES
            and j.state != "COMPLETING"
            and node in j.nodes
            and (gpus is None or j.holds_gpu(node, gpus))
        )
    )
