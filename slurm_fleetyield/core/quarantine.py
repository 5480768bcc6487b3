"""Quarantine: fatal evidence in, drains (or holds) out.

Input: pushed ``FatalEvent``s, the sensed nodes (quarantine XIDs whose scrape totals grew, missing GPUs),
the Slurm view, state (processed event ids, recent drains) and ``QuarantineParams``. Output: ``find_fatal``
returns the fatal findings of this tick; ``decide`` turns them into ``DrainNode`` actions, at most once per
node, or into ``Hold``s when a safety rule forbids the drain.

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

from slurm_fleetyield.core.model import (
    HOLDING_STATES,
    OUR_REASON_PREFIX,
    FatalEvent,
    JobView,
    LogEvent,
    Observations,
    SlurmNode,
    job_index,
)
from slurm_fleetyield.core.params import QuarantineParams
from slurm_fleetyield.core.plan import DrainNode, Hold
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.state import ControllerState

XID_TEXT: Mapping[int, str] = {
    48: "double-bit ECC error",
    64: "row remap or page retirement failure",
    74: "NVLink error",
    79: "fell off the bus",
    95: "uncontained ECC error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""Human text of the drain reason per XID (NVIDIA Xid catalog mnemonics, shortened for Slurm's Reason)."""

PUSHED_FATAL_KINDS = frozenset({"alert", "check_failed", "attestation_failed"})  # fatal by definition
AGENT_MARKER_KINDS = frozenset({"xid", "gpu_missing", "check_failed"})
"""Kinds of pushed evidence that the node's own agent also writes to its fatal marker
(``node_agent/fatal.py``), which the FleetYield Prolog honours by refusing every job on the node."""
ATTESTATION_FAILED = "attestation_failed"
"""Kind of the events the daemon makes from failed attestation verdicts; ``message`` names the records."""
MISSING_KEY_PREFIX = "missing:"
PUSHED_XID_PREFIX = "pushed:"
"""Processed-evidence marker of a pushed XID, ``pushed:<node>:<gpu>:<xid>:<time>``: the same XID growing in
a later scrape is that event seen again, not new evidence (else a node resumed right after the drain is
drained a second time for the fault already acted on)."""
MAX_REASON_LEN = 120


@dataclass(frozen=True, slots=True)
class Fatal:
    """One piece of fatal evidence about a node. ``key`` makes it idempotent across ticks."""

    node: str
    time: float
    kind: str  # xid | gpu_missing | alert | check_failed | attestation_failed
    key: str
    source: str  # push | scrape
    gpu: int | None = None
    uuid: str | None = None
    xid: int | None = None
    message: str = ""

    @property
    def reason(self) -> str:
        if self.kind == "xid" and self.xid is not None:
            gpu = f" gpu {self.gpu}" if self.gpu is not None else ""
            text = f"{OUR_REASON_PREFIX} XID {self.xid}{gpu} {XID_TEXT.get(self.xid, 'fatal XID')}"
        elif self.kind == "gpu_missing":
            text = f"{OUR_REASON_PREFIX} GPU missing ({self.message})"
        elif self.kind == ATTESTATION_FAILED:
            text = f"{OUR_REASON_PREFIX} attestation failed ({self.message or 'no reason given'})"
        else:
            text = f"{OUR_REASON_PREFIX} {self.kind} {self.message}".rstrip()
        return text[:MAX_REASON_LEN]


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


@dataclass(frozen=True, slots=True)
class Processed:
    """``ControllerState.processed_events`` indexed: the ids as a set, the pushed-XID markers by (node, GPU,
    XID) -> newest time, and whether a 'GPU missing' key is among them."""

    done: frozenset[str]
    pushed: Mapping[tuple[str, int, int], float]
    has_missing: bool


def processed(state: ControllerState) -> Processed:
    """The index of ``state.processed_events``, kept in ``state.memo`` while the tuple is the same object
    (``memory.remember`` hands on the very tuple when no id was added or dropped: most ticks)."""
    memo = state.memo.setdefault("processed", {})
    ids = state.processed_events
    hit = memo.get("index")
    if hit is not None and hit[0] is ids:
        return hit[1]
    done = frozenset(ids)
    index = Processed(done, _pushed_xids(done), any(k.startswith(MISSING_KEY_PREFIX) for k in ids))
    memo["index"] = (ids, index)
    return index


