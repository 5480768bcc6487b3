"""A real Prometheus + Alertmanager + fake FleetYield agents on 127.0.0.1, for tests and the latency bench.

Everything runs as child processes of the caller on free ports with temporary config and data dirs, and is
stopped by pid (never by name). Prometheus scrapes its first targets a few seconds after start, so
``Prometheus.wait_targets_up`` and ``wait_alertmanagers`` poll the HTTP API instead of sleeping blindly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "contrib" / "prometheus" / "fleetyield-rules.yml"
AGENT_BIN = str(Path(sys.executable).with_name("fleetyield-agent"))


def binaries() -> dict[str, str | None]:
    """prometheus, alertmanager (Debian names it prometheus-alertmanager), promtool, amtool."""
    return {
        "prometheus": shutil.which("prometheus"),
        "alertmanager": shutil.which("alertmanager") or shutil.which("prometheus-alertmanager"),
        "promtool": shutil.which("promtool"),
        "amtool": shutil.which("amtool"),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, data: bytes | None = None, timeout: float = 5.0, headers: dict | None = None) -> Any:
    req = urllib.request.Request(url, data=data, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_for(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = fn()
            if result:
                return result
            last = result
        except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@dataclass
class Agent:
    """``fleetyield-agent serve --backend fake`` on 127.0.0.1."""

    hostname: str
    workdir: Path
    gpus: int = 2
    seed: int = 1
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def state_dir(self) -> Path:
        return self.workdir / f"agent-{self.hostname}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Agent:
        log = open(self.workdir / f"agent-{self.hostname}.log", "ab")  # noqa: SIM115 (lives with the proc)
        self.proc = subprocess.Popen(
            [
                AGENT_BIN,
                "serve",
                "--backend",
                "fake",
                "--listen",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--state-dir",
                str(self.state_dir),
                "--gpus",
                str(self.gpus),
                "--seed",
                str(self.seed),
                "--hostname",
                self.hostname,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(
            lambda: urllib.request.urlopen(self.url, timeout=1).status == 200, 30, f"agent {self.hostname}"
        )
        return self

    def cli(self, *args: str) -> str:
        out = subprocess.run(
            [AGENT_BIN, *args, "--state-dir", str(self.state_dir)], capture_output=True, text=True, timeout=30
        )
        if out.returncode != 0:
            raise RuntimeError(f"fleetyield-agent {' '.join(args)}: {out.stderr or out.stdout}")
        return out.stdout

    def inject_xid(self, gpu: int, xid: int) -> None:
        self.cli("fault", "inject", "--gpu", str(gpu), "--xid", str(xid))

    def stop(self) -> None:
        _stop(self.proc)


@dataclass
class Prometheus:
    binary: str
    workdir: Path
    targets: Sequence[str] = ()
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    rule_files: Sequence[Path] = (RULES,)
    alertmanager: str | None = None  # host:port
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {"job_name": "fleetyield-agent", "static_configs": [{"targets": list(self.targets)}]}
            ],
        }
        if self.alertmanager:
            cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [self.alertmanager]}]}]}
        return cfg

    def start(self) -> Prometheus:
        d = self.workdir / f"prometheus-{self.port}"
        (d / "data").mkdir(parents=True, exist_ok=True)
        cfg = d / "prometheus.yml"
        cfg.write_text(json.dumps(self.config(), indent=1))  # JSON is YAML
        log = open(d / "prometheus.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(
            lambda: urllib.request.urlopen(self.url + "/-/ready", timeout=1).status == 200, 60, "prometheus"
        )
        return self

    def query(self, promql: str) -> dict[str, Any]:
        data = urllib.parse.urlencode({"query": promql}).encode()
        try:
            return http_json(self.url + "/api/v1/query", data=data)
        except urllib.error.HTTPError as exc:
            return json.loads(exc.read())

    def wait_targets_up(self, n: int, timeout: float = 60) -> None:
        def up() -> bool:
            active = http_json(self.url + "/api/v1/targets")["data"]["activeTargets"]
            return sum(t["health"] == "up" for t in active) >= n

        wait_for(up, timeout, f"{n} targets up")

    def wait_alertmanagers(self, timeout: float = 60) -> None:
        wait_for(
            lambda: http_json(self.url + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"],
            timeout,
            "an active alertmanager",
        )

    def stop(self) -> None:
        _stop(self.proc)


@dataclass
class Alertmanager:
    binary: str
    workdir: Path
    webhook_url: str
    token_file: Path
    group_interval: str = "1s"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        return {
            "route": {
                "receiver": "null",
                "group_by": ["..."],
                "group_wait": "0s",
                "group_interval": self.group_interval,
                "repeat_interval": "1h",
                "routes": [
                    {
                        "receiver": "fleetyield",
                        "matchers": ['fleetyield_action="quarantine"'],
                        "group_by": ["..."],
                        "group_wait": "0s",
                        "group_interval": self.group_interval,
                    }
                ],
            },
            "receivers": [
                {"name": "null"},
                {
                    "name": "fleetyield",
                    "webhook_configs": [
                        {
                            "url": self.webhook_url,
                            "send_resolved": True,
                            "http_config": {
                                "authorization": {"type": "Bearer", "credentials_file": str(self.token_file)}
                            },
                        }
                    ],
                },
            ],
        }

    def start(self) -> Alertmanager:
        d = self.workdir / f"alertmanager-{self.port}"
        (d / "data").mkdir(parents=True, exist_ok=True)
        cfg = d / "alertmanager.yml"
        cfg.write_text(json.dumps(self.config(), indent=1))
        log = open(d / "alertmanager.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={cfg}",
                f"--storage.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(
            lambda: urllib.request.urlopen(self.url + "/-/ready", timeout=1).status == 200, 60, "alertmanager"
        )
        return self

    def stop(self) -> None:
        _stop(self.proc)


def write_token(path: Path, token: str) -> Path:
    path.write_text(token + "\n")
    os.chmod(path, 0o600)
    return path


class TimedStore:
    """Wraps a Store: records when each fatal event became durable (for latency measurements)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.stored: dict[str, tuple[float, Any]] = {}  # event_id -> (time stored, event)

    def put_events(self, events: Sequence[Any], received_at: float | None = None) -> tuple[int, int]:
        result = self._store.put_events(events, received_at=received_at)
        t = time.time()
        for e in events:
            self.stored.setdefault(e.event_id, (t, e))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@dataclass
