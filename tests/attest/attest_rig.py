"""Helpers of the attestation tests: a fixture node root, a fake-backend agent, a controller."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from node_agent.attest import keys as node_keys
from node_agent.attest.config import AttestConfig
from node_agent.attest.service import Attestor
from node_agent.backends.fake import FakeBackend
from slurm_fleetyield.attest.baseline import learn
from slurm_fleetyield.attest.policy import Policy
from slurm_fleetyield.attest.store import AttestStore
from slurm_fleetyield.attest.verify import AttestService, decode_pubkey_line

NODE = "gpu-h100-1"
T0 = 1_800_000_000.0


RELEASE = "6.1.0-28-amd64"
MODULE_DIR = f"lib/modules/{RELEASE}"


def make_root(root: Path) -> Path:
    """A small but realistic node tree standing for the node's disk, /proc and /sys: unit dirs with .wants
    links, cron, passwd homes, loaded modules with their .ko files, kernel knobs; no ld.so.preload."""
    files = {
        "proc/sys/kernel/osrelease": f"{RELEASE}\n",
        "proc/sys/kernel/tainted": "4097\n",
        "proc/sys/kernel/core_pattern": "core\n",
        "proc/sys/kernel/modprobe": "/sbin/modprobe\n",
        "proc/sys/fs/binfmt_misc/status": "enabled\n",
        "proc/cmdline": f"BOOT_IMAGE=/vmlinuz-{RELEASE} root=/dev/sda1 ro\n",
        "proc/modules": "nvidia_uvm 1 0 - Live 0x0\nnvidia 2 1 nvidia_uvm, Live 0x0\nextfoo 3 0 - Live 0x0\n",
        "proc/sysvipc/shm": "  key  shmid perms  size  cpid  lpid nattch  uid  gid  cuid  cgid\n",
        "sys/module/nvidia/srcversion": "ABC123\n",
        "sys/module/nvidia/taint": "PO\n",
        "sys/module/nvidia_uvm/srcversion": "DEF456\n",
        "sys/module/extfoo/srcversion": "0F0F0F\n",
        f"{MODULE_DIR}/modules.dep": "updates/dkms/nvidia.ko.xz:\nupdates/dkms/nvidia-uvm.ko.xz: "
        "updates/dkms/nvidia.ko.xz\nkernel/fs/extfoo.ko:\n",
        f"{MODULE_DIR}/updates/dkms/nvidia.ko.xz": "nvidia module bytes",
        f"{MODULE_DIR}/updates/dkms/nvidia-uvm.ko.xz": "nvidia uvm module bytes",
        f"{MODULE_DIR}/kernel/fs/extfoo.ko": "extfoo module bytes",
        "etc/systemd/system/fleetyield-agent.service": "[Service]\nExecStart=/usr/bin/fy-agent\n",
        "etc/cron.d/e2scrub_all": "30 3 * * 0 root test -e /run/systemd/system || /sbin/e2scrub_all\n",
        "etc/modules-load.d/modules.conf": "# /etc/modules\n",
        "etc/passwd": "root:x:0:0:root:/root:/bin/bash\nslurm:x:64030:64030::/var/lib/slurm:/bin/false\n"
        "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n",
        "etc/profile": "# /etc/profile\n",
        "etc/pam.d/sshd": "@include common-auth\n",
        "etc/ssh/sshd_config": "PermitRootLogin no\n",
        "etc/slurm/slurm.conf": "ClusterName=fy\n",
        "root/.bashrc": "# root\n",
        "root/.ssh/authorized_keys": "ssh-ed25519 AAAA admin\n",
        "tmp/.X11-unix/.keep": "",
        "usr/lib/python3.11/os.py": "# stdlib\n",
        "usr/lib/python3/dist-packages/site.pth": "",
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "tmp/.X11-unix", 0o1777)
    for d in ("var/tmp", "dev/shm", "var/spool/cron/crontabs", "var/lib/slurm", "etc/sudoers.d"):
        (root / d).mkdir(parents=True, exist_ok=True)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    os.symlink("/etc/systemd/system/fleetyield-agent.service", wants / "fleetyield-agent.service")
    return root


PYTHON_ENV = ("/usr/lib/python3.11", "/usr/lib/python3/dist-packages")
"""The fixture's stand-in for the interpreter's library trees (the real ones would be hashed otherwise)."""


@dataclass
class FakeAgent:
    backend: Any
    state_dir: Path
    node: str
    clock: Any
    lock: Any = field(default_factory=threading.RLock)


@dataclass
class Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


def make_attestor(tmp: Path, clock: Clock, node: str = NODE, **cfg: Any) -> Attestor:
    root = tmp / "root"
    if not root.exists():
        make_root(root)
    state = tmp / f"state-{node}"
    backend = FakeBackend(state, node, gpus=2, model="h100", seed=1, clock=clock)
    backend.start(clock.now)
    agent = FakeAgent(backend, state, node, clock)
    cfg.setdefault("python_env", list(PYTHON_ENV))
    return Attestor(agent, AttestConfig(root=root, **cfg))


@dataclass
class Controller:
    store: AttestStore
    key: Ed25519PrivateKey
    service: AttestService
    policy: Policy

    def enroll(self, attestor: Attestor, node_class: str = "h100", ak_pem: str | None = None) -> None:
        line = node_keys.export_public(attestor.state_dir, attestor.agent.node)
        b64, key_id = decode_pubkey_line(line)
        self.store.enroll(attestor.agent.node, b64, key_id, node_class, ak_pem, T0)

    def handover(self, attestor: Attestor, now: float, present: Any = ()) -> dict[str, Any]:
        """Nonce -> quote -> verdict in-process (the HTTP exchange is tested separately)."""
        nonce = self.service.issue_nonce(attestor.agent.node, now)["nonce"]
        quote = attestor.quote(nonce, now, present)
        return self.service.attest(attestor.agent.node, quote, now)

    def learn_from(self, attestor: Attestor, now: float, node_class: str = "h100") -> None:
        nonce = self.service.issue_nonce(attestor.agent.node, now)["nonce"]
        self.policy = learn(attestor.quote(nonce, now), node_class, self.policy)
        self.service.policy = self.policy


def make_controller(tmp: Path) -> Controller:
    store = AttestStore(tmp / "ctl" / "attest.db")
    key = Ed25519PrivateKey.generate()
    policy = Policy()
    return Controller(store, key, AttestService(store, policy, key), policy)


def now() -> float:
    return time.time()


class ControlStub:
    """A unix socket speaking the agent's control protocol and dispatching to ``control_op``: what
    ``node_agent.control.dispatch`` does once the attest ops are wired (see the report)."""

    def __init__(self, attestor: Attestor, sock_dir: Path) -> None:
        import json
        import socketserver

        from node_agent.attest.service import control_op

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                req = json.loads(self.rfile.readline())
                try:
                    doc = {"ok": True, "result": control_op(attestor, req["op"], req)}
                except Exception as exc:
                    doc = {"ok": False, "error": str(exc)}
                self.wfile.write(json.dumps(doc).encode() + b"\n")

        sock_dir.mkdir(parents=True, exist_ok=True)
        self.dir = sock_dir
        self.server = socketserver.UnixStreamServer(str(sock_dir / "agent.sock"), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> ControlStub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
