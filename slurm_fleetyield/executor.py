"""The executor: a plan's actions handed to the system that owns each of them, in plan order.

Input: a ``Plan`` from ``tick``, the Slurm port, the agent control client, the gate, the store. Output: one
``ApplyReport`` (every action's result, failures included) that the daemon logs and feeds back to the next
tick as ``Observations.failed_actions``.

Routing: Slurm actions (update, drain, resume, reboot, submit/cancel canary) go to the Slurm adapter;
``ResetGpu`` to the node's agent (signed ``POST /v1/control/reset``); ``PowerCycle`` to the node's BMC
(Redfish); ``ProposeDrain`` and ``WithdrawProposal`` to the gate (``Gatekeeper``). A failing action never
stops the next one.

Off the tick: a power cycle takes tens of seconds to minutes (ForceOff, wait, dwell, On, wait, retries), so
the Redfish executor only admits it here (safety, rate limit, audit) and performs it in a worker thread.
``background()`` hands its finished results and the nodes still in flight to the daemon, which feeds them to
the next tick as ``Observations.failed_actions`` / ``confirmed_actions`` / ``in_flight``.

Dry-run: nothing changes in Slurm and no agent is asked to reset (the commands and requests are logged, and
reported as ``dry-run: not executed``). Proposals and withdrawals ARE recorded in the gate when
``gate.record_in_dry_run`` (default): the gate is FleetYield's own bookkeeping, and admins rehearsing
approvals on a dry-run controller need real proposals; an approval then only makes the next tick log the
drain it would run.

A canary round is written to the store (``record_canary_round``) BEFORE sbatch runs: a controller killed
right after submitting still finds the round's jobs by name after a restart.

Once per intent. A GPU reset, a reboot and a power cycle are not idempotent (a second one is a second
outage), and a kill -9 between acting and committing the tick replays the tick from the previous state:
the lifecycle decides the same remediation again, with the same ``intent`` (core/lifecycle.py). So each is
recorded in the store (``record_intent``, committed) before it is acted on and finished with its result
after. An intent already finished is never acted on again (its result is reported again). One recorded but
unfinished (the crash came between) is checked against what the world shows was done:
- reboot: Slurm shows REBOOT_REQUESTED or REBOOT_ISSUED, or a BootTime after the intent -> done; else
  nothing shows it was issued, and it is issued now;
- GPU reset: sent again with the same ``request_id`` (derived from the intent): the agent keeps the ids it
  has executed (``node_agent/remote.py``) and answers 409 to a second one -> done; else it never arrived.
  Past ``AGENT_REMEMBERS_S`` the agent may have forgotten the id: reported failed (outcome unknown);
- power cycle: a BootTime after the intent -> done. Else, when the intent was marked sent (``mark_intent``,
  committed once the action is admitted, before the worker may reach the BMC): the BMC may have cycled the
  node, which shows in Slurm only once it has booted, minutes later: reported ok (outcome unknown), never
  repeated; the node's samples after ``reboot_settle_s`` or the remediation timeout judge it, as for a cycle
  whose result was lost. Reporting it failed would send the lifecycle to its next rung at once, and with a
  ladder ending in power_cycle that is a second cycle of a node still booting from the first. Not marked:
  nothing reached the BMC (the crash came between recording the intent and admitting it), so it is started
  now. A crash between the mark and the BMC's first request loses the cycle (at most once, never twice).

Left unguarded, idempotent in effect: ``scontrol requeue`` (a drain's ``requeue_jobs``, ``RequeueJobs``) and
``scancel --signal`` (``SignalJobs``). A replayed tick decides them from the jobs it reads from Slurm at its
start, after the crashed tick's requeue: a requeued job is PENDING (Slurm refuses to requeue a pending job
and changes nothing: ``plan.RequeueJobs``), or running elsewhere, off the node the replay acts on; only a job
still running on that node is requeued, which is the decision itself, not a repeat. A second checkpoint
signal to a job still running costs one more checkpoint write (USR2), or, for USR1, a second self-requeue
request that Slurm refuses as above.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node_agent.protocol import RESET_RESEND_WINDOW_S
from slurm_fleetyield.adapters.agent_control import AgentControl, AgentControlError
from slurm_fleetyield.adapters.slurm import SlurmCommandError
from slurm_fleetyield.adapters.store import Intent, Store
from slurm_fleetyield.core.model import SlurmNode
from slurm_fleetyield.core.plan import (
    Plan,
    PowerCycle,
    ProposeDrain,
    RebootNode,
    ResetGpu,
    SubmitCanary,
    WithdrawProposal,
)

if TYPE_CHECKING:  # the Redfish adapter imports sushy lazily; only the type is needed here
    from slurm_fleetyield.adapters.redfish import RedfishExecutor
from slurm_fleetyield.ports import ActionResult, ApplyReport, SlurmPort

log = logging.getLogger("fleetyield.executor")
ROUTED = (ResetGpu, PowerCycle, ProposeDrain, WithdrawProposal)
"""Actions not executed by Slurm: GPU resets go to the node's agent, proposals to the gate."""
SYSTEM_ACTOR = "fleetyield"
MAX_EVIDENCE_CHARS = 64 * 1024
ONCE = (ResetGpu, RebootNode, PowerCycle)
"""Not idempotent: acted on once per ``intent`` (see the module's docstring)."""
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED"})
POWER_CYCLE_SENT = "admitted; may have reached the BMC"
"""An unfinished power cycle intent's detail once admitted (``Store.mark_intent``; module docstring)."""
CONFLICT = 409  # the agent's answer to a request_id it has already executed
AGENT_REMEMBERS_S = RESET_RESEND_WINDOW_S
"""An unfinished reset intent older than this is not sent again. The agent keeps executed request ids
longer than this window (``node_agent.protocol.reset_id_memory_s``, derived from it), so every resend of a
reset that was done is refused with 409, never done twice."""


