"""Issue 27 item 1: idle or slow connections on every listening port do not starve the controller or the
agent. The agent's /metrics port, the controller's API and its push listener each get N connections held
by another process (bench/flood.py: half-sent heads, trickled header lines, a body that never comes).
While they are held: threads and FDs of the serving process stay bounded, ticks go on, a scrape is
answered, a validly signed fatal push is accepted and drains its node. N here is 2,000 per port (above the
default 1,024-FD limit and above every cap); bench/bench_listeners.py runs 10,000 and times it (timing is
the bench's job: the deadlines here are generous and everything polls, nothing sleeps).

On the ThreadingHTTPServers these replaced, each held connection was a thread (2,000 threads), so every
test here failed on its thread bound.

The fuzz test sends ``FY_FUZZ_N`` mutated requests (default 2,000) to each port, one connection each, from
a fixed seed per port (``zlib.crc32`` of its name, printed; ``FY_FUZZ_SEED`` replaces it) so a failure
replays; the issue's figure is ``FY_FUZZ_N=10000 pytest tests/test_listeners.py -k fuzz``. The controller
runs a real gate (an authorized-keys file with one admin key), so ``/v1/approvals`` authenticates every
envelope, and after the fuzz no durable row may have appeared: gate.db's audit chain, proposals and
nonces, the store's inbox, outcomes, seen agent events and its log rows written outside a tick.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rig import FakeCommands, node_line, wait_for, write_secret

from node_agent.config import build_config
from node_agent.exporter import AGENT_LIMITS, Server
from node_agent.protocol import EVENTS_PATH, signed_headers
from slurm_fleetyield.adapters.scrape import AgentScraper
from slurm_fleetyield.adapters.slurm import SlurmCli
from slurm_fleetyield.config import from_mapping
from slurm_fleetyield.daemon import Runtime, build
from slurm_fleetyield.gate import Gatekeeper, Proposal, keygen

FLOOD = Path(__file__).parents[1] / "bench" / "flood.py"
N = 2000
SECRET = b"listener-test-secret-0123"
THREAD_SLACK = 6
"""Threads beyond the baseline a flood may add: the listeners' workers are started lazily (4 per listener)."""


