"""Rehab: the lifecycle (core/lifecycle.py) wired into the tick.

Input: Observations (Slurm view, jobs, canary results, failed actions), the sensed nodes, risks, this tick's
drains (quarantine) and approvals (gate), the previous state (lifecycle memories, fatal history) and Params.
Output: ``Rehab``: the next lifecycle memories (forgettable ones dropped), the drains and lifecycle actions to
plan, holds (approved drains past a cap), log events, and the proposals the lifecycle drained for.

Events are derived per node and folded in order, each derived from the memory the previous one produced:
1. FATAL (quarantine acted on fatal evidence: drained it, or it was already drained by us) or APPROVED_DRAIN
   (subject to the drain caps like any new drain; held: a ``Hold`` and retried next tick);
2. DRAINED (QUARANTINED since an earlier tick, Slurm shows it drained by us, no job running),
   REMEDIATION_FAILED (a remediation of the last plan failed to apply, or one running off the tick - a
   BMC power cycle - finished failing), REMEDIATION_STARTED (one running off the tick finished: the attempt's
   clock restarts now), REMEDIATION_OK (REMEDIATING, no remediation of it still running off the tick,
   responding, a fresh sample newer than the attempt start - ``reboot_settle_s`` later after a reboot -
   no GPU missing, no fatal since), CANARY_PASSED/FAILED (results of the current round, each job once),
   INCIDENT (in canary or probation, the risk of the evidence that appeared after the remediation is at or
   above red: ``core/aftercare.py``; a counter a reset cannot clear is no incident),
   ADMIN_DRAINED (drained with a reason not ours; while REMEDIATING Slurm's own reasons are not an admin),
   ADMIN_RESUMED (only on the edge: Slurm showed it drained by us last tick, not drained now, in a stage that
   should be drained: our own ResumeNode always leaves such a stage first);
3. TICK (timeouts, probation end).
A node in a drained stage whose drain failed to apply (a ``FailedAction`` of the last plan), or that a reboot
cleared while REMEDIATING, gets its drain re-asserted (idempotent). A drain that applied and is gone from
Slurm was lifted by someone: ADMIN_RESUMED, never a second drain. Cost: O(lifecycle nodes + events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from slurm_fleetyield.core import aftercare
from slurm_fleetyield.core.gate import Approval, approved_summary
from slurm_fleetyield.core.lifecycle import (
    DRAINED_STAGES,
    MAX_REASON_LEN,
    Event,
    EventKind,
    LifecycleMemory,
    Remediation,
    Stage,
    step,
)
from slurm_fleetyield.core.model import LogEvent, NodeRisk, Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import Action, DrainNode, Hold, ResumeNode, SubmitCanary
from slurm_fleetyield.core.quarantine import Drains, Fatal
from slurm_fleetyield.core.quarantine import _most_specific as most_specific
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.stake import signal_actions, signals_checkpoint
from slurm_fleetyield.core.state import ControllerState

SLURM_OWN_REASONS = (
    "Not responding",
    "Reboot ASAP",
    "reboot requested",
    "Node unexpectedly rebooted",
    "Kill task failed",
)
"""Reasons Slurm itself sets around a reboot: while REMEDIATING they are not an admin's drain."""
NOT_RESPONDING = frozenset(
    {"DOWN", "NOT_RESPONDING", "NO_RESPOND", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_UP", "POWER_DOWN",
     "POWERED_DOWN", "POWERING_DOWN", "FAIL", "UNKNOWN"}
)  # fmt: skip
REMEDIATION_KINDS = frozenset({"reset_gpu", "reboot", "power_cycle"})
CANARY_PASS = frozenset({"COMPLETED"})
CANARY_FAIL = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"})


@dataclass(frozen=True, slots=True)
class Rehab:
    lifecycle: Mapping[str, LifecycleMemory]
    drains: tuple[DrainNode, ...] = ()
    actions: tuple[Action, ...] = ()  # lifecycle actions other than drains, in decision order
    holds: tuple[Hold, ...] = ()
    events: tuple[LogEvent, ...] = ()
    approved: Mapping[str, str] = field(default_factory=dict)  # node -> proposal id drained for this tick
    seen_drained: frozenset[str] = frozenset()
    new_drains: int = 0  # approved drains (count against the rate window)


