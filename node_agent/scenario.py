"""Seeded fault scenarios: a timeline of faults relative to agent start (JSON or TOML file).

Input: a file like (TOML shown; JSON with the same keys works too)::

    seed = 7                      # optional; defaults to the agent's --seed
    [[events]]
    at_s = 30                     # seconds after agent start
    jitter_s = 10                 # optional: uniform extra delay drawn from the seed
    fault = { kind = "xid", xid = 79, gpu = "random" }   # gpu: index or "random"

Output: a ``Scenario`` whose ``resolve(seed, gpus)`` gives the concrete, ordered
``(time offset, FaultSpec)`` list; identical for the same seed. ``ScenarioRunner.due``
returns the faults due at ``now`` given the persisted progress, so a restart neither
replays nor skips events. Bad files raise ``FaultSpecError`` naming the file and event.
"""

from __future__ import annotations

import hashlib
import json
import random
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node_agent.faults import CorruptFault, DegradeFault, FaultSpecError, XidFault, parse_fault

Spec = XidFault | DegradeFault | CorruptFault


class ScenarioEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    at_s: float = Field(ge=0)
    jitter_s: float = Field(default=0, ge=0)
    fault: dict[str, Any]


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int | None = None
    name: str = "scenario"
    events: list[ScenarioEvent]
    digest: str = ""

    def resolve(self, default_seed: int, gpus: int) -> list[tuple[float, Spec]]:
        seed = self.seed if self.seed is not None else default_seed
        rng = random.Random(f"fleetyield-scenario:{seed}:{self.digest}")
        out: list[tuple[int, float, Spec]] = []
        for n, ev in enumerate(self.events):
            fault = dict(ev.fault)
            gpu: int | Literal["random"] = fault.get("gpu", "random")
            fault["gpu"] = rng.randrange(gpus) if gpu == "random" else gpu
            at = ev.at_s + (rng.uniform(0, ev.jitter_s) if ev.jitter_s else 0.0)
            spec = parse_fault(fault, where=f"scenario event #{n}")
            if spec.gpu >= gpus:
                raise FaultSpecError(f"bad scenario event #{n}: gpu {spec.gpu} but the node has {gpus} GPUs")
            out.append((n, at, spec))
        out.sort(key=lambda t: (t[1], t[0]))
        return [(at, spec) for _, at, spec in out]


def load_scenario(path: Path) -> Scenario:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise FaultSpecError(f"cannot read scenario file {path}: {exc}") from None
    try:
        data = tomllib.loads(raw.decode()) if path.suffix == ".toml" else json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FaultSpecError(
            f"scenario file {path} is not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
        ) from None
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise FaultSpecError(f"bad scenario file {path}: {problems}") from None
    scenario.digest = hashlib.sha256(raw).hexdigest()[:16]
    # Validate every fault now so a bad file is rejected before the agent starts.
    for n, ev in enumerate(scenario.events):
        probe = dict(ev.fault)
        if probe.get("gpu", "random") == "random":
            probe["gpu"] = 0
        parse_fault(probe, where=f"scenario file {path}, event #{n}")
    return scenario


class ScenarioRunner:
    """Tracks which resolved events have been applied (progress persisted by the caller)."""

    def __init__(self, timeline: list[tuple[float, Spec]], started_at: float, applied: int = 0) -> None:
        self.timeline = timeline
        self.started_at = started_at
        self.applied = applied

    def due(self, now: float) -> list[tuple[float, Spec]]:
        out = []
        while self.applied < len(self.timeline) and self.started_at + self.timeline[self.applied][0] <= now:
            at, spec = self.timeline[self.applied]
            out.append((self.started_at + at, spec))
            self.applied += 1
        return out

    def next_time(self) -> float | None:
        if self.applied >= len(self.timeline):
            return None
        return self.started_at + self.timeline[self.applied][0]
