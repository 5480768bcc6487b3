"""What the daemon observes besides nodes, jobs and GPUs: canary results, gate decisions, job outcomes.

Input: the Slurm adapter (sacct/squeue), the gate (``Gatekeeper``), the store (forwarded outcome records and
what earlier ticks already handed over), this tick's Slurm nodes and ``now``. Output: the extra
``Observations`` fields plus ``TickMarks`` (what to record as consumed, committed with the tick's state) and
log rows. Each builder is contained: a failing one is logged and contributes nothing, the tick still runs.

Delivery rules (exactly once relative to the committed state, see ``adapters/store.py``):
- canary results: terminal results once per job id (``canary_seen``); PENDING/RUNNING every tick (the core
  ignores them, they say the round is alive);
- approvals: re-sent every tick until Slurm shows the node drained by us with the proposal's ``#<id>`` in
  the reason, then marked ``executed`` (the core treats a repeat as a no-op); denials once (``delivered``);
  pending proposals whose node an admin drained with a reason naming them are settled
  (``Gatekeeper.settle_by_admin``); ``Gatekeeper.expire(now)`` runs every tick;
- outcomes: the forwarded Epilog records of one job attempt (every node sends one) become one
  ``JobOutcome``; a record arriving after its attempt was delivered is merged (marked, not re-delivered).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_fleetyield.adapters.slurm import TERMINAL_JOB_STATES, JobAttempt, SlurmCommandError
from slurm_fleetyield.adapters.store import ATTEMPT_SLOP_S, LogRow, Store, StoredOutcome
from slurm_fleetyield.core.model import CanaryResult, GateDecision, JobOutcome, SlurmNode, WorkloadClass

log = logging.getLogger("fleetyield.intake")

APPROVAL_RESEND_S = 7 * 86_400.0
"""An approval whose drain Slurm has not shown for this long is no longer re-sent (the node left Slurm)."""
OUTCOME_WAIT_S = 120.0
"""A forwarded record waits up to this long for sacct to show its job's final state (slurmdbd lags)."""
CANARY_LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"})


@dataclass
class Intake:
    canary_results: list[CanaryResult] = field(default_factory=list)
    gate_decisions: list[GateDecision] = field(default_factory=list)
    outcomes: list[JobOutcome] = field(default_factory=list)
    outcome_keys: list[str] = field(default_factory=list)
    attempts: list[tuple[str, float]] = field(default_factory=list)
    gate_marks: list[tuple[str, str, str]] = field(default_factory=list)
    canary_seen: list[tuple[str, str, str, str]] = field(default_factory=list)
    rows: list[LogRow] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------------
# Canaries
# --------------------------------------------------------------------------------------------------------


def canaries(slurm: Any, store: Store, now: float, lookback_s: float, out: Intake) -> None:
    read = getattr(slurm, "read_canaries", None)
    if read is None:
        return
    rounds = store.canary_rounds(now - lookback_s)
    if not rounds:
        return
    results: Sequence[CanaryResult] = read(rounds, now - lookback_s)
    terminal = [r for r in results if r.state not in CANARY_LIVE_STATES]
    seen = store.canary_seen([str(r.job_id) for r in terminal])
    for r in results:
        if r.state in CANARY_LIVE_STATES:
            out.canary_results.append(r)
        elif str(r.job_id) not in seen:
            out.canary_results.append(r)
            out.canary_seen.append((str(r.job_id), r.token, r.node, r.state))
            out.rows.append(
                LogRow(
                    now,
                    "canary_result",
                    r.node,
                    f"canary job {r.job_id} of round {r.token}: {r.state} exit={r.exit_code}",
                    {"job_id": r.job_id, "token": r.token, "state": r.state, "exit_code": r.exit_code},
                )
            )


# --------------------------------------------------------------------------------------------------------
# The gate
# --------------------------------------------------------------------------------------------------------


