"""Helpers of the page tests: headless Chromium (Debian's chromium + chromium-driver), a real controller.

The controller is ``daemon.build`` with a real SQLite store, the real read-only API and push listener, a real
scraper against real ``fleetyield-agent serve --backend fake`` processes on 127.0.0.1 (one per node, behind a
tiny path-routing proxy, because a URL template has only ``{node}``), and the Slurm adapter over a command
runner that answers with captured-format ``scontrol``/``squeue`` output and applies the ``scontrol update``s
it is given (the subprocess seam ``tests/test_daemon.py`` uses). Screenshots go to ``$CI_ARTIFACTS`` or
``tests/web/artifacts/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import rig
from rig import AgentProcess, FakeCommands, node_line, write_secret

from slurm_fleetyield.adapters.slurm import SlurmCli
from slurm_fleetyield.config import from_mapping

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1100",
)
SECRET = b"web-test-push-secret"
HOSTILE_REASON = "<img/src=x/onerror=window.__pwned=1><b>bold</b>"
"""An admin's drain reason the page must show as text, never as markup."""


def artifacts_dir() -> Path:
    d = Path(os.environ.get("CI_ARTIFACTS") or Path(__file__).parent / "artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


def wait_for(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "condition") -> object:
    return rig.wait_for(predicate, timeout_s, what, interval_s=0.05)


# --------------------------------------------------------------------------------------------------------
# Slurm, through the command seam
# --------------------------------------------------------------------------------------------------------


class FakeSlurm(FakeCommands):
    """Answers scontrol/squeue like Slurm 22.05 and applies ``scontrol update`` to its node table."""

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[str, dict] = {}

    def add(self, name: str, *, gpus: int = 8, features: str = "h100,nvlink", state: str = "IDLE", reason=""):
        gres = f"gpu:h100:{gpus}(S:0-1)" if gpus else "(null)"
        self.table[name] = {"state": state, "features": features, "weight": 1, "reason": reason, "gres": gres}
        self._render()

    def _render(self) -> None:
        self.nodes = {n: node_line(n, **v) for n, v in sorted(self.table.items())}

    def on_update(self, argv: tuple[str, ...]) -> None:
        fields = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
        for name in fields.get("NodeName", "").split(","):
            node = self.table.get(name)
            if node is None:
                continue
            if "ActiveFeatures" in fields:
                node["features"] = fields["ActiveFeatures"]
            if "Weight" in fields:
                node["weight"] = int(fields["Weight"])
            state = fields.get("State", "").upper()
            if state == "DRAIN":
                node["state"], node["reason"] = "IDLE+DRAIN", fields.get("Reason", "")
            elif state == "RESUME":
                node["state"], node["reason"] = "IDLE", ""
        self._render()


# --------------------------------------------------------------------------------------------------------
# Agents, and the proxy that gives each node its own URL
# --------------------------------------------------------------------------------------------------------


class Agent(AgentProcess):
    def __init__(self, tmp: Path, node: str, push_url: str, seed: int) -> None:
        super().__init__(
            tmp, node, seed=seed, push_url=push_url, secret=SECRET, secret_name="push.secret", wait=False
        )


class NodeProxy:
    """GET /<node>/metrics -> that node's agent (status, Content-Type, Date and body passed through)."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}  # filled once the agents are up
        ports = self.ports

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                m = re.fullmatch(r"/([^/]+)(/.*)", self.path)
                if m is None or m.group(1) not in ports:
                    self.send_error(404)
                    return
                try:
                    url = f"http://127.0.0.1:{ports[m.group(1)]}{m.group(2)}"
                    with urllib.request.urlopen(url, timeout=5) as r:
                        status, headers, body = r.status, r.headers, r.read()
                except urllib.error.HTTPError as err:
                    status, headers, body = err.code, err.headers, err.read()
                except OSError:
                    self.send_error(502)
                    return
                self.send_response(status)
                self.send_header("Content-Type", headers.get("Content-Type", "text/plain"))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.1,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------------------------------------
# The controller
# --------------------------------------------------------------------------------------------------------


class Controller:
    """``daemon.build`` + ``Daemon.run`` in a thread, with the listeners started as ``serve`` does."""

    def __init__(self, tmp: Path, nodes: Sequence[str]) -> None:
        from slurm_fleetyield.daemon import build

        self.slurm = FakeSlurm()
        for i, n in enumerate(nodes):
            self.slurm.add(n, features="h100,nvlink" if i % 2 == 0 else "h100")
        self.slurm.add("cpu-01", gpus=0, features="cpu", state="IDLE+DRAIN", reason=HOSTILE_REASON)
        secret = write_secret(tmp / "controller.secret", SECRET)
        self.proxy = NodeProxy()
        cfg = from_mapping(
            {
                "store": {"path": str(tmp / "fy.db")},
                "sense": {"url_template": f"http://127.0.0.1:{self.proxy.port}/{{node}}/metrics"},
                "push": {"host": "127.0.0.1", "port": 0, "secret_file": str(secret)},
                "api": {"host": "127.0.0.1", "port": 0},
                "loop": {"interval_s": 1.0, "seed": 1},
            }
        )
        self.runtime = build(cfg, dry_run=False, slurm=SlurmCli(runner=self.slurm))
        for server in self.runtime.servers:
            server.start()
        self.api_port = next(s.port for s in self.runtime.servers if type(s).__name__ == "ApiServer")
        push_port = next(s.port for s in self.runtime.servers if type(s).__name__ == "IngestServer")
        push_url = f"http://127.0.0.1:{push_port}/v1/agent/events"
        self.agents = {n: Agent(tmp, n, push_url, seed=7 + i) for i, n in enumerate(nodes)}
        for a in self.agents.values():
            wait_for(a.ready, what=f"agent {a.node}")
        self.proxy.ports.update({n: a.port for n, a in self.agents.items()})
        self.thread = threading.Thread(target=self.runtime.daemon.run, name="fy-daemon", daemon=True)

    def start(self) -> Controller:
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        self.runtime.daemon.stop()
        if self.thread.is_alive():
            self.thread.join(15)
        self.runtime.close()
        for a in self.agents.values():
            a.close()
        self.proxy.close()


def console_errors(driver) -> list[dict]:
    """Browser log entries at SEVERE (uncaught errors, failed loads, CSP violations)."""
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
