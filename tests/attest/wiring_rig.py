"""Helpers of the wiring tests: a real ``fleetyield-agent serve`` process, the controller's real push
listener with the ``AttestService``, the hooks run as slurmd runs them, and the recorded Slurm seam."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attest_rig import make_root
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node_agent import control
from slurm_fleetyield.adapters.ingest import IngestServer
from slurm_fleetyield.adapters.slurm import CommandResult
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.attest.baseline import learn
from slurm_fleetyield.attest.policy import Policy
from slurm_fleetyield.attest.store import AttestStore
from slurm_fleetyield.attest.verify import AttestService, decode_pubkey_line
from slurm_fleetyield.core.model import NodeSample
from slurm_fleetyield.gate.keys import format_public_line

BIN = Path(sys.executable).parent
AGENT = str(BIN / "fleetyield-agent")
SECRET = b"wiring-test-secret-0123456789"
NODE = "gpu-node-07"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)  # polling interval, not a fixed wait
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def secret_file(tmp: Path) -> Path:
    path = tmp / "push.secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


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


class AgentProc:
    """``fleetyield-agent serve --backend fake`` with an [attest] table measuring a fixture root."""

    def __init__(self, tmp: Path, node: str = NODE, ctl: Controller | None = None) -> None:
        self.node = node
        self.state_dir = tmp / f"agent-{node}"
        self.port = free_port()
        root = tmp / "root"
        if not root.exists():
            make_root(root)
        lines = ["[attest]", f'root = "{root}"']
        if ctl is not None:
            lines += [f'controller_url = "{ctl.url}"', f'controller_pubkey = "{ctl.pub}"']
        self.config = tmp / f"agent-{node}.toml"
        self.config.write_text("\n".join(lines) + "\n")
        args = [AGENT, "serve", "--backend", "fake", "--listen", "127.0.0.1", "--port", str(self.port),
                "--state-dir", str(self.state_dir), "--gpus", "2", "--model", "h100", "--hostname", node,
                "--seed", "7", "--config", str(self.config),
                "--push-secret-file", str(secret_file(tmp))]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for(self._ready, what="agent /healthz and control socket")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited: {self.proc.stderr.read().decode()[-2000:]}")
        if not (self.state_dir / control.SOCKET_FILE).exists():
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def call(self, request: dict[str, Any], timeout_s: float = 10.0) -> Any:
        """One request through the agent's real unix control socket."""
        return control.call(self.state_dir, request, timeout_s)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=60, check=False)

    def close(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        err = self.proc.stderr.read().decode()
        self.proc.stderr.close()
        return err


# ---------------------------------------------------------------------------------------------- hooks
def hook_conf(path: Path, agent_state_dir: Path, tmp: Path, **extra: object) -> Path:
    values: dict[str, object] = {
        "agent_state_dir": agent_state_dir,
        "hpc_job_dir": tmp / "hpc-jobs",
        "spool_dir": tmp / "spool",
        "log_file": tmp / "hooks.log",
        "attest": "true",
        "attest_areas": f"{tmp / 'scratch'}/fy-job-{{job_id}}",
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
def node_line(name: str, state: str = "IDLE", reason: str = "") -> str:
    line = (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUTot=32 CPULoad=0.01 "
        "AvailableFeatures=h100,ib ActiveFeatures=h100,ib Gres=gpu:h100:8(S:0-1) "
        f"NodeAddr={name} NodeHostName={name} Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP Debian "
        f"RealMemory=1031000 AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 "
        "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu CfgTRES=cpu=32,gres/gpu=8 AllocTRES="
    )
    return line + (f" Reason={reason} [root@2026-01-12T10:00:00]" if reason else "")


class FakeCommands:
    """The subprocess seam of ``SlurmCli`` (as in tests/test_daemon.py): answers reads, records writes."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = {n: node_line(n) for n in nodes}
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[:2] == ("scontrol", "--version"):
            return CommandResult(0, "slurm-wlm 22.05.8\n", "")
        if argv[:3] == ("scontrol", "show", "node"):
            return CommandResult(0, "\n".join(self.nodes.values()) + "\n", "")
        if argv[:2] == ("squeue", "--json"):
            return CommandResult(0, json.dumps({"jobs": []}), "")
        if argv[:3] == ("scontrol", "show", "hostnames"):
            return CommandResult(0, "\n".join(argv[3].split(",")) + "\n", "")
        return CommandResult(0, "", "")

    def drains(self) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[1:2] == ("update",) and "State=DRAIN" in c]


class NoSense:
    """A SensePort whose scrapes all fail: the node is UNKNOWN; pushed evidence still drains it."""

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]:
        return {n: NodeSample(n, now, error="not scraped in this test") for n in nodes}
