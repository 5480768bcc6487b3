"""Issue 27 item 1: the agent's unix control socket is bounded like its HTTP port (node_agent/control.py).
2,000 idle or half-sent connections held by another process (bench/flood.py --unix) leave the agent's
threads and FDs bounded and a real control request answered; a request line that never ends is closed at
its deadline. On the ThreadingUnixStreamServer this replaced, each held connection was a thread (2,000)."""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rig import wait_for

from node_agent.config import build_config
from node_agent.control import MAX_CONNECTIONS, ControlServer, call
from node_agent.exporter import Server

FLOOD = Path(__file__).parents[2] / "bench" / "flood.py"
N = 2000
THREAD_SLACK = 4
"""Threads beyond the baseline: the control socket's two workers start lazily, plus margin."""


@pytest.fixture(autouse=True)
def nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Server]:
    cfg = build_config(
        None, {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": tmp_path / "a", "gpus": 2}
    )
    srv = Server(cfg)
    srv.start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", ["idle", "half"])
def test_held_connections_leave_threads_bounded_and_a_request_answered(agent: Server, mode: str) -> None:
    state = agent.cfg.state_dir
    assert call(state, {"op": "ping"})["backend"] == "fake"  # workers started
    me = psutil.Process()
    threads0, fds0 = me.num_threads(), me.num_fds()
    sock = str(state / "agent.sock")
    flood = subprocess.Popen(
        [sys.executable, str(FLOOD), "--unix", sock, "-n", str(N), "--mode", mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert flood.stdout is not None
        line = flood.stdout.readline()
        assert line.startswith("ready"), line
        held = int(line.split()[1])
        assert held >= N - 10, line
        assert agent.control is not None
        control = agent.control
        wait_for(lambda: control.stats()["evicted"] >= N - MAX_CONNECTIONS - 10, what="the backlog accepted")
        assert control.stats()["connections"] <= MAX_CONNECTIONS, control.stats()
        assert call(state, {"op": "ping"}, timeout_s=5)["node"] == agent.agent.node  # type: ignore[union-attr]
        assert call(state, {"op": "list"}, timeout_s=5) == []
        with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        evicted = re.search(r'fleetyield_agent_listener_evicted_total\{listener="control"\} (\S+)', metrics)
        assert evicted and float(evicted.group(1)) >= N - MAX_CONNECTIONS - 10, metrics[-2000:]
        assert me.num_threads() <= threads0 + THREAD_SLACK, (threads0, me.num_threads())
        assert me.num_fds() <= fds0 + MAX_CONNECTIONS + 8, (fds0, me.num_fds())
    finally:
        assert flood.stdin is not None
        flood.stdin.close()
        flood.wait(30)


def test_a_request_line_that_never_ends_is_closed_at_its_deadline(agent: Server, tmp_path: Path) -> None:
    assert agent.agent is not None
    (tmp_path / "b").mkdir()
    server = ControlServer(tmp_path / "b", agent.agent, read_timeout_s=0.3)
    server.start()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(server.path))
            s.sendall(b'{"op": "pi')
            assert s.recv(100) == b""  # closed by the server, not by this timeout
        wait_for(lambda: server.stats()["timed_out"] == 1, what="the timeout counted")
        assert call(tmp_path / "b", {"op": "ping"})["backend"] == "fake"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # no newline, then EOF: still answered
            s.settimeout(10)
            s.connect(str(server.path))
            s.sendall(b'{"op": "nope"}')
            s.shutdown(socket.SHUT_WR)
            assert b'"ok": false' in s.recv(65536)
    finally:
        server.stop()
    assert not server.path.exists()
