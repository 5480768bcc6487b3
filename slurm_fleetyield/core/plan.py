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
    cause: str = "fatal"  # fatal | approved | retire

    @property
    def kind(self) -> str:
        return "drain"


@dataclass(frozen=True, slots=True)
class ResumeNode:
    """Resume a node FleetYield drained itself (never one drained by someone else)."""

    node: str
    reason: str

    @property
    def kind(self) -> str:
        return "resume"


Action = UpdateNodes | DrainNode | ResumeNode


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
