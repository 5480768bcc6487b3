"""Test helpers: an injectable clock and an in-process fake agent (``Rig``) with its registry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from node_agent.agent import Agent
from node_agent.backends.fake import FakeBackend
from node_agent.collector import GpuCollector
from node_agent.exposition import render

T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Rig:
    agent: Agent
    backend: FakeBackend
    clock: FakeClock
    registry: CollectorRegistry
    state_dir: Path

    def text(self) -> str:
        return render(self.registry).decode()

    def families(self) -> dict:
        return {f.name: f for f in text_string_to_metric_families(self.text())}

    def value(self, family: str, gpu: int, **labels: str) -> float | None:
        fam = self.families().get(family)
        if fam is None:
            return None
        for s in fam.samples:
            if s.labels.get("gpu") == str(gpu) and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None


def make_rig(
    state_dir: Path,
    gpus: int = 4,
    model: str = "h100",
    seed: int = 1,
    clock: FakeClock | None = None,
    **collector_kw: object,
) -> Rig:
    clock = clock or FakeClock()
    backend = FakeBackend(state_dir, "node-a", gpus=gpus, model=model, seed=seed, clock=clock)
    backend.start()
    agent = Agent(backend, state_dir, "node-a", clock)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(backend, "node-a", clock, **collector_kw))  # type: ignore[arg-type]
    return Rig(agent, backend, clock, registry, state_dir)
