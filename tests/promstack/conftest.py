"""Fixtures for the tests that run a real Prometheus / Alertmanager on 127.0.0.1 (tests/promstack/stack.py).

Binaries: Debian's ``prometheus`` and ``prometheus-alertmanager`` packages (``.ci/run`` installs them). When
they are missing the tests skip with the reason, except under CI (``CI=true``), where they fail: CI must
never pass by skipping them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from promstack.stack import Agent, Prometheus, binaries


@pytest.fixture(scope="session")
def stack_bins() -> dict[str, str]:
    found = binaries()
    missing = [name for name, path in found.items() if path is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (apt-get install prometheus prometheus-alertmanager)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    return {k: v for k, v in found.items() if v}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("promstack")


@pytest.fixture(scope="module")
def fleet(stack_bins: dict[str, str], workdir: Path) -> Iterator[dict[str, Agent]]:
    """Three fake agents (2 GPUs each) with faults: XID 48 on gpu-a, XID 79 (GPU gone) on gpu-b,
    baked ECC/NVLink counters on gpu-c (a degrade fault cleared: its counts stay)."""
    agents = {
        name: Agent(name, workdir, gpus=2, seed=i + 1) for i, name in enumerate(("gpu-a", "gpu-b", "gpu-c"))
    }
    try:
        for a in agents.values():
            a.start()
        agents["gpu-a"].inject_xid(0, 48)
        agents["gpu-b"].inject_xid(1, 79)
        agents["gpu-c"].cli("fault", "degrade", "--gpu", "1", "--mode", "ecc", "--rate", "500")
        agents["gpu-c"].cli("fault", "degrade", "--gpu", "0", "--mode", "nvlink_crc", "--rate", "2000")
        import time

        time.sleep(0.5)
        agents["gpu-c"].cli("fault", "clear", "--all")
        yield agents
    finally:
        for a in agents.values():
            a.stop()


@pytest.fixture(scope="module")
def prometheus(stack_bins: dict[str, str], workdir: Path, fleet: dict[str, Agent]) -> Iterator[Prometheus]:
    prom = Prometheus(stack_bins["prometheus"], workdir, targets=[a.target for a in fleet.values()])
    try:
        prom.start()
        prom.wait_targets_up(len(fleet))
        yield prom
    finally:
        prom.stop()
