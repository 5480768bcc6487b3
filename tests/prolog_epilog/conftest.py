"""Fixtures for the prolog/epilog tests: run the hooks as slurmd would (a subprocess with
a fresh environment and a temp config), a local controller gate HTTP server, and the controller's
real API listener behind a web-config file (``protected_api``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


@dataclass
class HookRun:
    rc: int
    stderr: str
    wall_s: float


@dataclass
class Node:
    """A fake compute node's directories and the env slurmd would give the hooks."""

    root: Path
    conf: dict[str, object] = field(default_factory=dict)

    @property
    def agent_dir(self) -> Path:
        return self.root / "agent"

    @property
    def map_dir(self) -> Path:
        return self.root / "hpc-jobs"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def log_file(self) -> Path:
        return self.root / "log" / "hooks.log"

    @property
    def conf_path(self) -> Path:
        return self.root / "hooks.conf"

    def write_conf(self, **extra: object) -> None:
        values: dict[str, object] = {
            "agent_state_dir": self.agent_dir,
            "hpc_job_dir": self.map_dir,
            "spool_dir": self.spool,
            "log_file": self.log_file,
        }
        values.update(self.conf)
        values.update(extra)
        self.conf_path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    def env(self, job_id: str = "1001", gpus: str | None = "0,1", **extra: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "FLEETYIELD_HOOKS_CONF": str(self.conf_path),
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_UID": "1234",
            "SLURMD_NODENAME": "gpu-node-07",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        }
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
            env["CUDA_VISIBLE_DEVICES"] = gpus
        env.update(extra)
        return env

    def write_fatal(self, pending: list[dict]) -> None:
        self.agent_dir.mkdir(parents=True, exist_ok=True)
        doc = {"version": 1, "node": "gpu-node-07", "updated": time.time(), "pending": pending}
        (self.agent_dir / "fatal.json").write_text(json.dumps(doc))


REPO = Path(__file__).resolve().parents[2]


def run_hook(name: str, env: dict[str, str], timeout: float = 10.0) -> HookRun:
    """Run ``prolog_epilog.<name>`` from this tree (``PYTHONPATH`` ends with it: the hooks of the tree under
    test, whatever copy the interpreter has installed; a test's own ``PYTHONPATH`` comes first)."""
    start = time.monotonic()
    env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(REPO)) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", f"prolog_epilog.{name}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )
    return HookRun(proc.returncode, proc.stderr, time.monotonic() - start)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path)
    n.write_conf()
    return n


class GateServer:
    """Local controller stand-in for ``GET /v1/nodes/{node}/gate``.

    ``mode``: "allow", "deny", "garbage", "500", "hang" (the handler blocks until the
    test ends: a controller that accepted the connection and never answers).
    """

    def __init__(self) -> None:
        self.mode = "allow"
        self.requests: list[str] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                if server.mode == "hang":
                    server.release.wait(30)
                    return
                if server.mode == "500":
                    body, status = b"oops", 500
                elif server.mode == "garbage":
                    body, status = b"<html>not json", 200
                elif server.mode == "deny":
                    body, status = json.dumps({"allow": False, "reason": "quarantined: xid 79"}).encode(), 200
                else:
                    body, status = json.dumps({"allow": True, "reason": "green"}).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def gate() -> Iterator[GateServer]:
    server = GateServer()
    yield server
    server.close()


@pytest.fixture
def dead_port() -> int:
    """A port with nothing listening (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A listening socket that never accepts nor answers: connect succeeds, reads hang."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def hook() -> object:
    """``hook(name, env) -> HookRun``: run ``prolog_epilog.<name>`` like slurmd does."""
    return run_hook


PASSWORD = "s3cret-prolog"


@pytest.fixture
def protected_api(tmp_path: Path) -> Iterator[Any]:
    """The controller's REAL API listener over a store whose last tick quarantined gpu-02 (fresh: /healthz
    answers 200), served with a web-config file. ``start(tls=...)`` writes web.yml (user ``prolog``, bcrypt;
    with TLS the PKI's server certificate for ``localhost``) and returns the URL; ``password_file(text)``
    writes the client's password file; ``refused()``: the requests the controller counted as refused."""
    import bcrypt
    from pki import make_pki
    from rig import TICK_TIME, commit_one_tick

    from node_agent.webconfig import load_web_config
    from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel
    from slurm_fleetyield.adapters.metrics import ControllerStats
    from slurm_fleetyield.adapters.store import Store

    commit_one_tick(tmp_path / "fy.db")
    store = Store(tmp_path / "fy.db")
    servers: list[ApiServer] = []

    class Api:
        pki = make_pki(tmp_path / "pki")
        stats = ControllerStats()

        def start(self, tls: bool = False) -> str:
            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
            web = tmp_path / "web.yml"
            text = f"basic_auth_users:\n  prolog: '{hashed}'\n"
            if tls:
                text += (
                    f"tls_server_config:\n  cert_file: {self.pki['server_cert']}\n"
                    f"  key_file: {self.pki['server_key']}\n"
                )
            web.write_text(text)
            api = ApiServer(
                "127.0.0.1",
                0,
                StoreReadModel(store),
                clock=lambda: TICK_TIME + 1,
                web=load_web_config(web),
                on_unauthenticated=self.stats.unauthenticated,
            )
            api.start()
            servers.append(api)
            return f"https://localhost:{api.port}" if tls else f"http://127.0.0.1:{api.port}"

        def password_file(self, text: str = PASSWORD) -> Path:
            path = tmp_path / "controller.password"
            path.write_text(text + "\n")
            path.chmod(0o600)
            return path

        def refused(self) -> int:
            return self.stats.read_unauthenticated().get(("api", "basic_auth"), 0)

    yield Api()
    for api in servers:
        api.stop()
    store.close()