def out_of_service(state: ControllerState) -> frozenset[str]:
    """Nodes the lifecycle holds out of normal service without a drain (CANARY: canary jobs only). They
    count against the drain cap with every node drained by us (``quarantine.decide``)."""
    return frozenset(n for n, m in state.lifecycle.items() if m.stage is Stage.CANARY)


def rehabilitate(
    obs: Observations,
    sensed: Sensed,
    risks: Mapping[str, NodeRisk],
    drains: Drains,
    approvals: Mapping[str, Approval],
    state: ControllerState,
    params: Params,
    now: float,
) -> Rehab:
    lp = params.lifecycle
    red = params.risk.red_threshold
    risk_xids = tuple(params.quarantine.risk_only_xids)
    findings: dict[str, list[Fatal]] = {}
    f: Fatal | None
    for f in drains.processed:
        slurm = obs.slurm.get(f.node)
        if slurm is not None and (f.node in drains.draining or slurm.drained_by_us):
            findings.setdefault(f.node, []).append(f)
    # The episode's cause is the most specific finding (an XID 79 push over the 'GPU missing' seen with it),
    # the same choice as the drain reason's.
    fatal: dict[str, Fatal] = {node: most_specific(fs) for node, fs in findings.items()}
    failed: dict[str, list[str]] = {}
    failed_drains = {fa.node for fa in obs.failed_actions if fa.kind == "drain"}
    for fa in obs.failed_actions:
        if fa.kind in REMEDIATION_KINDS:
            failed.setdefault(fa.node, []).append(f"{fa.kind}: {fa.detail}".rstrip(": "))
    confirmed = {ca.node for ca in obs.confirmed_actions if ca.kind in REMEDIATION_KINDS}
    canaries: dict[str, list] = {}
    for c in obs.canary_results:
        canaries.setdefault(c.node, []).append(c)
    names = sorted(set(state.lifecycle) | set(fatal) | set(approvals))
    jobs_on = _jobs_index(obs, frozenset(names)) if names else {}
    out = dict(state.lifecycle)
    drain_actions: list[DrainNode] = []
    actions: list[Action] = []
    holds: list[Hold] = []
    events: list[LogEvent] = []
    approved: dict[str, str] = {}
    seen: set[str] = set()
    new_drains = 0
    budget = drains.cap

    for name in names:
        slurm = obs.slurm.get(name)
        m = state.lifecycle.get(name) or LifecycleMemory(name)
        if slurm is None:
            continue  # unknown to Slurm: nothing can be derived; the memory is kept as it is
        was_drained_stage = m.stage in DRAINED_STAGES
        emitted_drain = False
        running = jobs_on.get(name, ())
        first_action = len(actions)

        def fold(ev: Event, first_action: int = first_action) -> None:
            nonlocal m, emitted_drain
            t = step(m, ev, now, lp)
            m = t.memory
            events.extend(t.log)
            if any(isinstance(a, DrainNode) for a in t.actions):
                # Back to a drained stage: a resume or canary decided earlier this tick (e.g. REMEDIATION_OK,
                # then INCIDENT) is superseded. The plan applies drains before lifecycle actions, so the
                # resume would win, and the next tick would read our own resume as an admin's.
                actions[first_action:] = [
                    a for a in actions[first_action:] if not isinstance(a, (ResumeNode, SubmitCanary))
                ]
            for a in t.actions:
                if isinstance(a, DrainNode):
                    emitted_drain = True
                    drain_actions.append(a)
                else:
                    actions.append(a)

        # 1. fatal evidence or an approval
        f = fatal.get(name)
        ap = approvals.get(name)
        if f is not None and m.stage in (Stage.IN_SERVICE, Stage.CANARY, Stage.PROBATION):
            fold(Event.fatal(f.kind, f.xid, f.gpu, f.message))
        elif ap is not None and m.stage in (Stage.IN_SERVICE, Stage.CANARY, Stage.PROBATION):
            if slurm.drained:
                pass  # drained meanwhile (by someone, or by us for a fault): gate withdraws the proposal
            else:
                rule, detail = budget.blocked(slurm) if budget is not None else ("", "")
                if rule:
                    pid = ap.proposal.proposal_id
                    holds.append(Hold(name, "drain", rule, f"approved {pid}: {detail}"))
                    events.append(
                        LogEvent(
                            now, name, "hold", f"approved drain held by {rule}: {detail}", {"rule": rule}
                        )
                    )
                else:
                    if budget is not None:
                        budget.take()
                    new_drains += 1
                    m = _approve(m, ap, risks.get(name), running, now, params, drain_actions, actions, events)
                    emitted_drain = True
                    approved[name] = ap.proposal.proposal_id

        # 2. what Slurm, the agent and the executor say
        # DRAINED only for a node quarantined before this tick: this tick's Slurm view predates the quarantine
        quarantined_before = name in state.lifecycle and state.lifecycle[name].stage is Stage.QUARANTINED
        drained_empty = slurm.drained_by_us and not running and name not in drains.draining
        if m.stage is Stage.QUARANTINED and quarantined_before and drained_empty and not emitted_drain:
            fold(Event(EventKind.DRAINED))
        if m.stage is Stage.REMEDIATING and name in failed:
            fold(Event(EventKind.REMEDIATION_FAILED, detail="; ".join(failed[name])))
        elif m.stage is Stage.REMEDIATING and name in confirmed:
            # the power came back just now: the node boots from here, so samples count from here on
            fold(Event(EventKind.REMEDIATION_STARTED))
        elif (
            m.stage is Stage.REMEDIATING
            and not emitted_drain
            and name not in obs.in_flight  # the power may not even be cut yet: its scrapes prove nothing
            and _remediated(name, m, slurm, sensed, state, fatal, lp)
        ):
            s = sensed.nodes[name]  # fresh: _remediated checked it
            fold(Event(EventKind.REMEDIATION_OK, baseline=aftercare.baseline(s, risk_xids)))
        if m.stage is Stage.CANARY:
            for c in sorted(canaries.get(name, ()), key=lambda c: c.job_id):
                if m.stage is not Stage.CANARY or c.token != m.canary_token or c.job_id in m.canary_jobs:
                    continue
                ok = c.state in CANARY_PASS and not c.exit_code
                if ok or c.state in CANARY_FAIL:
                    detail = "" if ok else f"({c.state}, exit {c.exit_code})"
                    fold(Event.canary(ok, c.token, c.job_id, detail))
        r = risks.get(name)
        sn = sensed.nodes.get(name)
        if m.stage in (Stage.CANARY, Stage.PROBATION) and sn is not None and sn.fresh:
            # counters first seen now (or a memory stored before baselines) start from their value now
            now_base = aftercare.baseline(sn, risk_xids)
            m = replace(m, baseline=aftercare.extend(m.baseline, now_base))
            inc = None
            if name not in fatal and r is not None and r.probability >= red:
                inc = aftercare.incident(r, sn, m.baseline, risk_xids, params.risk.base_probability, red)
            if inc is not None:
                fold(Event.incident(inc.detail, _requeue(running), key=inc.key))
        if m.stage is not Stage.IN_SERVICE and slurm.drained_by_other:
            own = m.stage is Stage.REMEDIATING and slurm.reason.startswith(SLURM_OWN_REASONS)
            if not own:
                fold(Event(EventKind.ADMIN_DRAINED, detail=slurm.reason))
        # Our drain took effect (Slurm showed it last tick, or it was applied on an earlier tick without a
        # failure) and the node is not drained now: someone resumed it. The admin's decision stands.
        if (
            was_drained_stage
            and m.stage in DRAINED_STAGES
            and not slurm.drained
            and name not in drains.draining
            and (name in state.lifecycle_drained or (name not in failed_drains and m.since < now))
        ):
            fold(Event(EventKind.ADMIN_RESUMED))
        # 3. time passes
        fold(Event(EventKind.TICK))

        # re-assert a drain Slurm does not show (failed to apply, or cleared by a reboot)
        if (
            m.stage in DRAINED_STAGES
            and was_drained_stage
            and not slurm.drained
            and not emitted_drain
            and name not in drains.draining
            and (name in failed_drains or m.stage is Stage.REMEDIATING)
        ):
            drain_actions.append(DrainNode(name, m.reason, _requeue(running), cause="rehab"))
        if m.stage in DRAINED_STAGES and slurm.drained_by_us:
            seen.add(name)
        if m.forgettable:
            out.pop(name, None)
        else:
            out[name] = m
    return Rehab(out, tuple(drain_actions), tuple(actions), tuple(holds), tuple(events), approved,
                 frozenset(seen), new_drains)  # fmt: skip


