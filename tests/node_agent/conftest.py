"""Fixtures for the node agent tests (helpers live in agent_rig.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_rig import Rig, make_rig


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return make_rig(tmp_path / "state")
