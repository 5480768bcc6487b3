"""HTTP exporter and the ``serve`` process: /metrics, control socket, scenario ticks, push, SIGTERM.

Input: an ``AgentConfig``, a clock, the ``[attest]`` settings (``node_agent.attest.config``). Output: a
running server (``Server.start()`` / ``Server.stop()``) serving ``GET /metrics`` (text format 0.0.4) from
a non-global ``CollectorRegistry`` (503 while a GPU backend call is stuck or a backend loop is stale:
``node_agent.supervise``; the requests the listener and the signed reset refuse are counted there too:
``node_agent.unauthenticated``), ``GET /healthz`` and ``GET /health`` (dcgm-exporter's path; both 503 naming
what is wrong: a stuck backend call, a failing or dead supervised thread, a stale backend loop)
and ``GET /v1/attest/quote?nonce=HEX`` (a signed quote
for a controller that pulls; ``node_agent.attest.service.http_quote``). With ``attest.controller_url`` and
a push secret, a ``HandoverLoop`` re-attests at start and every 15 minutes. ``run_forever`` installs
SIGTERM/SIGINT handlers that stop everything cleanly (sockets closed, locks released).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client.registry import CollectorRegistry

from node_agent.agent import Agent
from node_agent.attest.config import AttestConfig
from node_agent.backends.base import Backend, BackendError, load_backend_class
from node_agent.collector import GpuCollector, ThreadCollector
from node_agent.config import AgentConfig
from node_agent.exposition import CONTENT_TYPE, render
from node_agent.host import HostCollector
from node_agent.httpd import BoundedHTTPServer, Limits, ListenerCollector
from node_agent.outcomes import OutcomeForwarder
from node_agent.protocol import CONTROL_RESET_PATH
from node_agent.push import Pusher
from node_agent.remote import MAX_BODY, ResetEndpoint
from node_agent.scenario import load_scenario
from node_agent.state import ServeLock
from node_agent.supervise import BackendStuck
from node_agent.unauthenticated import Unauthenticated

log = logging.getLogger(__name__)
AGENT_QUOTE_PATH = "/v1/attest/quote"  # = attest.quote.AGENT_QUOTE_PATH (that module loads cryptography)


def make_backend(cfg: AgentConfig, clock: Callable[[], float]) -> Backend:
    cls = load_backend_class(cfg.backend)
    if cfg.backend == "fake":
        return cls(
            cfg.state_dir,
            cfg.node_name(),
            gpus=cfg.gpus,
            model=cfg.model,
            seed=cfg.seed,  # type: ignore[call-arg]
            clock=clock,
        )
    return cls(cfg.node_name(), slow_interval_s=cfg.nvml_slow_interval_s)  # type: ignore[call-arg]


def _attestor_factory(cfg: AttestConfig, secret: bytes | None, client: Any = None) -> Callable[[Agent], Any]:
    """``client``: the push listener's basic auth and TLS (``push_basic_auth``, ``push_tls_config``): the
    hand-over posts to the same listener."""

    def make(agent: Agent) -> Any:
        from node_agent.attest.service import Attestor

        attestor = Attestor(agent, cfg, secret)
        attestor.client = client
        return attestor

    return make


def make_registry(agent: Agent, cfg: AgentConfig, host_metrics: bool = True) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        GpuCollector(
            agent.backend,
            cfg.node_name(),
            agent.clock,
            cfg.lowercase_hostname,
            cfg.hpc_job_mapping_dir,
            cfg.xid_count_window_ms,
            call=agent.guard.call,
        )
    )
    registry.register(ThreadCollector(agent.backend))
    if host_metrics:
        registry.register(HostCollector())
    return registry


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: with Nagle on, a body under one segment waits for the client's
    # delayed ACK of the headers, 40 ms on Linux, on every keep-alive scrape (Prometheus keeps them alive).
    # Seen on a real 1-GPU H200 node (10 KB exposition: 52 ms p50 per scrape); TCP_NODELAY removes it.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            try:
                with self.server.agent.lock:
                    body = render(self.server.registry)
            except BackendStuck as exc:  # no stale numbers: the scrape fails, the controller sees UNKNOWN
                self._send(503, f"GPU data unavailable: {exc}\n".encode(), "text/plain")
                return
            self._send(200, body, CONTENT_TYPE)
        elif path in ("/", "/healthz", "/health"):  # /health: dcgm-exporter's liveness path
            problems = self.server.agent.health()
            if problems:
                self._send(503, ("unhealthy: " + "; ".join(problems) + "\n").encode(), "text/plain")
            else:
                self._send(200, b"ok\n", "text/plain")
        elif path == AGENT_QUOTE_PATH:
            from node_agent.attest.service import http_quote  # cryptography: only when a quote is asked

            status, doc = http_quote(self.server.agent.attestor, self.path.partition("?")[2])
            self._send(status, json.dumps(doc).encode() + b"\n", "application/json")
        else:
            self._send(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        """The one signed network control operation (``remote``); everything else is GET-only."""
        path = self.path.split("?", 1)[0]
        endpoint = self.server.reset_endpoint
        if path != CONTROL_RESET_PATH or endpoint is None:
            self._send(404, b'{"error": "not found"}\n', "application/json")
            return
        try:
            length = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            self._send(413 if length > MAX_BODY else 411, b'{"error": "bad length"}\n', "application/json")
            return
        status, doc = endpoint.handle(dict(self.headers.items()), self.rfile.read(length))
        self._send(status, json.dumps(doc).encode() + b"\n", "application/json")

    def _not_allowed(self) -> None:
        """Any other method: 405 naming the two served, not the stdlib's 501."""
        self.close_connection = True
        self.send_response(405)
        self.send_header("Allow", "GET, POST")
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http: " + format, *args)