def find_fatal(
    obs: Observations, sensed: Sensed, state: ControllerState, qp: QuarantineParams
) -> tuple[Fatal, ...]:
    index = processed(state)
    done = index.done
    qxids = frozenset(qp.quarantine_xids)
    pushed = index.pushed
    out: list[Fatal] = []
    for ev in obs.fatal_events:
        if ev.event_id in done:
            continue
        fatal = (
            (ev.kind == "xid" and ev.xid in qxids)
            or (ev.kind == "gpu_missing" and qp.gpu_missing_quarantines)
            or ev.kind in PUSHED_FATAL_KINDS
        )
        if fatal:
            out.append(
                Fatal(ev.node, ev.time, ev.kind, ev.event_id, "push", ev.gpu, ev.uuid, ev.xid, ev.message)
            )
    nodes = sensed.nodes
    for name in sensed.flagged if sensed.flagged is not None else nodes:
        node = nodes[name]
        if not node.fresh:
            continue  # never act on stale or missing data
        sample_time = sensed.sample_time(name)
        for g in node.gpus:
            for xid, count in g.new_xids:
                if xid in qxids:
                    r = g.reading
                    key = f"scrape:{name}:{r.uuid}:xid{xid}:{sample_time!r}"
                    t_push = pushed.get((name, r.index, xid))
                    seen_pushed = t_push is not None and 0.0 <= (sample_time or 0.0) - t_push <= qp.window_s
                    if key not in done and not seen_pushed:
                        msg = f"{count:g} new in scrape"
                        out.append(
                            Fatal(name, sample_time or 0.0, "xid", key, "scrape", r.index, r.uuid, xid, msg)
                        )
        if qp.gpu_missing_quarantines and node.missing_gpus:
            seen, expected = len(node.gpus), node.expected_gpus
            key = f"{MISSING_KEY_PREFIX}{name}:{seen}/{expected}"
            if key not in done:
                msg = f"{seen} of {expected} visible"
                out.append(Fatal(name, sample_time or 0.0, "gpu_missing", key, "scrape", message=msg))
    if state.held_fatal:
        found = {f.key for f in out}
        for ev in state.held_fatal:
            if ev.event_id in done or ev.event_id in found or _too_old(ev, obs.time, qp):
                continue
            out.append(held_finding(ev))
    return tuple(sorted(out, key=lambda f: (f.time, f.node, f.key)))


def held_finding(ev: FatalEvent) -> Fatal:
    """A finding kept in ``ControllerState.held_fatal``, as ``find_fatal`` found it."""
    return Fatal(ev.node, ev.time, ev.kind, ev.event_id, ev.source, ev.gpu, ev.uuid, ev.xid, ev.message)


def to_held(findings: tuple[Fatal, ...], held: Mapping[str, object], limit: int) -> tuple[FatalEvent, ...]:
    """The findings of nodes whose drain was held this tick, as remembered in the state (newest ``limit``)."""
    kept = [
        FatalEvent(f.key, f.node, f.time, f.kind, f.gpu, f.uuid, f.xid, f.message, f.source)
        for f in findings
        if f.node in held
    ]
    return tuple(kept[-limit:])


def expired_held(state: ControllerState, now: float, qp: QuarantineParams) -> tuple[LogEvent, ...]:
    """A log line for each held finding dropped this tick for age: its node still needs a human's look."""
    done = processed(state).done
    return tuple(
        LogEvent(
            now,
            ev.node,
            "held_evidence_expired",
            f"fatal evidence held for over {qp.held_evidence_max_age_s:g}s dropped without a drain: "
            f"{held_finding(ev).reason}",
            {"key": ev.event_id},
        )
        for ev in state.held_fatal
        if ev.event_id not in done and _too_old(ev, now, qp)
    )


def _too_old(ev: FatalEvent, now: float, qp: QuarantineParams) -> bool:
    """Held evidence past ``held_evidence_max_age_s``: ``find_fatal`` drops it, ``decide`` logs it once."""
    return now - ev.time > qp.held_evidence_max_age_s


def pushed_marker(f: Fatal) -> str | None:
    """The marker remembered with a processed pushed XID (see ``PUSHED_XID_PREFIX``)."""
    if f.source != "push" or f.kind != "xid" or f.xid is None or f.gpu is None:
        return None
    return f"{PUSHED_XID_PREFIX}{f.node}:{f.gpu}:{f.xid}:{f.time!r}"


def _pushed_xids(done: frozenset[str]) -> dict[tuple[str, int, int], float]:
    out: dict[tuple[str, int, int], float] = {}
    for k in done:
        if k.startswith(PUSHED_XID_PREFIX):
            node, gpu, xid, t = k[len(PUSHED_XID_PREFIX) :].rsplit(":", 3)
            key = (node, int(gpu), int(xid))
            out[key] = max(out.get(key, float("-inf")), float(t))
    return out


def _most_specific(findings: list[Fatal]) -> Fatal:
    """The finding whose text becomes the drain reason: a named XID over an alert or a failed check over a
    bare 'GPU missing' (an XID 79 push and the GPU vanishing arrive together; the XID says why), then the
    oldest."""

    def rank(f: Fatal) -> int:
        if f.kind == "xid" and f.xid is not None:
            return 0
        return 2 if f.kind == "gpu_missing" else 1

    return min(findings, key=lambda f: (rank(f), f.time, f.key))


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
            DrainNode(name, first.reason, _requeue(job_index(obs.jobs).holding, name, gpus), cause="fatal")
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


_GPU_KINDS = frozenset({"xid", "gpu_missing"})


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
