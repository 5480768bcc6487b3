"""Gate: drain proposals for degrading nodes, and the admins' decisions on them.

Input: this tick's ``GateDecision``s, the open proposals and denials in state, and (for ``propose``) the
priced nodes, risks, lifecycle stages and drains of the tick. Output: ``decide`` returns the approvals the
lifecycle must act on and the proposals left open; ``propose`` returns ``ProposeDrain`` /
``WithdrawProposal`` actions, log events and the proposals and denials to remember.

Rules:
- a node whose risk reaches ``risk.red_threshold`` without fatal evidence (tier RED, in service, not drained)
  gets ONE open proposal (id ``p-`` + 12 hex from the tick's ``rng``: the simulator stays deterministic); the
  node stays RED and keeps running what it has: nothing is drained without an approval;
- approve: the lifecycle drains the node (APPROVED_DRAIN; the drain caps apply: a held approval is retried
  every tick); a repeat of an approval already acted on is a no-op;
- deny: the proposal is closed; the node is not proposed again for ``deny_cooldown_s`` unless its risk rises
  ``deny_risk_margin`` above the risk at the denial;
- withdraw: risk below ``min_risk_to_keep_open`` (default: yellow) for ``withdraw_after_s``; a fatal fault
  quarantined the node; someone else drained it (``settled_by_admin:`` when the reason names ``#p-...``);
- expiry: past ``expires_at`` the shell expires the proposal; a node still red gets a new one.
Cost: O(open proposals + decisions + red nodes), never O(fleet).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from slurm_fleetyield.core.lifecycle import LifecycleMemory, Stage
from slurm_fleetyield.core.model import LogEvent, NodeRisk, Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import ProposeDrain, SignalJobs, WithdrawProposal
from slurm_fleetyield.core.quarantine import Drains
from slurm_fleetyield.core.stake import Withheld, drain_figures, signal_actions
from slurm_fleetyield.core.state import ControllerState, Denial, OpenProposal

if TYPE_CHECKING:
    from slurm_fleetyield.core.rehab import Rehab

_REASON_REF_RE = re.compile(r"#(p-[0-9a-f]{12})(?![0-9A-Za-z])")  # same grammar as gate/proposal.py


def proposal_ids_in_reason(reason: str) -> list[str]:
    """Proposal ids a Slurm drain reason refers to (``... #p-0123456789ab ...``), in order."""
    return _REASON_REF_RE.findall(reason)


def new_proposal_id(rng: random.Random) -> str:
    return f"p-{rng.getrandbits(48):012x}"


@dataclass(frozen=True, slots=True)
class Approval:
    proposal: OpenProposal
    admin: str


@dataclass(frozen=True, slots=True)
class Decided:
    proposals: Mapping[str, OpenProposal]  # still open (approved-but-held ones included)
    denials: Mapping[str, Denial]
    approvals: Mapping[str, Approval]  # node -> approval to act on this tick
    events: tuple[LogEvent, ...] = ()


def decide(
    obs: Observations, state: ControllerState, risks: Mapping[str, NodeRisk], params: Params, now: float
) -> Decided:
    proposals = dict(state.proposals)
    gp = params.gate
    denials = {n: d for n, d in state.denials.items() if now < d.time + gp.deny_cooldown_s}
    by_id = {p.proposal_id: p for p in proposals.values()}
    approvals: dict[str, Approval] = {}
    events: list[LogEvent] = []
    for d in obs.gate_decisions:
        p = by_id.get(d.proposal_id)
        data = {"proposal_id": d.proposal_id, "admin": d.admin, "action": d.action}
        if p is None or p.node != d.node:
            if not _acted_on(state.lifecycle.get(d.node), d.proposal_id):
                why = "unknown or closed proposal" if p is None else f"proposal is for node {p.node}"
                events.append(LogEvent(now, d.node, "gate_decision_ignored", f"{d.action}: {why}", data))
            continue
        if d.action == "approve":
            if not p.approved_by:
                p = proposals[p.node] = replace(p, approved_by=d.admin, approved_at=now)
                by_id[p.proposal_id] = p
                events.append(
                    LogEvent(now, p.node, "proposal_approved", f"{p.proposal_id} by {d.admin}", data)
                )
        elif d.action == "deny":
            del proposals[p.node]
            del by_id[p.proposal_id]
            r = risks.get(p.node)
            risk = r.probability if r is not None and not math.isnan(r.probability) else p.risk
            denials[p.node] = Denial(p.proposal_id, now, max(risk, p.risk))
            events.append(LogEvent(now, p.node, "proposal_denied", f"{p.proposal_id} by {d.admin}", data))
        else:
            events.append(
                LogEvent(now, d.node, "gate_decision_ignored", f"unknown action {d.action!r}", data)
            )
    for p in proposals.values():
        if p.approved_by:
            approvals[p.node] = Approval(p, p.approved_by)
    return Decided(proposals, denials, approvals, tuple(events))


def _acted_on(m: LifecycleMemory | None, proposal_id: str) -> bool:
    """A re-sent approval of a proposal the lifecycle already drained for."""
    return (
        m is not None and m.cause is not None and m.cause.kind == "approved" and m.cause.detail == proposal_id
    )


@dataclass(frozen=True, slots=True)
class Proposed:
    actions: tuple[ProposeDrain | WithdrawProposal | SignalJobs, ...]
    proposals: Mapping[str, OpenProposal]
    events: tuple[LogEvent, ...] = ()


def propose(
    obs: Observations,
    decided: Decided,
    rehab: Rehab,
    red_nodes: tuple[str, ...],
    risks: Mapping[str, NodeRisk],
    drains: Drains,
    params: Params,
    now: float,
    rng: random.Random,
    evidence: Callable[[str], str],
    withheld: Withheld | None = None,
) -> Proposed:
    """``rehab``: this tick's lifecycle (its ``approved``: node -> proposal id drained for, no longer open).
    ``evidence(node)``: the explain text shown to admins. ``withheld``: this tick's stakes (core/stake.py),
    with which a proposal is made only when the drain pays (``drain_pays``)."""
    closed, lifecycle = rehab.approved, rehab.lifecycle
    gp = params.gate
    keep = gp.min_risk_to_keep_open if gp.min_risk_to_keep_open is not None else params.risk.yellow_threshold
    actions: list[ProposeDrain | WithdrawProposal | SignalJobs] = []
    events: list[LogEvent] = []
    out: dict[str, OpenProposal] = {}
    for node, p in sorted(decided.proposals.items()):
        if closed.get(node) == p.proposal_id:
            continue
        why = _withdraw_why(node, p, obs, lifecycle, drains)
        if not why and not p.approved_by:
            r = risks.get(node)
            prob = r.probability if r is not None else math.nan
            if not math.isnan(prob) and prob < keep:
                below = p.below_since if p.below_since is not None else now
                if now - below >= gp.withdraw_after_s:
                    why = f"risk_fell: risk {prob:.3f} below {keep:g} for {now - below:.0f}s"
                p = replace(p, below_since=below)
            elif p.below_since is not None and not math.isnan(prob):
                p = replace(p, below_since=None)
            if not why and now >= p.expires_at:
                events.append(
                    LogEvent(now, node, "proposal_expired", p.proposal_id, {"proposal_id": p.proposal_id})
                )
                continue
        if why:
            actions.append(WithdrawProposal(p.proposal_id, node, why))
            events.append(LogEvent(now, node, "proposal_withdrawn", why, {"proposal_id": p.proposal_id}))
            continue
        out[node] = p
    if gp.propose_on_red:
        red = params.risk.red_threshold
        for node in red_nodes:
            if node in out or node in closed:
                continue
            m = lifecycle.get(node)
            slurm = obs.slurm.get(node)
            r = risks.get(node)
            if (m is not None and m.stage is not Stage.IN_SERVICE) or slurm is None or slurm.drained:
                continue
            if r is None or math.isnan(r.probability) or r.probability < red:
                continue
            d = decided.denials.get(node)
            if (
                d is not None
                and now < d.time + gp.deny_cooldown_s
                and r.probability < d.risk + gp.deny_risk_margin
            ):
                continue
            figures: dict[str, Any] = {}
            if params.stake.enabled and withheld is not None:
                pays = drain_figures(node, r.probability, obs, params, withheld)
                if not pays.pays:
                    continue
                figures["stake"] = pays.why
                figures["stake_figures"] = pays.as_dict()  # what explain shows of the proposal
            pid = new_proposal_id(rng)
            gpus = tuple(g.index for g in r.gpus if g.health.value in ("warn", "bad")) or tuple(
                g.index for g in r.gpus if g.contributions
            )
            running = tuple(j for j in obs.job_index.holding if node in j.nodes)
            jobs = tuple(sorted(j.job_id for j in running))
            p = OpenProposal(pid, node, r.probability, now, now + gp.proposal_ttl_s, gpus)
            out[node] = p
            actions.append(ProposeDrain(pid, node, gpus, r.probability, evidence(node), jobs, p.expires_at))
            # checkpoint now: not destructive, so before the approval (a fault meanwhile loses less)
            why_sig = f"drain proposal {pid}: checkpoint now"
            actions.extend(signal_actions(node, running, "USR2", why_sig, params))
            events.append(
                LogEvent(
                    now,
                    node,
                    "drain_proposal",
                    f"drain proposal {pid}: {r.reason}",
                    {
                        "proposal_id": pid,
                        "risk": r.probability,
                        "red_threshold": red,
                        "jobs": list(jobs),
                        **figures,
                    },
                )
            )
    return Proposed(tuple(actions), out, tuple(events))


def _withdraw_why(
    node: str,
    p: OpenProposal,
    obs: Observations,
    lifecycle: Mapping[str, LifecycleMemory],
    drains: Drains,
) -> str:
    slurm = obs.slurm.get(node)
    if slurm is None:
        return "gone: node unknown to Slurm"
    if slurm.drained_by_other:
        if p.proposal_id in proposal_ids_in_reason(slurm.reason):
            return f"settled_by_admin: {slurm.reason}"
        return f"drained: by someone else: {slurm.reason}"
    m = lifecycle.get(node)
    if node in drains.draining or (m is not None and m.stage is not Stage.IN_SERVICE) or slurm.drained_by_us:
        reason = m.reason if m is not None and m.reason else slurm.reason
        return f"quarantined: {reason}".rstrip(": ")
    return ""


def approved_summary(r: NodeRisk | None) -> str:
    """``risk 0.62, gpu 3 correctable remapped rows 14``: the top signal of the riskiest GPU."""
    if r is None or math.isnan(r.probability):
        return "risk unknown"
    text = f"risk {r.probability:.2f}"
    gpus = [g for g in r.gpus if g.contributions]
    if gpus:
        g = max(gpus, key=lambda g: g.probability)
        c = max(g.contributions, key=lambda c: c.weight)
        text += f", gpu {g.index} {c.signal.replace('_', ' ')} {c.value:g}"
    return text