def gate(
    gk: Any,
    store: Store,
    nodes: Mapping[str, SlurmNode],
    now: float,
    out: Intake,
    *,
    users: Mapping[str, Any],
    open_ids: frozenset[str] | None = None,
) -> None:
    from slurm_fleetyield.gate import GateError, ProposalStatus, proposal_ids_in_reason

    for p in gk.expire(now):
        out.rows.append(
            LogRow(
                now, "proposal_expired", p.node, f"proposal {p.id} expired undecided", {"proposal_id": p.id}
            )
        )
    for name, node in nodes.items():
        if not node.drained_by_other:
            continue
        for pid in proposal_ids_in_reason(node.reason):
            p = gk.get(pid)
            if p is None or p.status is not ProposalStatus.PENDING or p.node != name:
                continue
            detail = users.get(name)
            actor = f"slurm:{getattr(detail, 'reason_user', None) or 'admin'}"
            try:
                gk.settle_by_admin(pid, node.reason, now, actor=actor)
            except GateError as exc:
                log.warning("cannot settle %s by admin drain: %s", pid, exc)
                continue
            out.rows.append(
                LogRow(
                    now,
                    "proposal_settled_by_admin",
                    name,
                    f"{actor} drained {name} naming {pid}",
                    {"proposal_id": pid},
                )
            )
    executed = store.gate_marked("executed")
    for p in gk.proposals(ProposalStatus.APPROVED):
        if p.id in executed or (p.settled_at or 0) < now - APPROVAL_RESEND_S:
            continue
        node = nodes.get(p.node)
        # Executed: Slurm shows the node drained by us naming the proposal, or drained by us while the core
        # no longer holds the proposal open (it moved on to remediation and rewrote the reason).
        acted = open_ids is not None and p.id not in open_ids
        if node is not None and node.drained_by_us and (p.id in proposal_ids_in_reason(node.reason) or acted):
            out.gate_marks.append((p.id, "executed", p.node))
            out.rows.append(
                LogRow(
                    now,
                    "approval_executed",
                    p.node,
                    f"Slurm shows {p.node} drained for {p.id}",
                    {"proposal_id": p.id},
                )
            )
            continue
        out.gate_decisions.append(
            GateDecision(p.id, p.node, "approve", p.settled_by or "", p.settled_at or now)
        )
    delivered = store.gate_marked("delivered")
    for p in gk.proposals(ProposalStatus.DENIED):
        if p.id in delivered:
            continue
        out.gate_decisions.append(GateDecision(p.id, p.node, "deny", p.settled_by or "", p.settled_at or now))
        out.gate_marks.append((p.id, "delivered", p.node))


# --------------------------------------------------------------------------------------------------------
# Job outcomes
# --------------------------------------------------------------------------------------------------------


