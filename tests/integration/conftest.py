"""Fixtures for the docker Slurm cluster tests (contrib/slurm-docker-cluster).

The session fixture ``cluster`` makes sure the cluster is up: when ``sinfo`` inside the
``slurmctld`` container does not answer it runs ``up.sh``.  It never tears the cluster down
(``make down`` / ``.ci/run`` does), so a cluster you started by hand survives the tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = REPO_ROOT / "contrib" / "slurm-docker-cluster"
NODES = {
    "gpu-h100-1": "h100",
    "gpu-h100-2": "h100",
    "gpu-l40s-1": "l40s",
    "gpu-l40s-2": "l40s",
}
AGENT_PORT = 9400
AGENT_STATE_DIR = "/var/lib/fleetyield-agent"
UP_TIMEOUT_S = float(os.environ.get("FLEETYIELD_UP_TIMEOUT", "1500"))

T = TypeVar("T")


def _docker_binary() -> str:
    """First docker client that talks to the daemon (an old /usr/local/bin/docker may shadow)."""
    candidates = [shutil.which("docker"), "/usr/bin/docker"]
    for cand in candidates:
        if cand and Path(cand).exists():
            ok = subprocess.run([cand, "info"], capture_output=True, timeout=60).returncode == 0
            if ok:
                return cand
    return candidates[0] or "docker"


def poll(
    fn: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.5,
    what: str = "condition",
) -> T:
    """Call ``fn`` until it returns something truthy; fail with the last value/error at the deadline."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = fn()
            if result:
                return result
            last = result
        except (AssertionError, subprocess.SubprocessError, ValueError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


@dataclass
class Cluster:
    """Handle on the running cluster, handed to tests by the ``cluster`` fixture."""

    docker: str
    dir: Path = CLUSTER_DIR
    nodes: tuple[tuple[str, str], ...] = tuple(NODES.items())  # (node, gpu model)
    agent_state_dir: str = AGENT_STATE_DIR
    poll = staticmethod(poll)

    def exec(
        self, container: str, *cmd: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """``docker exec CONTAINER CMD...``; raises with stdout/stderr when check and it fails."""
        proc = subprocess.run(
            [self.docker, "exec", container, *cmd], capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"docker exec {container} {' '.join(cmd)} -> {proc.returncode}\n"
                f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def sh(self, container: str, script: str, **kw) -> str:
        return self.exec(container, "bash", "-c", script, **kw).stdout

    def ctl(self, *cmd: str, **kw) -> str:
        """Run a Slurm client command on slurmctld and return its stdout."""
        return self.exec("slurmctld", *cmd, **kw).stdout

    def node_info(self) -> dict[str, dict[str, str]]:
        """``scontrol show node -o`` parsed into {node: {key: value}}."""
        nodes: dict[str, dict[str, str]] = {}
        for line in self.ctl("scontrol", "show", "node", "-o").splitlines():
            fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            if "NodeName" in fields:
                nodes[fields["NodeName"]] = fields
        return nodes

    def metrics(self, node: str, *, from_container: str = "slurmctld") -> str:
        """The node agent's /metrics, fetched over the cluster network."""
        return self.exec(
            from_container, "curl", "-fsS", "--max-time", "5", f"http://{node}:{AGENT_PORT}/metrics"
        ).stdout


def _cluster_answers(docker: str) -> bool:
    try:
        proc = subprocess.run(
            [docker, "exec", "slurmctld", "sinfo", "-h", "-N", "-o", "%N %t"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and all(node in proc.stdout for node in NODES)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if os.environ.get("FLEETYIELD_SKIP_INTEGRATION"):
        pytest.skip("FLEETYIELD_SKIP_INTEGRATION is set")
    docker = _docker_binary()
    if not _cluster_answers(docker):
        # Not ours to tear down afterwards either way: `make down` / .ci/run does that.
        proc = subprocess.run([str(CLUSTER_DIR / "up.sh")], timeout=UP_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            pytest.fail(f"{CLUSTER_DIR}/up.sh failed with status {proc.returncode}")
        docker = _docker_binary()
    return Cluster(docker=docker)