AGENT_LIMITS = Limits(max_connections=256, workers=2, max_body_bytes=MAX_BODY)
"""The agent's listener: its clients are the controller, Prometheus and an admin's curl; 256 connections
of at most ~80 KB each (head and body) bound it to ~20 MB, two workers to two threads plus the loop."""


class _HTTPServer(BoundedHTTPServer):
    def __init__(
        self,
        addr: tuple[str, int],
        agent: Agent,
        registry: CollectorRegistry,
        limits: Limits = AGENT_LIMITS,
        web: Any = None,
    ) -> None:
        self.agent = agent
        self.registry = registry
        self.reset_endpoint: ResetEndpoint | None = None
        super().__init__(addr, _Handler, limits, web, name="fleetyield-http")


class Server:
    def __init__(
        self,
        cfg: AgentConfig,
        clock: Callable[[], float] = time.time,
        tick_s: float = 0.1,
        attest: AttestConfig | None = None,
    ) -> None:
        self.cfg = cfg
        self.attest_cfg = attest or AttestConfig()
        self.handover: Any = None  # node_agent.attest.service.HandoverLoop when a controller is set
        self.clock = clock
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.lock = ServeLock(cfg.state_dir)
        self.http: _HTTPServer | None = None
        self.control = None
        self.pusher: Pusher | None = None
        self.forwarder: OutcomeForwarder | None = None
        self.agent: Agent | None = None
        self.unauthenticated = Unauthenticated()  # refused requests, on /metrics

    @property
    def port(self) -> int:
        assert self.http is not None
        return self.http.server_address[1]

    def start(self) -> None:
        cfg = self.cfg
        scenario = load_scenario(cfg.scenario) if cfg.scenario else None
        if scenario is not None and cfg.backend != "fake":
            raise BackendError("--scenario needs the fake backend")
        secret = cfg.read_secret()
        web = None
        if cfg.web_config_file is not None:  # a bad file stops the start here, before anything opens
            from node_agent.webconfig import load_web_config

            web = load_web_config(cfg.web_config_file)
        client = None
        client_cfg = cfg.push_client()
        if client_cfg is not None:  # an unreadable password or TLS file stops the start here too
            from node_agent.httpclient import HttpClient

            client = HttpClient(client_cfg, "push_")
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        if not self.lock.acquire():
            raise BackendError(f"another agent already serves state dir {cfg.state_dir}")
        try:
            backend = make_backend(cfg, self.clock)
            backend.start()
            self.pusher = Pusher(
                cfg.state_dir, cfg.node_name(), cfg.push_url, secret, clock=self.clock, client=client
            )
            self.agent = Agent(
                backend, cfg.state_dir, cfg.node_name(), self.clock, self.pusher, scenario, cfg.seed
            )
            self.agent.start_scenario(self.clock())
            self.agent.attest_factory = _attestor_factory(self.attest_cfg, secret, client)
            if self.attest_cfg.controller_url and secret:  # a bad [attest] table fails the start here
                from node_agent.attest.service import HandoverLoop

                self.handover = HandoverLoop(self.agent.attestor, secret)
            from node_agent.control import ControlServer

            count = self.unauthenticated.add
            self.control = ControlServer(cfg.state_dir, self.agent, on_refused=lambda r: count("control", r))
            limits = dataclasses.replace(AGENT_LIMITS, max_connections=cfg.max_connections)
            registry = make_registry(self.agent, cfg)
            self.http = _HTTPServer((cfg.listen, cfg.port), self.agent, registry, limits, web)
            registry.register(ListenerCollector("fleetyield_agent", self._listeners))
            registry.register(self.unauthenticated)
            self.http.on_unauthorized = lambda: self.unauthenticated.add("metrics", "basic_auth")
            if secret:
                self.http.reset_endpoint = ResetEndpoint(
                    self.agent,
                    secret,
                    self.clock,
                    on_refused=lambda reason: self.unauthenticated.add("reset", reason),
                )
            outcome_urls = cfg.outcome_urls()
            if outcome_urls and secret and cfg.outcomes_dir is not None:
                self.forwarder = OutcomeForwarder(
                    cfg.outcomes_dir,
                    cfg.node_name(),
                    outcome_urls,
                    secret,
                    self.clock,
                    interval_s=cfg.outcomes_interval_s,
                    client=client,
                )
        except BaseException:
            self.lock.release()
            raise
        self.pusher.start()
        if self.forwarder is not None:
            self.forwarder.start()
        self.control.start()
        if self.handover is not None:
            self.handover.start()
        t = threading.Thread(
            target=self.http.serve_forever, args=(0.05,), name="fleetyield-http", daemon=True
        )
        t.start()
        self._threads.append(t)
        if scenario is not None:
            t = threading.Thread(target=self._tick_loop, name="fleetyield-scenario", daemon=True)
            t.start()
            self._threads.append(t)
        scheme = web.scheme if web is not None else "http"
        log.info(
            "fleetyield-agent serving %s backend on %s://%s:%d", cfg.backend, scheme, cfg.listen, self.port
        )

    def _listeners(self) -> list[tuple[str, Any]]:
        return [("metrics", self.http), ("control", self.control)]

    def _tick_loop(self) -> None:
        assert self.agent is not None
        while not self._stop.is_set():
            try:
                self.agent.tick(self.clock())
            except Exception:
                log.exception("scenario tick failed")
            self._stop.wait(self.tick_s)

    def stop(self) -> None:
        self._stop.set()
        if self.handover is not None:
            self.handover.stop()
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        if self.control is not None:
            self.control.stop()
        if self.pusher is not None:
            self.pusher.stop()
        if self.forwarder is not None:
            self.forwarder.stop()
        if self.agent is not None:
            self.agent.backend.stop()
        for t in self._threads:
            t.join(2)
        self.lock.release()

    def run_forever(self) -> None:
        stop = threading.Event()

        def _on_signal(signum: int, _frame: object) -> None:
            log.info("signal %d: shutting down", signum)
            stop.set()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        self.start()
        try:
            while not stop.wait(1.0):
                pass
        finally:
            self.stop()
