"""The backend interface every GPU source implements (fake and nvml).

Input: a clock value ``now`` (unix seconds) per call. Output: ``GpuSample`` objects, one
per GPU *visible* at that moment, holding DCGM-named field values (a field a GPU does not
support is simply absent, as dcgm-exporter omits blank values), plus XID history, and
``AgentEvent``s for resets. ``load_backend_class`` imports a backend lazily by name.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from node_agent.protocol import AgentEvent

EventCallback = Callable[[list[AgentEvent]], None]


class BackendError(RuntimeError):
    """The backend cannot start or cannot do what was asked; the message says why."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    pci_bus_id: str
    device: str
    model_name: str


@dataclass
class GpuSample:
    info: GpuInfo
    values: dict[str, float]
    last_xid: int = 0
    xid_log: list[tuple[float, int]] = field(default_factory=list)
    xid_totals: dict[int, int] = field(default_factory=dict)


class Backend(abc.ABC):
    name: str = "base"

    def __init__(self) -> None:
        self._callback: EventCallback | None = None

    def set_event_callback(self, callback: EventCallback) -> None:
        """Called (from any thread) with events the backend detects on its own (NVML XIDs)."""
        self._callback = callback

    def _emit(self, events: list[AgentEvent]) -> None:
        if events and self._callback is not None:
            self._callback(events)

    @abc.abstractmethod
    def start(self) -> None: ...

    def stop(self) -> None:  # noqa: B027 - optional hook
        pass

    def supervised(self) -> list[Any]:
        """The backend's supervised threads (``node_agent.supervise.Supervised``), for health and metrics."""
        return []

    def heartbeats(self) -> list[Any]:
        """The backend's loops (``node_agent.supervise.Heartbeat``): a stale one fails the scrape."""
        return []

    def infos(self) -> list[GpuInfo]:
        """Identity of every GPU the backend knows (visible or not); empty where it cannot say."""
        return []

    @abc.abstractmethod
    def driver_version(self) -> str: ...

    @abc.abstractmethod
    def expected_gpus(self) -> int: ...

    @abc.abstractmethod
    def sample(self, now: float) -> list[GpuSample]: ...

    @abc.abstractmethod
    def reset_gpu(self, index: int, now: float) -> list[AgentEvent]: ...


_BACKENDS = {"fake": "node_agent.backends.fake:FakeBackend", "nvml": "node_agent.backends.nvml:NvmlBackend"}


def load_backend_class(name: str) -> type[Backend]:
    try:
        module_name, cls_name = _BACKENDS[name].split(":")
    except KeyError:
        raise BackendError(
            f"unknown backend {name!r}; choose one of {', '.join(sorted(_BACKENDS))}"
        ) from None
    return getattr(importlib.import_module(module_name), cls_name)
