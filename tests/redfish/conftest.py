"""Fixtures for the Redfish tests (helpers live in bmc_rig.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("sushy")
pytest.importorskip("sushy_tools")
pytest.importorskip("bcrypt")

from bmc_rig import NODES, STUCK, Emulator, write_credentials


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """One emulator for the session: gpu-01..gpu-14 (each test uses its own nodes) and gpu-stuck."""
    emu = Emulator(tmp_path_factory.mktemp("sushy")).start([*NODES, STUCK], stuck=(STUCK,))
    yield emu
    emu.stop()


@pytest.fixture
def creds_file(tmp_path: Path) -> Path:
    return write_credentials(tmp_path / "bmc.creds")
