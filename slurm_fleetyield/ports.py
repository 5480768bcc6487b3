"""The small interfaces between the imperative shell and the world.

Input/output: each port names what the daemon (and the simulator) needs from one outside system. Adapters in
``slurm_fleetyield/adapters`` implement them against real systems (Slurm's CLI, agents' /metrics, Prometheus,
SQLite); ``slurm_fleetyield/sim`` implements the Slurm port in memory. The decision core never sees a port: it
receives ``Observations`` and returns a ``Plan``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from slurm_fleetyield.core.model import FatalEvent, JobView, NodeSample, SlurmNode
from slurm_fleetyield.core.plan import Action, Plan


@dataclass(frozen=True, slots=True)
class ActionResult:
    action: Action
    ok: bool
    command: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ApplyReport:
    results: tuple[ActionResult, ...] = field(default_factory=tuple)
    calls: int = 0  # number of Slurm commands executed

    @property
    def failed(self) -> tuple[ActionResult, ...]:
        return tuple(r for r in self.results if not r.ok)


class SlurmPort(Protocol):
    """Read Slurm's view and apply a plan. Implemented by the CLI adapter and the simulator's cluster."""

    def read_nodes(self) -> Mapping[str, SlurmNode]: ...

    def read_jobs(self) -> Sequence[JobView]: ...

    def apply(self, plan: Plan) -> ApplyReport: ...


class SensePort(Protocol):
    """Sample GPU telemetry of the given nodes (direct agent scrape, or Prometheus queries)."""

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]: ...


class EventInbox(Protocol):
    """Fatal events pushed since the last tick (agents, Alertmanager). Durable until acknowledged."""

    def pending(self) -> Sequence[FatalEvent]: ...

    def acknowledge(self, event_ids: Sequence[str]) -> None: ...