def reset_request_id(intent: str) -> str:
    """The agent request id of a reset intent: the same on every try, so the agent can refuse a repeat."""
    return "rst-" + hashlib.sha256(intent.encode()).hexdigest()[:24]


class GateAccess:
    """The daemon's handle on the gate database: one ``Gatekeeper`` per thread, opened lazily (SQLite
    connections may not cross threads; the daemon is built in one thread and ticks in another)."""

    def __init__(
        self,
        state_dir: str | Path,
        *,
        url: str | None = None,
        lease: Callable[[], tuple[str, int] | None] | None = None,
    ) -> None:
        """``url``: the PostgreSQL database instead of ``<state_dir>/gate.db``; ``lease``: the fencing of
        the gate's core-driven writes (``Gatekeeper``'s docstring)."""
        self.state_dir = Path(state_dir)
        self.url = url
        self.lease = lease
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()

    def get(self) -> Any:
        from slurm_fleetyield.gate import Gatekeeper

        gk = getattr(self._local, "gk", None)
        if gk is None:
            gk = Gatekeeper.open(self.state_dir, url=self.url, lease=self.lease)
            self._local.gk = gk
            with self._lock:
                self._all.append(gk)
        return gk

    def close(self) -> None:
        with self._lock:
            for gk in self._all:
                with contextlib.suppress(Exception):
                    gk.close()
            self._all.clear()
        self._local = threading.local()


def propose(gate: GateAccess, action: ProposeDrain, now: float, *, actor: str = SYSTEM_ACTOR) -> str:
    """Record the proposal with the core's id and deadline. Idempotent: a proposal with this id for this
    node already recorded (the tick was replayed after a crash) is success."""
    from slurm_fleetyield.gate import GateError, Proposal

    gk = gate.get()
    existing = gk.get(action.proposal_id)
    if existing is not None:
        if existing.node != action.node:
            raise GateError(f"proposal id {action.proposal_id} already names node {existing.node}")
        return f"already recorded ({existing.status.value})"
    created = min(now, action.expires_at - 1.0)
    proposal = Proposal.new(
        id=action.proposal_id,
        node=action.node,
        gpus=action.gpus,
        risk=action.risk,
        evidence=action.evidence[:MAX_EVIDENCE_CHARS],
        affected_jobs=action.affected_jobs,
        now=created,
        ttl_s=action.expires_at - created,
    )
    gk.propose(proposal, actor=actor)
    log.warning(
        "drain proposed: waiting for an admin",
        extra={
            "fy": {
                "proposal_id": action.proposal_id,
                "node": action.node,
                "gpus": list(action.gpus),
                "risk": action.risk,
                "affected_jobs": list(action.affected_jobs),
                "expires_at": action.expires_at,
                "approve": f"fleetyield approve {action.proposal_id} --key ADMIN.key",
            }
        },
    )
    return "recorded"


def withdraw(gate: GateAccess, action: WithdrawProposal, now: float, *, actor: str = SYSTEM_ACTOR) -> str:
    """Close a pending proposal without a decision (status ``withdrawn``, audited with the core's reason)."""
    closed = gate.get().withdraw(action.proposal_id, action.reason, now, actor=actor)
    if closed is None:
        return "not pending (unknown or already decided): nothing to withdraw"
    log.info(
        "proposal withdrawn",
        extra={"fy": {"proposal_id": closed.id, "node": closed.node, "reason": action.reason}},
    )
    return "withdrawn"


