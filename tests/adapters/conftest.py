"""A real tick over captured Slurm output and a captured agent scrape, shared by the read-model tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from slurm_fleetyield.adapters.scrape import parse_exposition
from slurm_fleetyield.adapters.slurm import CommandResult, SlurmCli
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.ports import ActionResult, ApplyReport

FIXTURES = Path(__file__).parent / "fixtures"
NOW = 1_768_212_200.0


@pytest.fixture
def now() -> float:
    return NOW


@pytest.fixture
def tick_parts():
    """(result, report, samples): gpu-01 scraped (2 of 8 GPUs: fatal evidence), gpu-02 drained by us."""
    text = (FIXTURES / "scontrol_show_node_o_22.05_edgecases.txt").read_text()
    nodes = SlurmCli(runner=lambda argv, t: CommandResult(0, text, ""), version=(22, 5, 8)).read_nodes()
    sample = parse_exposition((FIXTURES / "agent_fake_h100_2gpu_xid48.txt").read_text(), "gpu-01", NOW)
    samples = {"gpu-01": sample}
    obs = Observations(time=NOW, slurm=nodes, samples=samples)
    result = tick(ControllerState.empty(), obs, Params(), NOW, random.Random(0))
    results = [ActionResult(a, True, ("scontrol", "update")) for a in result.plan.actions]
    if results:
        results[-1] = ActionResult(results[-1].action, False, ("scontrol", "update", "x"), "rc=1: boom")
    return result, ApplyReport(tuple(results), calls=len(results)), samples
