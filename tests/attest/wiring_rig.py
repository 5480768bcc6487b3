"""Helpers of the wiring tests: a real ``fleetyield-agent serve`` process, the controller's real push
listener with the ``AttestService``, the hooks run as slurmd runs them (the agent process and the recorded
Slurm seam are ``tests/rig.py``'s)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attest_rig import PYTHON_ENV, make_root
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from rig import AGENT, AgentProcess, write_secret

from node_agent import control
from node_agent.attest.measure import MeasureSpec, quick_records
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.attest.baseline import learn
from slurm_fleetyield.attest.policy import Policy
from slurm_fleetyield.attest.store import AttestStore
from slurm_fleetyield.attest.verify import AttestService, decode_pubkey_line
from slurm_fleetyield.core.model import NodeSample
from slurm_fleetyield.gate.keys import format_public_line

SECRET = b"wiring-test-secret-0123456789"
NODE = "gpu-node-07"


def secret_file(tmp: Path) -> Path:
    return write_secret(tmp / "push.secret", SECRET)


class Controller:
    """The controller side: AttestService + the real push listener serving /v1/attest/*."""

    def __init__(self, tmp: Path) -> None:
        (tmp / "ctl").mkdir(parents=True, exist_ok=True)
        self.key = Ed25519PrivateKey.generate()
        self.pub = tmp / "ctl" / "fy-attest.pub"
        self.pub.write_text(format_public_line("fy-attest", self.key.public_key()) + "\n")
        self.service = AttestService(AttestStore(tmp / "ctl" / "attest.db"), Policy(), self.key)
        self.store = Store(tmp / "ctl" / "fy.db")
        self.wake = threading.Event()
        self.ingest = IngestServer("127.0.0.1", 0, SECRET, self.store, self.wake, attest=self.service)
        self.ingest.start()
        self.url = f"http://127.0.0.1:{self.ingest.port}"

    def enroll(self, line: str, node_class: str = "h100") -> None:
        b64, key_id = decode_pubkey_line(line)
        node = line.split()[2]
        self.service.store.enroll(node, b64, key_id, node_class, None, time.time())

    def learn(self, quote: Mapping[str, Any], node_class: str = "h100") -> None:
        self.service.policy = learn(quote, node_class, self.service.policy)

    def close(self) -> None:
        self.ingest.stop()
        self.store.close()
        self.service.store.close()


class AgentProc(AgentProcess):
    """``fleetyield-agent serve --backend fake`` with an [attest] table measuring a fixture root."""

    ready_path = "/healthz"

    def __init__(self, tmp: Path, node: str = NODE, ctl: Controller | None = None) -> None:
        root = tmp / "root"
        if not root.exists():
            make_root(root)
        lines = ["[attest]", f'root = "{root}"', f"python_env = {list(PYTHON_ENV)!r}".replace("'", '"')]
        if ctl is not None:
            lines += [f'controller_url = "{ctl.url}"', f'controller_pubkey = "{ctl.pub}"']
        self.config = tmp / f"agent-{node}.toml"
        self.config.write_text("\n".join(lines) + "\n")
        super().__init__(
            tmp,
            node,
            gpus=2,
            secret=SECRET,
            secret_name="push.secret",
            extra_args=("--config", str(self.config)),
            timeout_s=20.0,
        )

    def ready(self) -> bool:
        """/healthz answers and the control socket is there."""
        if self.proc.poll() is None and not (self.state_dir / control.SOCKET_FILE).exists():
            return False
        return super().ready()

    def call(self, request: dict[str, Any], timeout_s: float = 10.0) -> Any:
        """One request through the agent's real unix control socket."""
        return control.call(self.state_dir, request, timeout_s)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=60, check=False)


# ---------------------------------------------------------------------------------------------- hooks
def fixture_root(tmp: Path) -> Path:
    """The node tree the agent measures and the Prolog re-checks (one per test)."""
    root = tmp / "root"
    if not root.exists():
        make_root(root)
    return root


def passed_digests(tmp: Path) -> dict[str, str]:
    """The re-checked digests of the fixture root as it is now: what a passing verdict would carry."""
    return quick_records(MeasureSpec(root=fixture_root(tmp)))


def hook_conf(path: Path, agent_state_dir: Path, tmp: Path, **extra: object) -> Path:
    values: dict[str, object] = {
        "agent_state_dir": agent_state_dir,
        "hpc_job_dir": tmp / "hpc-jobs",
        "spool_dir": tmp / "spool",
        "log_file": tmp / "hooks.log",
        "attest": "true",
        "attest_areas": f"{tmp / 'scratch'}/fy-job-{{job_id}}",
        "attest_root": fixture_root(tmp),
    }
    values.update(extra)
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def hook_env(conf: Path, job_id: str, node: str = NODE, gpus: str = "0,1") -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "FLEETYIELD_HOOKS_CONF": str(conf),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1234",
        "SLURMD_NODENAME": node,
        "SLURM_JOB_GPUS": gpus,
        "CUDA_VISIBLE_DEVICES": gpus,
    }


def run_hook(name: str, env: dict[str, str], timeout: float = 15.0) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", f"prolog_epilog.{name}"], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd="/", check=False)  # fmt: skip
    return proc.returncode, proc.stderr, time.monotonic() - start


# ---------------------------------------------------------------------------------------------- Slurm seam
class NoSense:
    """A SensePort whose scrapes all fail: the node is UNKNOWN; pushed evidence still drains it."""

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]:
        return {n: NodeSample(n, now, error="not scraped in this test") for n in nodes}
