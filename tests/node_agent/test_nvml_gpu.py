"""The nvml backend against a real NVIDIA GPU. Skipped where no driver is loaded (CI, the dev boxes); run on a
GPU machine with ``pytest tests/node_agent/test_nvml_gpu.py``."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.agent import Agent
from node_agent.backends.nvml import NvmlBackend
from node_agent.collector import DCGM_FIELDS
from node_agent.config import AgentConfig
from node_agent.exporter import make_registry
from node_agent.exposition import render
from slurm_fleetyield.adapters.scrape import parse_exposition


def _driver_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception:
        return False
    return True


pytestmark = pytest.mark.skipif(not _driver_present(), reason="no NVIDIA driver on this machine")
NAMES = {name for name, _, _ in DCGM_FIELDS}
CORE = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_TOTAL")


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    b = NvmlBackend("gpu-test-node")
    b.start()
    yield b
    b.stop()


def test_enumerates_gpus_with_identity(backend: NvmlBackend) -> None:
    assert backend.expected_gpus() >= 1
    assert backend.driver_version()
    for info in backend._infos:
        assert info.uuid.startswith("GPU-")
        assert info.device.startswith("nvidia")
        assert info.model_name.startswith("NVIDIA")
        assert ":" in info.pci_bus_id


def test_identity_matches_nvidia_smi(backend: NvmlBackend) -> None:
    """UUID and PCI bus id as nvidia-smi (and so DCGM) print them: joins with dcgm-exporter series work."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not on PATH")
    out = subprocess.run(
        [smi, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    rows = [tuple(part.strip() for part in line.split(",")) for line in out.strip().splitlines()]
    assert [(str(i.index), i.uuid, i.pci_bus_id.upper()) for i in backend.infos()] == [
        (idx, uuid, bus.upper()) for idx, uuid, bus in rows
    ]


def test_samples_hold_plausible_dcgm_fields(backend: NvmlBackend) -> None:
    samples = backend.sample(time.time())
    assert len(samples) == backend.expected_gpus()
    for s in samples:
        assert set(s.values) <= NAMES, set(s.values) - NAMES
        for name in CORE:
            assert name in s.values, name
        assert 0 < s.values["DCGM_FI_DEV_GPU_TEMP"] < 110
        assert 0 < s.values["DCGM_FI_DEV_POWER_USAGE"] < 2000
        assert s.values["DCGM_FI_DEV_FB_TOTAL"] > 1024
        assert s.values["DCGM_FI_DEV_XID_ERRORS"] == 0


def test_controller_parses_the_real_exposition(backend: NvmlBackend, tmp_path: Path) -> None:
    cfg = AgentConfig(backend="nvml", state_dir=tmp_path, hostname="gpu-test-node")
    text = render(make_registry(Agent(backend, tmp_path, "gpu-test-node", time.time), cfg)).decode()
    sample = parse_exposition(text, "gpu-test-node", time.time(), expect_hostname="gpu-test-node")
    assert sample.source == "agent"
    assert sample.expected_gpus == backend.expected_gpus()
    assert [g.index for g in sample.gpus] == [i.index for i in backend._infos]
    assert {g.uuid for g in sample.gpus} == {i.uuid for i in backend._infos}


def test_refresher_keeps_the_slow_counters_moving() -> None:
    """Energy is read by the refresher thread, not by scrapes; an idle GPU still draws power, so its energy
    counter moves within a few intervals."""
    b = NvmlBackend("gpu-test-node", slow_interval_s=0.2)
    b.start()
    try:
        first = b.sample(time.time())[0].values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
        deadline = time.monotonic() + 10
        now = first
        while now == first and time.monotonic() < deadline:
            time.sleep(0.05)
            now = b.sample(time.time())[0].values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
        assert now > first
    finally:
        b.stop()