def _approve(
    m: LifecycleMemory,
    ap: Approval,
    r: NodeRisk | None,
    running: tuple,
    now: float,
    params: Params,
    drain_actions: list[DrainNode],
    actions: list[Action],
    events: list[LogEvent],
) -> LifecycleMemory:
    """Step APPROVED_DRAIN; the drain carries the gate's reason: ``... [approved by <admin> #<id>]``. Jobs
    that follow the checkpoint-signal convention are not requeued by the drain: right after it (lifecycle
    actions follow drains in the plan) they get USR1, checkpoint now and requeue themselves."""
    pid = ap.proposal.proposal_id
    suffix = f" [approved by {ap.admin} #{pid}]"
    head = f"fleetyield: {approved_summary(r)}"
    reason = head[: MAX_REASON_LEN - len(suffix)] + suffix
    rest = tuple(j for j in running if not signals_checkpoint(j, params))
    t = step(m, Event.approved(pid, _requeue(rest)), now, params.lifecycle)
    events.extend(t.log)
    for a in t.actions:
        if isinstance(a, DrainNode):
            drain_actions.append(replace(a, reason=reason, cause="approved"))
        else:
            actions.append(a)
    if t.accepted:
        why = f"approved drain {pid}: checkpoint and requeue"
        actions.extend(signal_actions(m.node, running, "USR1", why, params))
    return replace(t.memory, reason=reason) if t.accepted else t.memory