class AlertPath:
    """agents -> Prometheus (rules of contrib/prometheus) -> Alertmanager -> the controller's listener.

    ``start()`` brings up the listener (IngestServer with the Alertmanager webhook, real SQLite store),
    Alertmanager and Prometheus, and waits until every agent is scraped and Alertmanager is discovered.
    """

    bins: dict[str, str]
    workdir: Path
    agents: Sequence[Agent]
    interval: str = "1s"
    token: str = "promstack-token"
    prom: Prometheus | None = None
    am: Alertmanager | None = None
    listener: Any = None
    store: Any = None
    wake: Any = None

    def start(self) -> AlertPath:
        import threading

        from slurm_fleetyield.adapters.alertmanager import WEBHOOK_PATH, AlertmanagerWebhook
        from slurm_fleetyield.adapters.ingest import IngestServer
        from slurm_fleetyield.adapters.store import Store

        tag = f"{self.interval}-{free_port()}"
        token_file = write_token(self.workdir / f"am-{tag}.token", self.token)
        self.store = TimedStore(Store(self.workdir / f"fy-{tag}.db"))
        self.wake = threading.Event()
        self.listener = IngestServer(
            "127.0.0.1",
            0,
            None,
            self.store,
            self.wake,
            alertmanager=AlertmanagerWebhook(self.token.encode()),
        )
        self.listener.start()
        hook = f"http://127.0.0.1:{self.listener.port}{WEBHOOK_PATH}"
        self.am = Alertmanager(self.bins["alertmanager"], self.workdir, hook, token_file).start()
        self.prom = Prometheus(
            self.bins["prometheus"],
            self.workdir,
            targets=[a.target for a in self.agents],
            scrape_interval=self.interval,
            evaluation_interval=self.interval,
            alertmanager=f"127.0.0.1:{self.am.port}",
        ).start()
        self.prom.wait_targets_up(len(self.agents))
        self.prom.wait_alertmanagers()
        # a GPU-missing alert needs the GPU series of the node (host name join): wait for them
        wait_for(
            lambda: (
                len(self.prom.query("last_over_time(DCGM_FI_DEV_GPU_TEMP[1h])")["data"]["result"])
                >= sum(a.gpus for a in self.agents)
            ),
            30,
            "GPU series in Prometheus",
        )
        return self

    def inject_and_wait(
        self, agent: Agent, gpu: int, xid: int = 79, timeout: float = 30
    ) -> tuple[float, Any]:
        """Inject an XID; return (seconds from the fault to the FatalEvent stored, the event)."""
        out = json.loads(agent.cli("fault", "inject", "--gpu", str(gpu), "--xid", str(xid)))
        t_fault = min(e["time"] for e in out["events"])

        def stored() -> tuple[float, Any] | None:
            for t, ev in list(self.store.stored.values()):
                if ev.node == agent.hostname and t >= t_fault:
                    return t - t_fault, ev
            return None

        return wait_for(stored, timeout, f"a FatalEvent for {agent.hostname}", interval=0.005)

    def stop(self) -> None:
        for part in (self.prom, self.am):
            if part is not None:
                part.stop()
        if self.listener is not None:
            self.listener.stop()
        if self.store is not None:
            self.store.close()