class Executor:
    def __init__(
        self,
        slurm: SlurmPort,
        store: Store,
        *,
        control: AgentControl | None = None,
        gate: GateAccess | None = None,
        redfish: RedfishExecutor | None = None,
        dry_run: bool = False,
        record_proposals_in_dry_run: bool = True,
        clock: Callable[[], float] | None = None,
        fence: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self.slurm = slurm
        self.fence = fence
        self.store = store
        self.control = control
        self.gate = gate
        self.redfish = redfish
        self.dry_run = dry_run
        self.record_proposals = record_proposals_in_dry_run or not dry_run

    def apply(self, plan: Plan, now: float) -> ApplyReport:
        """The whole plan goes to the Slurm port (which skips what is not Slurm's, so the simulator's port
        and this one receive the same plans), then resets and gate actions run, in plan order. Results come
        back in plan order.

        Fenced: without the leader lease (``lease.py``; checked before anything is recorded or sent, and
        again before the Slurm and the routed actions go out) every action not yet sent is refused, as
        ``fenced: ...``; nothing reaches Slurm, an agent, a BMC or the gate."""
        refusal = self._fenced()
        if refusal is not None:
            return ApplyReport(tuple(ActionResult(a, False, (), refusal) for a in plan.actions))
        results: dict[int, ActionResult] = {}
        routed = [(i, a) for i, a in enumerate(plan.actions) if isinstance(a, ROUTED)]
        refused: set[int] = set()
        resent: set[int] = set()  # resets whose intent was recorded before a crash: the agent may have it
        once: list[int] = []
        self._slurm_now: dict[str, SlurmNode] | None = None  # read only to check an unfinished intent
        if not self.dry_run:
            for i, action in enumerate(plan.actions):
                if isinstance(action, ONCE) and action.intent:
                    done = self._intent(action, now)
                    if done is False:
                        resent.add(i)
                    elif isinstance(done, ActionResult):
                        refused.add(i)
                        results[i] = done
                        continue
                    once.append(i)
                if isinstance(action, SubmitCanary):
                    try:
                        self.store.record_canary_round(action.token, action.node, now)
                    except Exception as exc:  # no record, no submission: its results could not be found
                        refused.add(i)
                        results[i] = ActionResult(action, False, (), f"cannot record the canary round: {exc}")
        slurm_plan = plan
        if refused:
            slurm_plan = Plan(tuple(a for i, a in enumerate(plan.actions) if i not in refused), plan.holds)
        calls = 0
        refusal = self._fenced()
        if refusal is not None:  # lost while the intents were recorded: none of them is acted on
            for i, a in enumerate(plan.actions):
                results.setdefault(i, ActionResult(a, False, (), refusal))
            return ApplyReport(tuple(results[i] for i in sorted(results)))
        if len(routed) + len(refused) < len(plan.actions):
            report = self.slurm.apply(slurm_plan)
            calls = report.calls
            slurm_indices = [
                i for i, a in enumerate(plan.actions) if i not in refused and not isinstance(a, ROUTED)
            ]
            for i, r in zip(slurm_indices, report.results, strict=False):
                results[i] = r
        for i, action in routed:
            if i in refused:
                continue
            if isinstance(action, ResetGpu):
                results[i] = self._reset(action, resent=i in resent)
            elif isinstance(action, PowerCycle):
                results[i] = self._power_cycle(action, marks=i in once)
            else:
                results[i] = self._gate(action, now)
        for i in once:
            res = results.get(i)
            # a power cycle started off the tick is finished when its worker reports (``background``)
            if res is not None and not (isinstance(res.action, PowerCycle) and res.ok):
                self._finish(res, now)
        return ApplyReport(tuple(results[i] for i in sorted(results)), calls=calls)

    def _fenced(self) -> str | None:
        if self.fence is None:
            return None
        ok, why = self.fence()
        if not ok:
            log.warning("actions refused", extra={"fy": {"reason": why}})
        return None if ok else why

    # -- once per intent ------------------------------------------------------------------------------

    def _intent(self, action: ResetGpu | RebootNode | PowerCycle, now: float) -> ActionResult | bool | None:
        """Before acting: None (recorded now: act), False (recorded before, outcome unknown, a reset: send
        it again, the agent refuses a repeat), or the result to report instead of acting."""
        command = ("intent", action.kind, action.node, action.intent)
        try:
            prior = self.store.intent(action.intent)
            if prior is None:
                self.store.record_intent(action.intent, action.node, action.kind, now)
                return None
        except Exception as exc:  # no record, no action: a crash after it could not be told from none
            return ActionResult(action, False, command, f"cannot record the intent: {exc}")
        if prior.done_at is not None:
            detail = f"not repeated: done at {prior.done_at:.0f} ({prior.detail})"
            return ActionResult(action, bool(prior.ok), command, detail)
        if isinstance(action, ResetGpu):
            if now - prior.created <= AGENT_REMEMBERS_S:
                return False
            why = "recorded longer ago than the agent remembers request ids (outcome unknown): not repeated"
            result = ActionResult(action, False, command, why)
            self._finish(result, now)
            return result
        seen = self._done_in_slurm(action, prior)
        if seen is not None:
            result = ActionResult(action, True, command, f"not repeated: {seen}")
            self._finish(result, now)
            return result
        if isinstance(action, PowerCycle) and prior.detail == POWER_CYCLE_SENT:
            why = (
                "sent to the BMC before a controller restart, no new boot shows yet (outcome unknown): "
                "not repeated; the node's samples or the remediation timeout judge it"
            )
            result = ActionResult(action, True, command, why)
            self._finish(result, now)
            return result
        return None  # a reboot nothing shows was issued, a power cycle never sent: act now

    def _done_in_slurm(self, action: RebootNode | PowerCycle, prior: Intent) -> str | None:
        if self._slurm_now is None:
            try:
                self._slurm_now = dict(self.slurm.read_nodes())
            except SlurmCommandError as exc:
                log.error("cannot check intent %s in Slurm: %s", prior.key, exc)
                return "unknown (Slurm unreadable); not repeated"
        node = self._slurm_now.get(action.node)
        if node is None:
            return None
        flags = sorted(node.states & REBOOT_FLAGS)
        if flags and isinstance(action, RebootNode):
            return f"Slurm shows {'+'.join(flags)} (issued before a restart)"
        if node.boot_time is not None and node.boot_time > prior.created:
            return f"booted at {node.boot_time:.0f}, after the intent of {prior.created:.0f}"
        return None

    def _finish(self, result: ActionResult, now: float) -> None:
        key = getattr(result.action, "intent", "")
        if not key or self.dry_run:
            return
        try:
            self.store.finish_intent(key, result.ok, result.detail or " ".join(result.command), now)
        except Exception as exc:  # left unfinished: a replay checks the world instead
            log.error("cannot record the result of intent %s: %s", key, exc)

    def _reset(self, action: ResetGpu, *, resent: bool = False) -> ActionResult:
        if self.control is None:
            return ActionResult(action, False, ("agent", "reset", action.node), "no agent control configured")
        request_id = reset_request_id(action.intent) if action.intent else None
        url, body = self.control.request(action.node, action.gpus, request_id)
        command = ("POST", url, body.decode())
        if self.dry_run:
            log.info("dry-run: would POST %s %s", url, body.decode())
            return ActionResult(action, True, command, "dry-run: not executed")
        try:
            answer = self.control.reset(action.node, action.gpus, request_id)
        except AgentControlError as exc:
            if resent and exc.status == CONFLICT:  # executed before the controller's restart
                return ActionResult(action, True, command, f"not repeated: the agent has it ({exc.detail})")
            log.error("gpu reset failed: %s", exc)
            return ActionResult(action, False, command, exc.detail)
        return ActionResult(action, True, command, f"reset gpus {answer.get('gpus')}")

    def _power_cycle(self, action: PowerCycle, *, marks: bool) -> ActionResult:
        # A failure comes back as ok=False; the next tick turns it into REMEDIATION_FAILED (next rung, or
        # NEEDS_HUMAN after max_remediation_attempts), so an unreachable BMC never leaves a node in limbo.
        if self.redfish is None:
            return ActionResult(
                action, False, ("redfish", "power_cycle", action.node), "no Redfish adapter configured"
            )
        if not marks:  # no intent recorded (none given, or dry-run)
            return self.redfish.start(action)
        return self.redfish.start(action, lambda: self.store.mark_intent(action.intent, POWER_CYCLE_SENT))

    def background(self) -> tuple[frozenset[str], tuple[ActionResult, ...]]:
        """(nodes with a power action still running, results finished since the last call)."""
        if self.redfish is None:
            return frozenset(), ()
        in_flight, finished = self.redfish.collect()
        for r in finished:
            self._finish(r, time.time())
        return in_flight, finished

    def _gate(self, action: ProposeDrain | WithdrawProposal, now: float) -> ActionResult:
        command = ("gate", action.kind, action.proposal_id, action.node)
        if self.gate is None:
            return ActionResult(action, False, command, "no gate configured (gate.state_dir)")
        if not self.record_proposals:
            log.info("dry-run: would %s %s on %s", action.kind, action.proposal_id, action.node)
            return ActionResult(action, True, command, "dry-run: not recorded")
        actor = SYSTEM_ACTOR + (" (dry-run)" if self.dry_run else "")
        try:
            if isinstance(action, ProposeDrain):
                detail = propose(self.gate, action, now, actor=actor)
            else:
                detail = withdraw(self.gate, action, now, actor=actor)
        except Exception as exc:  # GateError, AuditIntegrityError, sqlite errors: fail this action only
            log.error("gate action %s %s failed: %s", action.kind, action.proposal_id, exc)
            return ActionResult(action, False, command, f"{type(exc).__name__}: {exc}")
        return ActionResult(action, True, command, detail)