def _remediated(
    name: str,
    m: LifecycleMemory,
    slurm: object,
    sensed: Sensed,
    state: ControllerState,
    fatal: Mapping[str, Fatal],
    lp: object,
) -> bool:
    if not m.attempts or name in fatal:
        return False
    a = m.attempts[-1]
    if slurm.states & NOT_RESPONDING or not slurm.states:  # type: ignore[attr-defined]
        return False
    s = sensed.nodes.get(name)
    sample_time = sensed.sample_time(name)
    if s is None or not s.fresh or sample_time is None or s.missing_gpus:
        return False
    settle = 0.0 if a.remediation is Remediation.GPU_RESET else lp.reboot_settle_s  # type: ignore[attr-defined]
    if sample_time <= a.started_at + settle:
        return False
    # Fatal evidence from before the remediation took effect (this tick's own findings are recorded at the
    # attempt's start; a reboot's settle window still shows the pre-reboot node) is what was remediated.
    nm = state.nodes.get(name)
    return not (nm is not None and any(t > a.started_at + settle for t in nm.fatal_times))


def _jobs_index(obs: Observations, nodes: frozenset[str]) -> dict[str, tuple]:
    """The running jobs on each of ``nodes`` (the lifecycle's few, not the fleet's), in queue order."""
    idx: dict[str, list] = {}
    isdisjoint = nodes.isdisjoint
    for j in [j for j in obs.job_index.holding if not isdisjoint(j.nodes)]:  # the few, in C
        for n in j.nodes:
            if n in nodes:
                idx.setdefault(n, []).append(j)
    return {n: tuple(js) for n, js in idx.items()}


def _requeue(running: tuple) -> tuple[int, ...]:
    return tuple(sorted(j.job_id for j in running if j.requeue))