class Flood:
    """``bench/flood.py`` holding ``n`` connections to ``port`` in ``mode``, until ``close()``."""

    def __init__(self, port: int, n: int = N, mode: str = "half", every: float = 0.5) -> None:
        args = [sys.executable, str(FLOOD), "--port", str(port), "-n", str(n), "--mode", mode]
        self.proc = subprocess.Popen(
            [*args, "--every", str(every)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until every connection was attempted
        assert line.startswith("ready"), line
        self.held, self.failed = map(int, line.split()[1:])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def usage() -> tuple[int, int]:
    me = psutil.Process()
    return me.num_threads(), me.num_fds()


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes, float]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read(), time.monotonic() - t0
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic() - t0


@pytest.fixture(autouse=True)
def nofile() -> None:
    """A listener at its cap holds 1,024 FDs: this process needs more than a default 1,024 soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# ---------------------------------------------------------------------------------------------- the agent
@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Server]:
    cfg = build_config(
        None, {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": tmp_path / "a", "gpus": 8}
    )
    srv = Server(cfg)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", ["half", "trickle", "idle"])
def test_agent_metrics_port_stays_bounded_and_answers(agent: Server, mode: str) -> None:
    url = f"http://127.0.0.1:{agent.port}/metrics"
    assert get(url)[0] == 200  # workers started
    threads0, fds0 = usage()
    flood = Flood(agent.port, mode=mode)
    try:
        assert flood.held >= N - 10
        status, body, took = get(url)
        assert status == 200 and b"DCGM_FI_DEV_GPU_TEMP" in body, took
        threads, fds = usage()
        assert threads <= threads0 + THREAD_SLACK, (threads0, threads)
        assert fds <= fds0 + AGENT_LIMITS.max_connections + 8, (fds0, fds)
        assert agent.http is not None
        assert agent.http.stats()["connections"] <= AGENT_LIMITS.max_connections
        assert get(f"http://127.0.0.1:{agent.port}/healthz")[0] == 200
    finally:
        flood.close()
    print(f"agent {mode}: scrape under {N} connections {took * 1000:.1f} ms; {agent.http.stats()}")


# ------------------------------------------------------------------------------------------ the controller
def _gate(tmp_path: Path) -> tuple[Path, Path]:
    """A real gate: ``authorized_keys`` with admin alice's key (``keys/``: alice's and mallory's, who is not
    authorized), and a gate dir whose audit chain is not empty (one proposal, withdrawn: nothing the daemon
    acts on). Returns (gate dir, authorized_keys)."""
    _, alice_pub = keygen("alice", tmp_path / "keys")
    keygen("mallory", tmp_path / "keys")
    auth = tmp_path / "authorized_keys"
    auth.write_text(alice_pub.read_text())
    auth.chmod(0o644)
    gate_dir = tmp_path / "gate"
    with Gatekeeper.open(gate_dir) as gk:
        p = Proposal.new(
            id=PID,
            node="gpu-01",
            gpus=(3,),
            risk=0.8,
            evidence="e",
            affected_jobs=(),
            now=time.time(),
            ttl_s=3600,
        )
        gk.propose(p)
        gk.withdraw(p.id, "seeded by the test", time.time())
    return gate_dir, auth


@pytest.fixture
def controller(tmp_path: Path, agent: Server) -> Iterator[tuple[Runtime, FakeCommands]]:
    cmds = FakeCommands()
    cmds.nodes["gpu-01"] = node_line("gpu-01")
    gate_dir, auth = _gate(tmp_path)
    cfg = from_mapping(
        {
            "store": {"path": str(tmp_path / "fy.db")},
            "sense": {"url_template": f"http://127.0.0.1:{agent.port}/metrics?node={{node}}", "timeout_s": 5},
            "loop": {"interval_s": 0.2, "seed": 1},
            "push": {"secret_file": str(write_secret(tmp_path / "secret", SECRET)), "port": 0},
            "api": {"port": 0},
            "gate": {"state_dir": str(gate_dir), "authorized_keys": str(auth)},
        }
    )
    rt = build(cfg, slurm=SlurmCli(runner=cmds), sense=AgentScraper(cfg.sense.url_template, 5.0, 4))
    for server in rt.servers:
        server.start()
    runner = threading.Thread(target=rt.daemon.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: rt.daemon.tick_no >= 1, what="first tick")
        yield rt, cmds
    finally:
        rt.daemon.stop()
        runner.join(15)
        rt.close()


def _push_fatal(port: int, node: str = "gpu-01") -> tuple[int, dict]:
    event = {
        "event_id": str(uuid.uuid4()),
        "time": time.time(),
        "node": node,
        "gpu": 2,
        "uuid": "GPU-x",
        "kind": "xid",
        "xid": 79,
        "fatal": True,
        "message": "XID 79: GPU has fallen off the bus",
    }
    body = json.dumps({"node": node, "events": [event]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{EVENTS_PATH}",
        data=body,
        headers=signed_headers(SECRET, node, int(time.time()), body),
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read())


@pytest.mark.parametrize(("listener", "mode"), [("ingest", "half"), ("ingest", "body"), ("api", "trickle")])
def test_controller_listener_flood_leaves_ticks_scrapes_and_pushes(
    controller, listener: str, mode: str
) -> None:
    rt, cmds = controller
    ingest, api = rt.servers
    api_url = f"http://127.0.0.1:{api.port}"
    wait_for(lambda: get(f"{api_url}/healthz")[0] == 200, what="a committed tick")
    assert _push_fatal(ingest.port, "gpu-other")[0] == 202  # workers of both listeners started
    threads0, fds0 = usage()
    flood = Flood(ingest.port if listener == "ingest" else api.port, mode=mode)
    try:
        assert flood.held >= N - 10
        tick0 = rt.daemon.tick_no
        wait_for(lambda: rt.daemon.tick_no >= tick0 + 2, what="ticks during the flood")
        status, metrics, took = get(f"{api_url}/metrics")
        assert status == 200, took
        label = "push" if listener == "ingest" else "api"
        assert f'fleetyield_listener_connections{{listener="{label}"}}'.encode() in metrics
        assert get(f"{api_url}/healthz")[0] == 200
        t0 = time.monotonic()
        assert _push_fatal(ingest.port) == (202, {"accepted": 1, "duplicates": 0, "ignored_nonfatal": 0})
        drain = wait_for(lambda: [c for c in cmds.writes() if "State=DRAIN" in c], what="drain")
        drained = time.monotonic() - t0
        assert "NodeName=gpu-01" in drain[0]
        threads, fds = usage()
        assert threads <= threads0 + THREAD_SLACK, (threads0, threads)
        assert fds <= fds0 + 1024 + 16, (fds0, fds)  # one flooded listener at its cap
        for server in rt.servers:
            assert server.httpd.stats()["connections"] <= 1024
    finally:
        flood.close()
    print(f"{listener} {mode}: /metrics {took * 1000:.1f} ms, push -> drain {drained * 1000:.0f} ms")


# -------------------------------------------------------------------------------------------------- fuzz
FUZZ_N = int(os.environ.get("FY_FUZZ_N", "2000"))
PID = "p-0123456789ab"


def _request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if method == "POST":
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _seeds(keys: Path) -> list[bytes]:
    """Requests the mutations start from. Each is unauthenticated by construction, and no mutation can make
    one authentic (that would need a signature by alice's key or an HMAC with the push secret): envelopes
    signed by mallory (not authorized) or carrying alice's key id under another statement's signature, a
    push signed with another secret."""
    from slurm_fleetyield.gate import sign_statement

    class Ref:
        id, node = PID, "gpu-01"

    ref = Ref()
    unknown_key = sign_statement(keys / "mallory.key", ref, "approve").encode()
    good = json.loads(sign_statement(keys / "alice.key", ref, "approve"))
    good["signature"] = json.loads(sign_statement(keys / "alice.key", ref, "deny"))["signature"]
    bad_signature = json.dumps(good, sort_keys=True, separators=(",", ":")).encode()
    push = json.dumps({"node": "gpu-01", "events": [{"event_id": "e-1", "node": "gpu-01", "fatal": True}]})
    wrong_secret = signed_headers(b"not-the-push-secret", "gpu-01", int(time.time()), push.encode())
    return [
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b'POST /v1/agent/events HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n{"events": []}',
        b"POST /v1/approvals HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        b"GET /v1/nodes/gpu-01/explain?limit=5 HTTP/1.0\r\n\r\n",
        _request("POST", "/v1/approvals", unknown_key, {"Content-Type": "application/json"}),
        _request("POST", "/v1/approvals", bad_signature, {"Content-Type": "application/json"}),
        _request("POST", EVENTS_PATH, push.encode(), wrong_secret),
    ]


def _mutate(rng, seed: bytes) -> bytes:  # type: ignore[no-untyped-def]
    data = bytearray(seed)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(5)
        i = rng.randrange(len(data) + 1)
        if op == 0 and data:
            data[min(i, len(data) - 1)] = rng.randrange(256)
        elif op == 1:
            data[i:i] = rng.choice(
                [b"\r\n", b":", b" ", b"\x00", b"%", b"Content-Length: 99999999\r\n", b"\xff"]
            )
        elif op == 2 and data:
            del data[i : i + rng.randint(1, 8)]
        elif op == 3:
            data[i:i] = rng.randbytes(rng.randint(1, 16))
        else:
            data = data[: i or 1]
    return bytes(data)


def _mutate_body(rng, seed: bytes) -> bytes:  # type: ignore[no-untyped-def]
    """The body mutated under an intact head whose Content-Length still fits: the request reaches its
    handler (JSON parsing, authentication) instead of dying in the framing, as most raw mutations do."""
    head, sep, body = seed.partition(b"\r\n\r\n")
    if not body:
        return _mutate(rng, seed)
    body = _mutate(rng, body)
    return re.sub(rb"Content-Length: \d+", b"Content-Length: %d" % len(body), head) + sep + body


def _fuzz(port: int, n: int, seed: int, seeds: list[bytes]) -> dict[int, int]:
    """``n`` mutated requests, one connection each, half of them mutated anywhere, half in the body only;
    the status codes answered (0: none, closed)."""
    import random
    import socket

    rng = random.Random(seed)
    statuses: dict[int, int] = {}
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            mutate = _mutate if rng.random() < 0.5 else _mutate_body
            s.sendall(mutate(rng, rng.choice(seeds)))
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
        code = int(reply[9:12]) if reply.startswith(b"HTTP/1.") and reply[9:12].isdigit() else 0
        statuses[code] = statuses.get(code, 0) + 1
    return statuses


def fuzz_seed(name: str) -> int:
    """The port's seed: fixed (not ``hash()``, which PYTHONHASHSEED changes in every process), printed, and
    replaced by ``FY_FUZZ_SEED`` to replay a failure."""
    return int(os.environ.get("FY_FUZZ_SEED") or zlib.crc32(name.encode()))


def durable_rows(tmp_path: Path) -> dict[str, list[tuple]]:
    """Every row a request could have made durable: the gate's (audit chain, proposals, nonces) and the
    store's (inbox, outcomes, agent events seen, log rows written outside a tick: ticks log their own)."""
    queries = {
        "gate.db": {
            "audit": "SELECT seq, kind, subject, hash FROM audit ORDER BY seq",
            "proposals": "SELECT id, status FROM proposals ORDER BY id",
            "nonces": "SELECT nonce FROM nonces ORDER BY nonce",
        },
        "fy.db": {
            "inbox": "SELECT id FROM inbox ORDER BY id",
            "outcomes": "SELECT key FROM outcomes ORDER BY key",
            "agent_seen": "SELECT id FROM agent_seen ORDER BY id",
            "events": "SELECT seq, kind, node FROM events WHERE tick IS NULL ORDER BY seq",
        },
    }
    rows: dict[str, list[tuple]] = {}
    for db, tables in queries.items():
        path = tmp_path / "gate" / db if db == "gate.db" else tmp_path / db
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as conn:
            rows.update({f"{db}:{t}": conn.execute(q).fetchall() for t, q in tables.items()})
    return rows


def test_fuzzed_requests_on_every_port_get_no_5xx_and_write_nothing(
    controller, agent: Server, tmp_path: Path
) -> None:
    rt, _ = controller
    ingest, api = rt.servers
    seeds = _seeds(tmp_path / "keys")
    rows0 = durable_rows(tmp_path)
    assert len(rows0["gate.db:audit"]) == 2 and rows0["gate.db:proposals"] == [(PID, "withdrawn")]
    for name, port in (("agent", agent.port), ("api", api.port), ("ingest", ingest.port)):
        seed = fuzz_seed(name)
        t0 = time.monotonic()
        statuses = _fuzz(port, FUZZ_N, seed, seeds)
        took = time.monotonic() - t0
        replay = f"{name}: FY_FUZZ_SEED={seed} FY_FUZZ_N={FUZZ_N}"
        assert not [c for c in statuses if 500 <= c < 600], (replay, statuses)
        assert sum(statuses.values()) == FUZZ_N
        print(f"{replay}: {took:.1f} s, statuses {dict(sorted(statuses.items()))}")
    rows = durable_rows(tmp_path)
    assert rows == rows0, {k: (rows0[k], v) for k, v in rows.items() if v != rows0[k]}
    assert rt.store.pending() == []
    print(f"durable rows written: 0 ({', '.join(f'{k} {len(v)}' for k, v in rows.items())})")
