"""Fixtures for the docker Slurm cluster tests (contrib/slurm-docker-cluster).

The session fixture ``cluster`` makes sure the cluster is up: when ``sinfo`` inside the
``slurmctld`` container does not answer it runs ``up.sh``.  It never tears the cluster down
(``make down`` / ``.ci/run`` does), so a cluster you started by hand survives the tests.

``Cluster.reset_world()`` puts the cluster back into its clean state (no jobs, no faults, no drains,
a controller with an empty store that has labelled every node green); the function fixture ``world``
runs it around each test that asks for it (test_closed_loop.py, test_rehab_gate_ledger.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
CONTROLLER = "fleetyield"  # the controller's container (and host name on the cluster network)
API_URL = "http://fleetyield:9401"
# What the controller writes on a healthy node of each model (admin features first, then fy_*).
CLEAN_FEATURES = {
    "h100": (
        "h100,nvlink,fy_hbm_full,fy_nvlink_full,fy_ok_batch,fy_ok_finetune,fy_ok_gang,fy_ok_preempt,"
        "fy_ok_train,fy_premium,fy_tier_green"
    ),
    "l40s": (
        "l40s,fy_hbm_full,fy_nonpremium,fy_ok_batch,fy_ok_decode,fy_ok_finetune,fy_ok_gang,fy_ok_preempt,"
        "fy_ok_train,fy_tier_green"
    ),
}
CLEAN_WEIGHT = {"h100": "1100", "l40s": "100"}  # green 100 + premium offset 1000 on the H100s
UP_TIMEOUT_S = float(os.environ.get("FLEETYIELD_UP_TIMEOUT", "1500"))
CONTROLLER_CONFIG = "/etc/fleetyield/fleetyield.toml"
REST_SLURM_TABLE = """[slurm]
adapter = "rest"
rest_url = "http://slurmctld:6820"
rest_user = "root"
rest_token_file = "/shared/slurmrest/token"
"""

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
    # Set by the fixtures that leave the cluster clean (``world``, test_attestation's ``attested``): the next
    # ``world`` can skip its reset before the test.
    _fy_clean: bool = field(default=False, init=False, repr=False)

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

    def write_file(self, container: str, path: str, text: str, *, private: bool = False) -> None:
        """Write ``text`` to ``path`` inside the container (``umask 077`` first with ``private``)."""
        script = f"umask 077; cat > {path}" if private else f"cat > {path}"
        subprocess.run(
            [self.docker, "exec", "-i", container, "bash", "-c", script],
            input=text,
            text=True,
            check=True,
            timeout=30,
        )

    def sh(self, container: str, script: str, **kw) -> str:
        return self.exec(container, "bash", "-c", script, **kw).stdout

    def ctl(self, *cmd: str, **kw) -> str:
        """Run a Slurm client command on slurmctld and return its stdout."""
        return self.exec("slurmctld", *cmd, **kw).stdout

    def node_info(self) -> dict[str, dict[str, str]]:
        """``scontrol show node -o`` parsed into {node: {key: value}} (values may hold spaces: Reason)."""
        from slurm_fleetyield.adapters.slurm import parse_kv_line

        nodes: dict[str, dict[str, str]] = {}
        for line in self.ctl("scontrol", "show", "node", "-o").splitlines():
            fields = parse_kv_line(line)
            if "NodeName" in fields:
                nodes[fields["NodeName"]] = fields
        return nodes

    # -- FleetYield ------------------------------------------------------------------------------

    def agent(self, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``fleetyield-agent ARGS --state-dir ...`` on NODE (e.g. ``"fault", "inject", "--gpu", "3"``)."""
        return self.exec(node, "fleetyield-agent", *args, "--state-dir", self.agent_state_dir, check=check)

    def api(self, path: str) -> Any:
        """GET the controller's read-only API from inside the cluster network (JSON)."""
        return json.loads(self.ctl("curl", "-fsS", "--max-time", "5", f"{API_URL}{path}"))

    def api_text(self, path: str) -> str:
        return self.ctl("curl", "-fsS", "--max-time", "5", f"{API_URL}{path}")

    def job_gpus(self, job_id: str) -> list[int]:
        """The GPU indices a running single-node job holds, as Slurm says (``scontrol show job -d``: IDX)."""
        from slurm_fleetyield.adapters.slurm import gpu_indices

        detail = self.ctl("scontrol", "show", "job", "-d", job_id)
        m = re.search(r"\bGRES=(\S*IDX:[^)]*\))", detail)
        idx = gpu_indices(m.group(1)) if m else None
        assert idx, detail
        return list(idx)

    def rows(self) -> dict[str, dict[str, Any]]:
        """The controller's fleet table from its last committed tick: {node: row}."""
        return {r["node"]: r for r in self.api("/v1/nodes")}

    def tick(self) -> int:
        return int(self.api("/v1/status").get("tick", 0))

    def wait_ticks(self, n: int, *, timeout: float = 30) -> int:
        """Wait until the controller has committed ``n`` more ticks; returns the tick number reached."""
        start = self.tick()
        return self.poll(
            lambda: (t := self.tick()) >= start + n and t,
            timeout=timeout,
            interval=0.2,
            what=f"{n} controller ticks after tick {start}",
        )

    def fy_service(self, container: str, *args: str) -> None:
        """``fy-service agent|controller stop|start|restart [--wipe]`` (docker/fy-service.sh)."""
        self.exec(container, "fy-service", *args, timeout=60)

    def features(self, node: str) -> str:
        return self.node_info()[node]["AvailableFeatures"]

    @contextlib.contextmanager
    def on_rest_adapter(self) -> Iterator[None]:
        """The controller on ``adapter = "rest"`` (its config's ``[slurm]`` table swapped, the controller
        restarted with an empty store) until the block ends, then the config back and a clean world again.
        Nothing to do when it is on it already (the session's FLEETYIELD_SLURM_ADAPTER=rest)."""
        original = self.sh(CONTROLLER, f"cat {CONTROLLER_CONFIG}")
        if 'adapter = "rest"' in original:
            yield
            return
        new, n = re.subn(r"^\[slurm\]\n", REST_SLURM_TABLE, original, flags=re.MULTILINE)
        assert n == 1, f"{CONTROLLER_CONFIG}: expected one [slurm] table, found {n}"
        self.fy_service(CONTROLLER, "controller", "stop")
        self.write_file(CONTROLLER, CONTROLLER_CONFIG, new)
        try:
            self.reset_world()  # the controller restarted on adapter = "rest"
            yield
        finally:
            self.fy_service(CONTROLLER, "controller", "stop")
            self.write_file(CONTROLLER, CONTROLLER_CONFIG, original)
            self.reset_world()

    def reset_world(self, timeout: float = 120) -> None:
        """Back to a clean cluster: no jobs, no faults, no drains, features/weights of a healthy fleet
        written by a controller with an empty store.  ~3 s."""
        jobs = self.ctl("squeue", "-h", "-o", "%A").split()
        if jobs:
            self.exec("slurmctld", "scancel", *jobs, check=False)
        self.fy_service(CONTROLLER, "controller", "stop")
        self.wait_no_reboot(timeout)
        # Fresh fake GPUs (faults, counters, fatal.json and the push spool gone), slurmd untouched.
        with ThreadPoolExecutor(len(NODES)) as pool:
            list(pool.map(lambda n: self.fy_service(n, "agent", "restart", "--wipe"), NODES))
        self.poll(
            lambda: not self.ctl("squeue", "-h", "-o", "%A").split(),
            timeout=timeout,
            interval=0.2,
            what="an empty job queue",
        )
        self.wait_no_reboot(timeout)
        for node, fields in self.node_info().items():
            state = fields.get("State", "")
            if "DRAIN" in state or "DOWN" in state or "FAIL" in state:
                self.ctl("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        for node in NODES:  # agents answer before the controller's first scrape (no UNKNOWN blip)
            self.poll(lambda n=node: self.metrics(n), timeout=60, interval=0.1, what=f"{node}'s agent")
        self.fy_service(CONTROLLER, "controller", "restart", "--wipe")
        self.poll(self.world_is_clean, timeout=timeout, interval=0.2, what="a clean, labelled cluster")

    def wait_no_reboot(self, timeout: float = 120) -> None:
        """Until no node is rebooting (the ladder's ``scontrol reboot``: fleetyield-docker-reboot restarts
        the node's container) or not responding: such a node can be neither exec'd into nor resumed."""

        def settled() -> bool:
            for node in NODES:
                running = subprocess.run(
                    [self.docker, "inspect", "-f", "{{.State.Running}}", node], capture_output=True, text=True
                ).stdout.strip()
                if running != "true":
                    return False
            states = [f.get("State", "") for f in self.node_info().values()]
            return not any(
                w in st for st in states for w in ("REBOOT", "NOT_RESPONDING", "POWERING", "UNKNOWN")
            )

        self.poll(settled, timeout=timeout, interval=0.2, what="no node rebooting or not responding")

    def world_is_clean(self) -> bool:
        info = self.node_info()
        for node, model in NODES.items():
            f = info.get(node, {})
            if f.get("State") != "IDLE":
                return False
            if f.get("AvailableFeatures") != CLEAN_FEATURES[model] or f.get("Weight") != CLEAN_WEIGHT[model]:
                return False
        try:
            status = self.api("/v1/status")
        except (AssertionError, ValueError):
            return False  # the controller's API is not up yet
        return (
            status.get("summary", {}).get("tiers") == {"green": len(NODES)}
            and status["summary"]["scrape_errors"] == 0
            and not status["plan"]["holds"]
        )

    def inject_and_time_drain(
        self, node: str, *, gpu: int = 3, xid: int = 79, timeout: float = 20, reset_fixes: bool | None = None
    ) -> dict[str, float]:
        """Inject XID ``xid`` on ``node`` and time it until ``scontrol show node`` shows DRAIN.
        ``reset_fixes``: whether a reset clears the fault (None: the fake backend's default for the XID;
        False: the node cannot come back through rehabilitation).

        The DRAIN is watched by a loop INSIDE slurmctld (scontrol every 20 ms), so the measurement does
        not include a ``docker exec`` per poll; containers share the host clock.  Returns seconds from
        the start of the injection command to: the command's return (``inject_s``: docker exec + the
        agent CLI) and the first scontrol output showing DRAIN (``drain_s``).
        """
        watch = (
            f"echo ready; until scontrol show node {node} | grep -q '^   State=[A-Z_+]*DRAIN'; "
            "do sleep 0.02; done; date +%s.%N"
        )
        poller = subprocess.Popen(
            [self.docker, "exec", "slurmctld", "bash", "-c", watch], stdout=subprocess.PIPE, text=True
        )
        try:
            assert poller.stdout is not None
            assert poller.stdout.readline().strip() == "ready"
            t0 = time.time()
            fixes = () if reset_fixes is None else ("--reset-fixes" if reset_fixes else "--no-reset-fixes",)
            self.agent(node, "fault", "inject", "--gpu", str(gpu), "--xid", str(xid), *fixes)
            t1 = time.time()
            out, _ = poller.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            poller.kill()
            pytest.fail(f"{node} not DRAIN within {timeout} s of XID {xid}")
        finally:
            if poller.poll() is None:
                poller.kill()
        return {"inject_s": t1 - t0, "drain_s": float(out.strip()) - t0}

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
def cluster() -> Iterator[Cluster]:
    if os.environ.get("FLEETYIELD_SKIP_INTEGRATION"):
        pytest.skip("FLEETYIELD_SKIP_INTEGRATION is set")
    docker = _docker_binary()
    if not _cluster_answers(docker):
        # Not ours to tear down afterwards either way: `make down` / .ci/run does that.
        proc = subprocess.run([str(CLUSTER_DIR / "up.sh")], timeout=UP_TIMEOUT_S, check=False)
        if proc.returncode != 0:
            pytest.fail(f"{CLUSTER_DIR}/up.sh failed with status {proc.returncode}")
        docker = _docker_binary()
    c = Cluster(docker=docker)
    # FLEETYIELD_SLURM_ADAPTER=rest (`make test-rest`): the whole session's controller drives Slurm through
    # slurmrestd (auth/jwt) instead of the CLI, so the closed-loop tests run on that adapter too.
    adapter = os.environ.get("FLEETYIELD_SLURM_ADAPTER", "cli")
    assert adapter in ("cli", "rest"), f"FLEETYIELD_SLURM_ADAPTER must be cli or rest, not {adapter!r}"
    with c.on_rest_adapter() if adapter == "rest" else contextlib.nullcontext():
        yield c


@pytest.fixture
def world(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster, clean before the test (once per session at least) and restored after it.

    A module whose tests need more (another controller config, attestation on) defines its own ``world``,
    which overrides this one.
    """
    if not cluster._fy_clean:
        cluster.reset_world()
    cluster._fy_clean = False
    yield cluster
    cluster.reset_world()
    cluster._fy_clean = True
