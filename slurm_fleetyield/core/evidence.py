"""Fatal evidence: what this tick knows of fatal faults, from pushes, scrapes and held findings.

Input: pushed ``FatalEvent``s, the sensed nodes (quarantine XIDs whose scrape totals grew, missing GPUs), the
state's processed event ids and held findings, ``QuarantineParams``. Output: ``find_fatal``'s findings
(``Fatal``), the held evidence kept for the next tick (``to_held``) and the events of evidence too old to
keep (``expired_held``). core/quarantine.py decides the drains.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from slurm_fleetyield.core.model import (
    OUR_REASON_PREFIX,
    FatalEvent,
    LogEvent,
    Observations,
)
from slurm_fleetyield.core.params import QuarantineParams
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.signals import RECOVERY_ACTION
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
RECOVERY_PREFIX = "recovery:"
RECOVERY_ACTIONS: Mapping[int, tuple[str, str]] = {
    # nvmlDeviceGpuRecoveryAction_t (nvml.h) -> (fault class: its ladder, text). 5, RECOVER_IMEX_DOMAIN, asks
    # for a multi-node NVLink domain's recovery, not this node's: risk only. An unknown value is data this
    # version cannot read: risk only, never a drain.
    1: ("recovery_gpu_reset", "GPU reset"),
    2: ("recovery_node_reboot", "node reboot"),
    3: ("recovery_gpu_reset", "drain P2P"),
    4: ("recovery_gpu_reset", "drain and reset"),
    6: ("recovery_gpu_reset", "bus reset"),
    7: ("recovery_node_reboot", "system reboot"),
}
RECOVERY_KINDS = frozenset(k for k, _ in RECOVERY_ACTIONS.values())


@dataclass(frozen=True, slots=True)
class Fatal:
    """One piece of fatal evidence about a node. ``key`` makes it idempotent across ticks."""

    node: str
    time: float
    kind: str  # xid | gpu_missing | recovery_<action> | alert | check_failed | attestation_failed
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
        elif self.kind in RECOVERY_KINDS:
            text = f"{OUR_REASON_PREFIX} GPU {self.gpu} driver requests {self.message}"
        elif self.kind == ATTESTATION_FAILED:
            text = f"{OUR_REASON_PREFIX} attestation failed ({self.message or 'no reason given'})"
        else:
            text = f"{OUR_REASON_PREFIX} {self.kind} {self.message}".rstrip()
        return text[:MAX_REASON_LEN]


@dataclass(frozen=True, slots=True)
class Processed:
    """``ControllerState.processed_events`` indexed: the ids as a set, the pushed-XID markers by (node, GPU,
    XID) -> newest time, and whether a 'GPU missing' key is among them."""

    done: frozenset[str]
    pushed: Mapping[tuple[str, int, int], float]
    has_missing: bool


def processed(state: ControllerState) -> Processed:
    """The index of ``state.processed_events``."""
    return _index(state.processed_events)


@lru_cache(maxsize=2)  # the tuple is handed on as the very object on most ticks (memory.remember)
def _index(ids: tuple[str, ...]) -> Processed:
    done = frozenset(ids)
    return Processed(done, _pushed_xids(done), any(k.startswith(MISSING_KEY_PREFIX) for k in ids))


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
            if qp.recovery_action_quarantines:
                raw = g.reading.fields.get(RECOVERY_ACTION)
                action = int(raw) if raw and math.isfinite(raw) else 0
                known = RECOVERY_ACTIONS.get(action)
                if known is not None:
                    r = g.reading
                    key = f"{RECOVERY_PREFIX}{name}:{r.uuid}:{action}"
                    if key not in done:
                        t = sample_time or 0.0
                        out.append(Fatal(name, t, known[0], key, "scrape", r.index, r.uuid, None, known[1]))
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
