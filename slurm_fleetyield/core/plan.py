"""Effects as data: the actions a tick decides, which only the Slurm adapter (or the simulator) executes.

Input: decisions of the stages. Output: a ``Plan``, an ordered tuple of idempotent actions. Dry-run prints the
plan; tests assert on it; the daemon hands it to an executor. Every action is safe to repeat: re-applying a
plan that already took effect changes nothing in Slurm.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class UpdateNodes:
    """Set the full feature list (admin features kept, ``fy_`` features replaced) and weight of a node group.

    One ``scontrol update NodeName=<hostlist> AvailableFeatures=... ActiveFeatures=... Weight=...`` per
    group: the number of Slurm calls grows with distinct (features, weight) groups, not with nodes.
    """

    nodes: tuple[str, ...]
    features: tuple[str, ...]
    weight: int

    @property
    def kind(self) -> str:
        return "update"


@dataclass(frozen=True, slots=True)
class DrainNode:
    """Drain a node with a reason FleetYield owns, requeueing the listed jobs (those that allow it)."""

    node: str
    reason: str
    requeue_jobs: tuple[int, ...] = ()
    cause: str = "fatal"  # fatal | approved | rehab | retire | needs_human

    @property
    def kind(self) -> str:
        return "drain"


@dataclass(frozen=True, slots=True)
class RequeueJobs:
    """Requeue running jobs (``scontrol requeue``: back to PENDING, restarting from their last checkpoint) off
    ``node`` so that the pending ``for_job`` can start there (core/reclaim.py). Idempotent: a job already
    pending or gone is no longer listed next tick, and Slurm refuses to requeue a pending job harmlessly."""

    node: str
    jobs: tuple[int, ...]
    for_job: int
    reason: str

    @property
    def kind(self) -> str:
        return "requeue"


@dataclass(frozen=True, slots=True)
class SignalJobs:
    """Ask running jobs on ``node`` to checkpoint: ``scancel --signal=<signal> <job>`` (every step of the
    job, not the batch shell; ``--batch`` for ``target`` batch). Only for jobs of a class that follows the
    checkpoint-signal convention
    (``stake.classes.<class>.checkpoint_signals``; README "Checkpoint signals"):
    - ``USR2``: checkpoint now and keep running. Sent with a drain proposal: not destructive, so it does not
      wait for the approval, and a fault before the approval loses only what came after it;
    - ``USR1``: checkpoint, then requeue yourself (``scontrol requeue $SLURM_JOB_ID``, the convention of
      PyTorch Lightning's SLURM auto-requeue). Sent right after an approved drain (plan order), instead of
      requeueing the job: it restarts elsewhere from a checkpoint taken now, not from the last periodic one.
    Idempotent in effect: a second signal costs one more checkpoint write."""

    node: str
    jobs: tuple[int, ...]
    signal: str  # USR2 | USR1
    reason: str
    target: str = "steps"  # steps: the job's srun steps | batch: the batch script (scancel --batch)

    @property
    def kind(self) -> str:
        return "signal"


@dataclass(frozen=True, slots=True)
class ResumeNode:
    """Resume a node FleetYield drained itself (never one drained by someone else)."""

    node: str
    reason: str

    @property
    def kind(self) -> str:
        return "resume"


@dataclass(frozen=True, slots=True)
class ResetGpu:
    """Ask the node's agent to reset GPUs (the fake backend clears faults its scenario says a reset fixes).

    Not idempotent like the actions above (see core/rehab_actions.py): emitted once, on the transition, with
    an ``intent`` the executor records before acting and checks after a crash (never acted on twice)."""

    node: str
    gpus: tuple[int, ...]  # () = every GPU of the node (the faulty one is unknown)
    reason: str
    intent: str = ""  # the decision's identity (core/lifecycle.py): the executor acts once per intent

    @property
    def kind(self) -> str:
        return "reset_gpu"


@dataclass(frozen=True, slots=True)
class RebootNode:
    """Reboot a node Slurm shows drained by us; the drain and our reason survive the reboot."""

    node: str
    reason: str
    next_state: str | None = None  # None: keep DRAIN (see core/rehab_actions.py before changing it)
    intent: str = ""  # the decision's identity (core/lifecycle.py): the executor acts once per intent

    @property
    def kind(self) -> str:
        return "reboot"


@dataclass(frozen=True, slots=True)
class PowerCycle:
    """Power cycle through the BMC (Redfish). Emitted only when ``power_cycle_enabled``."""

    node: str
    reason: str
    intent: str = ""  # the decision's identity (core/lifecycle.py): the executor acts once per intent

    @property
    def kind(self) -> str:
        return "power_cycle"


@dataclass(frozen=True, slots=True)
class SubmitCanary:
    """Submit ``count`` short canary jobs pinned to ``node``; ``token`` names this canary round.

    Outcomes come back as ``CanaryResult``s carrying the token, read from the jobs' name
    (``fy_canary_<token>``): a result of an older round never counts, even after a controller restart.
    """

    node: str
    count: int
    token: str
    time_limit_s: float

    @property
    def job_name(self) -> str:
        return f"fy_canary_{self.token}"

    @property
    def kind(self) -> str:
        return "submit_canary"


@dataclass(frozen=True, slots=True)
class CancelCanaries:
    """Cancel the canary jobs of an abandoned round (the node failed, or left our hands)."""

    node: str
    token: str

    @property
    def job_name(self) -> str:
        return f"fy_canary_{self.token}"

    @property
    def kind(self) -> str:
        return "cancel_canary"


@dataclass(frozen=True, slots=True)
class ProposeDrain:
    """Ask a human to approve draining a degrading node (the shell stores a ``gate.proposal.Proposal``).

    Emitted once, on the tick the proposal opens; the node keeps running its jobs until an approve
    ``GateDecision`` comes back. ``evidence`` is the ``explain`` text of the node at proposal time."""

    proposal_id: str  # p-<12 hex>
    node: str
    gpus: tuple[int, ...]  # indices of the degrading GPUs
    risk: float
    evidence: str
    affected_jobs: tuple[int, ...]
    expires_at: float

    @property
    def kind(self) -> str:
        return "propose_drain"


@dataclass(frozen=True, slots=True)
class WithdrawProposal:
    """Close an open proposal without a decision. ``reason`` starts with one of: ``risk_fell:``,
    ``quarantined:`` (a fatal fault drained it), ``settled_by_admin:`` (an admin drain naming it),
    ``drained:`` (drained by someone else, not naming it), ``gone:`` (node unknown to Slurm)."""

    proposal_id: str
    node: str
    reason: str

    @property
    def kind(self) -> str:
        return "withdraw_proposal"


Action = (
    UpdateNodes
    | DrainNode
    | RequeueJobs
    | SignalJobs
    | ResumeNode
    | ResetGpu
    | RebootNode
    | PowerCycle
    | SubmitCanary
    | CancelCanaries
    | ProposeDrain
    | WithdrawProposal
)
"""Everything a plan may hold, in plan order: updates, drains, reclaim requeues, lifecycle actions,
proposals."""


@dataclass(frozen=True, slots=True)
class Hold:
    """A destructive action withheld by a safety rule (drain cap, stale data). Alerted, never executed."""

    node: str
    action: str
    rule: str
    detail: str


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Action, ...] = ()
    holds: tuple[Hold, ...] = ()

    def of_kind(self, kind: str) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.kind == kind)

    @property
    def empty(self) -> bool:
        return not self.actions
