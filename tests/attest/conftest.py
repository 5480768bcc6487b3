"""Fixtures of the attestation tests (helpers live in attest_rig.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from attest_rig import Clock, Controller, make_attestor, make_controller

from node_agent.attest.service import Attestor


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def attestor(tmp_path: Path, clock: Clock) -> Attestor:
    return make_attestor(tmp_path, clock)


@pytest.fixture
def ctl(tmp_path: Path, attestor: Attestor, clock: Clock) -> Controller:
    """A controller with the node enrolled and a policy learnt from its (golden) state."""
    c = make_controller(tmp_path)
    c.enroll(attestor)
    c.learn_from(attestor, clock.now)
    return c