def _num(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _start_of(rec: Mapping[str, Any]) -> float:
    for key in ("start_time", "end_time", "epilog_time"):
        v = _num(rec.get(key))
        if v is not None:
            return v
    return 0.0


def derived_state(rec: Mapping[str, Any]) -> tuple[str, int | None]:
    """State from the Epilog's exit fields alone (no accounting): 0 -> COMPLETED, a signal -> CANCELLED,
    anything else -> FAILED. It cannot see TIMEOUT, NODE_FAIL or a requeue; sacct can."""
    code, sig = rec.get("exit_code"), rec.get("exit_signal")
    if isinstance(code, int):
        if isinstance(sig, int) and sig:
            return "CANCELLED", 128 + sig
        return ("COMPLETED" if code == 0 else "FAILED"), code
    raw = rec.get("exit_status_raw")
    if isinstance(raw, int):
        if raw == 0:
            return "COMPLETED", 0
        if raw & 0x7F:
            return "CANCELLED", 128 + (raw & 0x7F)
        return "FAILED", raw >> 8
    return "FAILED", None


def cluster_attempts(records: Sequence[StoredOutcome]) -> list[list[StoredOutcome]]:
    """Group records by job, then into attempts: starts within ``ATTEMPT_SLOP_S`` of the attempt's first."""
    by_job: dict[str, list[StoredOutcome]] = defaultdict(list)
    for r in records:
        by_job[r.job_id].append(r)
    groups: list[list[StoredOutcome]] = []
    for job_records in by_job.values():
        job_records.sort(key=lambda r: _start_of(r.record))
        current: list[StoredOutcome] = []
        for r in job_records:
            if current and _start_of(r.record) - _start_of(current[0].record) > ATTEMPT_SLOP_S:
                groups.append(current)
                current = []
            current.append(r)
        if current:
            groups.append(current)
    return groups


def to_outcome(
    group: Sequence[StoredOutcome],
    attempt: JobAttempt | None,
    expand: Any,
) -> JobOutcome:
    recs = [g.record for g in group]
    first = recs[0]
    job_id = int(str(first["job_id"]).split("_")[0].split("+")[0])
    nodes_seen = sorted({str(r.get("node") or g.node) for r, g in zip(recs, group, strict=True)})
    hostlist = (attempt.nodelist if attempt else "") or str(first.get("nodes") or "")
    node_list: tuple[str, ...] = tuple(nodes_seen)
    if hostlist and expand is not None:
        try:
            node_list = tuple(expand([hostlist]).get(hostlist, ())) or node_list
        except SlurmCommandError as exc:
            log.warning("cannot expand hostlist %r: %s", hostlist, exc)
    per_node = [len(r.get("gpus") or []) for r in recs]
    gpus = sum(per_node)
    if len(node_list) > len(recs) and per_node:
        gpus = round(gpus / len(recs) * len(node_list))
    klass = first.get("declared_class")
    try:
        workload = WorkloadClass(klass) if klass else None
    except ValueError:
        workload = None
    start = min(_start_of(r) for r in recs)
    ends = [_num(r.get("slurm_end_time")) or _num(r.get("end_time")) for r in recs]
    end = max([e for e in ends if e is not None] or [start])
    if attempt is not None and attempt.state in TERMINAL_JOB_STATES:
        state, exit_code = attempt.state, attempt.exit_code
        start = attempt.start or start
        end = attempt.end or end
    else:
        state, exit_code = derived_state(first)
    checkpoints = [c for c in (_num(r.get("last_checkpoint")) for r in recs) if c is not None]
    return JobOutcome(
        job_id=job_id,
        node_list=node_list,
        gpus=gpus,
        workload=workload,
        start=start,
        end=max(end, start),
        state=state,
        exit_code=exit_code,
        last_checkpoint=max(checkpoints) if checkpoints else None,
        user=str(first.get("user") or ""),
    )


def _closest(attempts: Sequence[JobAttempt], start: float) -> JobAttempt | None:
    timed = [a for a in attempts if a.start is not None and abs(a.start - start) <= ATTEMPT_SLOP_S]
    if timed:
        return min(timed, key=lambda a: abs((a.start or 0) - start))
    return attempts[-1] if len(attempts) == 1 else None


def outcomes(slurm: Any, store: Store, now: float, use_sacct: bool, out: Intake) -> None:
    pending = store.pending_outcomes()
    if not pending:
        return
    groups = cluster_attempts(pending)
    accounting: dict[int, list[JobAttempt]] = {}
    read = getattr(slurm, "read_job_attempts", None) if use_sacct else None
    if read is not None:
        ids = sorted(
            {
                int(str(g[0].job_id).split("_")[0].split("+")[0])
                for g in groups
                if str(g[0].job_id)[:1].isdigit()
            }
        )
        try:
            accounting = read(ids)
        except SlurmCommandError as exc:
            log.info("sacct unavailable for outcomes (%s); states from the Epilog's exit codes", exc)
            read = None
    expand = getattr(slurm, "expand_hostlists", None)
    for group in groups:
        keys = [g.key for g in group]
        job_id = group[0].job_id
        start = min(_start_of(g.record) for g in group)
        if store.delivered_attempt(job_id, start) or any(
            j == job_id and abs(s - start) <= ATTEMPT_SLOP_S for j, s in out.attempts
        ):
            out.outcome_keys.extend(keys)  # a late record of an attempt already delivered
            continue
        try:
            numeric = int(str(job_id).split("_")[0].split("+")[0])
        except ValueError:
            log.error("outcome record with job id %r dropped: not a Slurm job id", job_id)
            out.outcome_keys.extend(keys)
            continue
        attempt = _closest(accounting.get(numeric, []), start)
        age = now - min(g.received_at for g in group)
        if (
            read is not None
            and (attempt is None or attempt.state not in TERMINAL_JOB_STATES)
            and age < OUTCOME_WAIT_S
        ):
            continue  # slurmdbd has not recorded the end yet: wait a few ticks for the true state
        outcome = to_outcome(group, attempt, expand)
        out.outcomes.append(outcome)
        out.outcome_keys.extend(keys)
        out.attempts.append((job_id, start))
        out.rows.append(
            LogRow(
                now,
                "job_outcome",
                outcome.node_list[0] if outcome.node_list else "",
                f"job {outcome.job_id} {outcome.state} on {','.join(outcome.node_list)}",
                {
                    "job_id": outcome.job_id,
                    "state": outcome.state,
                    "gpus": outcome.gpus,
                    "records": len(group),
                },
            )
        )
