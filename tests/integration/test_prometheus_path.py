"""XID 79 -> Prometheus -> Alertmanager -> the controller's webhook -> DRAIN, on the docker Slurm cluster.

Prometheus and Alertmanager run on the host (Debian packages, as tests/promstack does) with the shipped
rules; Prometheus scrapes the nodes' agents over the cluster network (container IPs, port 9400) and
Alertmanager POSTs to the controller container's push listener (``/v1/alertmanager``) with a bearer token.
The test gives the controller that token: it writes ``/etc/fleetyield-secret/alertmanager.token`` (0600)
and, when the cluster config lacks it, appends ``[alertmanager] token_file`` to the controller's config,
then restarts the controller. ``clean_world`` afterwards puts the cluster back as usual.

The agent also pushes XID 79 itself, so the drain alone does not prove the alert path: the test requires
an inbox row with ``source = "alertmanager"`` for the node as well. The controller is stopped from the fault
until the alert fires (the test's docstring says why), so the figures printed are fault -> firing and
controller start -> DRAIN / -> alert stored; ``bench/bench_alert_drain.py`` measures the live path.

Run (cluster up, nobody else using it): ``.venv/bin/pytest tests/integration/test_prometheus_path.py -s``
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from promstack.stack import Alertmanager, Prometheus, binaries, write_token

pytestmark = pytest.mark.integration

NODE = "gpu-h100-1"
TOKEN = "integration-alertmanager-token"
TOKEN_PATH = "/etc/fleetyield-secret/alertmanager.token"
CONFIG_PATH = "/etc/fleetyield/fleetyield.toml"
AGENTS = ("gpu-h100-1", "gpu-h100-2", "gpu-l40s-1", "gpu-l40s-2")


def _ip(cluster: Any, container: str) -> str:
    return subprocess.run(
        [
            cluster.docker,
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
            container,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()[0]


@pytest.fixture
def world(cluster: Any) -> Iterator[Any]:
    """The cluster, clean before and after (as tests/integration/test_closed_loop.py does)."""
    cluster.reset_world()
    yield cluster
    cluster.reset_world()


@pytest.fixture
def alert_stack(world: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    bins = binaries()
    if not bins["prometheus"] or not bins["alertmanager"]:
        pytest.fail("prometheus / prometheus-alertmanager not installed (.ci/run installs them)")
    cluster = world
    cluster.sh(
        "fleetyield",
        f"umask 077; printf %s {TOKEN} > {TOKEN_PATH}; "
        f"grep -q '^\\[alertmanager\\]' {CONFIG_PATH} || "
        f"printf '\\n[alertmanager]\\ntoken_file = \"{TOKEN_PATH}\"\\n' >> {CONFIG_PATH}",
    )
    cluster.fy_service("fleetyield", "controller", "restart")
    controller = _ip(cluster, "fleetyield")
    token_file = write_token(tmp_path / "am.token", TOKEN)
    am = Alertmanager(
        bins["alertmanager"], tmp_path, f"http://{controller}:9402/v1/alertmanager", token_file
    ).start()
    prom = Prometheus(
        bins["prometheus"],
        tmp_path,
        targets=[f"{_ip(cluster, n)}:9400" for n in AGENTS],
        alertmanager=f"127.0.0.1:{am.port}",
    ).start()
    try:
        prom.wait_targets_up(len(AGENTS))
        prom.wait_alertmanagers()
        yield {"prom": prom, "am": am}
    finally:
        prom.stop()
        am.stop()


def _inbox_sources(cluster: Any, node: str) -> list[str]:
    query = f"SELECT payload FROM inbox WHERE node = '{node}'"
    script = (
        "import json, sqlite3; c = sqlite3.connect('/var/lib/fleetyield/fleetyield.db'); "
        f'print(json.dumps([json.loads(p)["source"] for (p,) in c.execute("{query}")]))'
    )
    return json.loads(cluster.exec("fleetyield", "python3", "-c", script).stdout)


def test_xid79_through_prometheus_and_alertmanager_drains(world: Any, alert_stack: dict[str, Any]) -> None:
    """The controller is stopped until Prometheus fires the alert. Running, it drains on the agent's own
    push within ~0.3 s and its ladder reboots the node (~4 s in docker), which brings the GPU back, so the
    alert races the remediation. A clean-clone rehearsal at 98ded2c drained but stored no alert in 60 s;
    that race is the likely cause, not a proven one (the old test then passed 3 of 3 in isolation and 3 of
    3 beside three CPU hogs). Started after the alert fires, the controller gets the spooled push and
    Alertmanager's retried notification; the inbox row proves the alert path."""
    prom: Prometheus = alert_stack["prom"]
    firing = f'ALERTS{{alertname="FleetYieldGpuMissing", node="{NODE}", alertstate="firing"}}'
    world.fy_service("fleetyield", "controller", "stop")
    t0 = time.time()
    world.agent(NODE, "fault", "inject", "--gpu", "1", "--xid", "79")
    fired = world.poll(
        lambda: prom.query(firing)["data"]["result"] and time.time(),
        timeout=60,
        interval=0.2,
        what="FleetYieldGpuMissing firing in Prometheus",
    )
    world.fy_service("fleetyield", "controller", "start")
    drained = world.poll(
        lambda: "DRAIN" in world.node_info()[NODE].get("State", "") and time.time(),
        timeout=60,
        interval=0.1,
        what=f"{NODE} drained",
    )
    stored = world.poll(
        lambda: "alertmanager" in _inbox_sources(world, NODE) and time.time(),
        timeout=60,
        interval=0.5,
        what="the alert's FatalEvent in the controller's inbox",
    )
    print(
        f"\nXID 79 -> alert firing {fired - t0:.2f} s; controller started -> DRAIN {drained - fired:.2f} s, "
        f"-> alert stored {stored - fired:.2f} s"
    )
