"""fleetyield-healthcheck as the docker cluster's HealthCheckProgram (slurm/slurm.conf), run by slurmd.

With the controller down, nothing else drains an idle node whose GPU fell off the bus: slurmd's periodic
health check reads the agent's fatal marker and, once the controller has been silent for
``healthcheck_grace_s`` (fleetyield/hooks.conf), drains the node the NHC way; when the event is cleared it
lifts its own mark. The controller's own drains are never its (every closed-loop test runs beside it).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from conftest import REPO_ROOT

pytestmark = pytest.mark.integration

NODE = "gpu-l40s-2"
HOOKS_CONF = REPO_ROOT / "contrib" / "slurm-docker-cluster" / "fleetyield" / "hooks.conf"


def _conf_value(key: str) -> str:
    for line in HOOKS_CONF.read_text().splitlines():
        k, sep, v = line.partition("=")
        if sep and k.strip() == key:
            return v.strip()
    raise AssertionError(f"{HOOKS_CONF}: no {key}")


def test_with_the_controller_down_the_health_check_drains_nhc_style_and_lifts_its_mark(world: Any) -> None:
    grace = float(_conf_value("healthcheck_grace_s"))
    world.fy_service("fleetyield", "controller", "stop")
    t0 = time.time()
    world.agent(NODE, "fault", "inject", "--gpu", "3", "--xid", "79")

    def drained() -> dict[str, str] | None:
        f = world.node_info()[NODE]
        return f if "DRAIN" in f.get("State", "") else None

    f = world.poll(drained, timeout=grace + 60, interval=0.5, what=f"{NODE} drained by the health check")
    waited = time.time() - t0
    assert f.get("Reason", "").startswith("NHC: fleetyield: XID 79"), f
    # it waited out the grace (a controller restart is not an outage): the grace starts at its first run
    # that saw the event, which is after the injection
    assert waited >= grace - 1, (waited, grace)
    print(f"\nXID 79 with the controller down -> NHC-style drain after {waited:.1f} s (grace {grace:g} s)")
    # A GPU reset clears the event; the next health check lifts its own mark.
    world.agent(NODE, "reset", "--gpu", "3")
    world.poll(
        lambda: "DRAIN" not in world.node_info()[NODE].get("State", ""),
        timeout=60,
        interval=0.5,
        what=f"{NODE} resumed by the health check",
    )
