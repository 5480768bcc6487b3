"""Issue 27 items 2 and 6 (node_agent/supervise.py): the NVML XID thread survives its callback's failures and
says so; a hung backend call makes the node's data stale, bounded, and says so."""

from __future__ import annotations

import errno
import http.client
import queue
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from rig import wait_for

from node_agent import fatal
from node_agent.agent import Agent
from node_agent.backends.nvml import NvmlBackend
from node_agent.collector import ThreadCollector
from node_agent.config import build_config
from node_agent.exporter import Server
from node_agent.supervise import BackendStuck, Guard
from slurm_fleetyield.adapters.scrape import AgentScraper


class _NVMLError(Exception):
    pass


class _Timeout(_NVMLError):
    pass


def _fake_nvml(events: queue.Queue) -> SimpleNamespace:
    def fail(*_a: object) -> None:
        raise _NVMLError("Not Supported")

    def wait(_set: object, ms: int) -> SimpleNamespace:
        try:
            xid = events.get(timeout=ms / 1000)
        except queue.Empty:
            raise _Timeout("Timeout") from None
        return SimpleNamespace(eventType=8, eventData=xid, device="h0")

    return SimpleNamespace(
        NVMLError=_NVMLError,
        NVMLError_Timeout=_Timeout,
        nvmlEventTypeXidCriticalError=8,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"580.159.04",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=b"00000000:53:00.0"),
        nvmlDeviceGetMinorNumber=lambda h: 0,
        nvmlDeviceGetUUID=lambda h: "GPU-0",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetVbiosVersion=fail,
        nvmlDeviceGetEccMode=fail,
        nvmlDeviceGetMigMode=fail,
        nvmlDeviceGetPersistenceMode=fail,
        nvmlEventSetCreate=lambda: "set",
        nvmlDeviceRegisterEvents=lambda h, kind, s: None,
        nvmlEventSetWait=wait,
        nvmlEventSetFree=lambda s: None,
    )


def test_xid_thread_survives_enospc_in_its_callback_and_health_says_so(tmp_path: Path, monkeypatch) -> None:
    """One ENOSPC writing fatal.json used to end the XID thread for good (no XID seen again, /healthz ok).
    Now: restarted with backoff, the failed event delivered once the disk has room, health and metrics
    showing the failure meanwhile."""
    events: queue.Queue = queue.Queue()
    backend = NvmlBackend("node-x", nvml=_fake_nvml(events))
    agent = Agent(backend, tmp_path, "node-x", lambda: 1000.0)
    backend.start()
    full = threading.Event()
    full.set()
    real = fatal.write_pending

    def write_pending(*args, **kwargs):  # type: ignore[no-untyped-def]
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(fatal, "write_pending", write_pending)
    try:
        assert agent.health() == []
        events.put(79)
        wait_for(lambda: backend.supervised()[0].restarts >= 2, what="restarts while the disk is full")
        problems = agent.health()
        assert problems and "fleetyield-nvml-xid failing" in problems[0] and "No space left" in problems[0]
        samples = {s.name: s for m in ThreadCollector(backend).collect() for s in m.samples}
        assert samples["fleetyield_agent_thread_up"].value == 0
        assert samples["fleetyield_agent_thread_restarts_total"].value >= 2
        full.clear()  # room again: the next restart delivers the XID it failed on
        pending = wait_for(lambda: fatal.read_pending(tmp_path), what="the XID marked in fatal.json")
        assert [(p["xid"], p["gpu"]) for p in pending] == [(79, 0)]
        wait_for(lambda: agent.health() == [], what="healthy again")
        events.put(48)  # and the thread still sees new XIDs
        wait_for(lambda: len(fatal.read_pending(tmp_path)) == 2, what="a later XID marked")
    finally:
        backend.stop()
    assert backend.supervised()[0].up is False


def test_guard_bounds_a_hung_call_and_fails_fast_until_it_returns() -> None:
    guard = Guard(timeout_s=0.2)
    release = threading.Event()

    def hung() -> int:
        release.wait()
        return 1

    threads = threading.active_count()
    with pytest.raises(BackendStuck, match=r"did not return within 0\.2 s"):
        guard.call(hung)
    for _ in range(20):  # each later call fails at once and leaves no thread behind
        with pytest.raises(BackendStuck, match="stuck since"):
            guard.call(lambda: 2)
    assert threading.active_count() == threads
    assert guard.stuck() is not None and "hung" in guard.stuck()  # type: ignore[operator]
    release.set()
    wait_for(lambda: guard.stuck() is None, what="unstuck")
    assert guard.call(lambda: 3) == 3


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_hung_backend_makes_the_scrape_fail_and_health_say_stale(tmp_path: Path) -> None:
    cfg = build_config(
        None, {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": tmp_path / "s", "gpus": 2}
    )
    srv = Server(cfg)
    srv.start()
    assert srv.agent is not None
    srv.agent.guard.timeout_s = 0.3
    backend = srv.agent.backend
    stall = threading.Event()
    base = f"http://127.0.0.1:{srv.port}"
    try:
        assert _status(f"{base}/metrics")[0] == 200
        threads = threading.active_count()
        backend.stall = stall  # type: ignore[attr-defined]  # every sample() now hangs, as a wedged GPU
        status, body = _status(f"{base}/metrics")
        assert status == 503 and "did not return" in body
        for _ in range(10):
            assert _status(f"{base}/metrics")[0] == 503
        assert threading.active_count() <= threads + 1  # the one abandoned call, not one per scrape
        status, body = _status(f"{base}/healthz")
        assert status == 503 and "GPU data is stale" in body and "sample" in body
        # the controller's scraper turns that into a failed sample: the node is UNKNOWN, not healthy
        sample = AgentScraper(f"{base}/metrics").sample_one("node-a", 0.0)
        assert sample.error == "HTTP 503 Service Unavailable" and not sample.gpus
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
        conn.request("GET", "/healthz")  # the agent lock is free: other requests are answered
        assert conn.getresponse().status == 503
        conn.close()
    finally:
        stall.set()
    wait_for(lambda: _status(f"{base}/metrics")[0] == 200, what="fresh data once the call returns")
    assert _status(f"{base}/healthz") == (200, "ok\n")
    srv.stop()
