"""Issue 27 items 2 and 6 (node_agent/supervise.py): the NVML XID thread survives its callback's failures and
says so; a hung backend call makes the node's data stale, bounded, and says so; so does a hung NVML call in
the backend's own loops (slow counters, XID events), through their heartbeats."""

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
from prometheus_client.registry import CollectorRegistry
from rig import wait_for

from node_agent import exporter, fatal
from node_agent.agent import Agent
from node_agent.backends.nvml import XID_ROUND_S, NvmlBackend
from node_agent.collector import GpuCollector, ThreadCollector
from node_agent.config import build_config
from node_agent.exporter import Server
from node_agent.exposition import render
from node_agent.supervise import STALE_FACTOR, BackendStuck, Guard, Heartbeat, Supervised
from slurm_fleetyield.adapters.scrape import AgentScraper


class _NVMLError(Exception):
    pass


class _Timeout(_NVMLError):
    pass


class _Nvml(SimpleNamespace):
    """A pynvml for one GPU: what is set is used; any other ``nvmlDevice*`` read is NotSupported (omitted
    from the sample) and any ``NVML_*`` constant 0, so ``sample()`` runs."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("NVML_"):
            return 0
        if name.startswith("nvmlDevice"):
            return _not_supported
        raise AttributeError(name)


def _not_supported(*_a: object) -> None:
    raise _NVMLError("Not Supported")


def _fake_nvml(events: queue.Queue, wait_s: float | None = None) -> SimpleNamespace:
    """``wait_s``: how long one event wait blocks (default: the ``ms`` asked, as NVML)."""
    fail = _not_supported

    def wait(_set: object, ms: int) -> SimpleNamespace:
        try:
            xid = events.get(timeout=ms / 1000 if wait_s is None else wait_s)
        except queue.Empty:
            raise _Timeout("Timeout") from None
        return SimpleNamespace(eventType=8, eventData=xid, device="h0")

    return _Nvml(
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


class _Hang:
    """Wraps an NVML function: while ``armed``, a call signals ``entered`` and blocks until ``release``."""

    def __init__(self, fn):  # type: ignore[no-untyped-def]
        self.fn = fn
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args):  # type: ignore[no-untyped-def]
        if self.armed.is_set():
            self.entered.set()
            self.release.wait()
        return self.fn(*args)

    def free(self) -> None:
        self.armed.clear()
        self.release.set()


def test_heartbeat_is_stale_past_three_intervals_and_not_during_a_backoff() -> None:
    now = [0.0]
    beat = Heartbeat("loop", "the counters", 10.0, lambda: now[0])
    now[0] = 10.0 * STALE_FACTOR
    assert beat.stale() is None and beat.age() == 30.0
    now[0] = 31.0
    assert beat.stale() == "loop finished no round for 31 s (stale after 30 s): the counters stale"
    beat.beat()
    assert beat.stale() is None and beat.age() == 0.0

    def dies(_stop: threading.Event) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    sup = Supervised("t", dies, initial_s=3600.0, heartbeat=beat)
    sup.start()
    try:
        wait_for(lambda: sup.failing, what="the first failure")
        now[0] = 1000.0  # waiting out its backoff: failing (health says so), not stale
        assert beat.stale() is None
    finally:
        sup.stop()


def _serve(tmp_path: Path, monkeypatch, backend: NvmlBackend) -> Server:  # type: ignore[no-untyped-def]
    """The agent's server over an injected NVML backend."""
    monkeypatch.setattr(exporter, "make_backend", lambda _cfg, _clock: backend)
    cfg = build_config(
        None, {"backend": "fake", "listen": "127.0.0.1", "port": 0, "state_dir": tmp_path / "s", "gpus": 1}
    )
    srv = Server(cfg)
    srv.start()
    return srv


def _energy(body: str) -> float:
    (line,) = [x for x in body.splitlines() if x.startswith("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{")]
    return float(line.rsplit(" ", 1)[1])


def test_a_hung_slow_counter_read_makes_the_node_stale_until_it_returns(tmp_path: Path, monkeypatch) -> None:
    """The refresher's energy read hangs: after 3 intervals /healthz names the loop and /metrics fails (the
    controller's scrape: UNKNOWN) instead of serving the last energy, violation and PCIe replay counters
    with a 200; once the read returns, fresh counters are served again."""
    nv = _fake_nvml(queue.Queue(), wait_s=0.05)
    energy = [0]

    def read_energy(_h: object) -> int:
        energy[0] += 1000
        return energy[0]

    hang = _Hang(read_energy)
    nv.nvmlDeviceGetTotalEnergyConsumption = hang
    now = [0.0]
    backend = NvmlBackend("node-x", nvml=nv, slow_interval_s=0.05, monotonic=lambda: now[0])
    srv = _serve(tmp_path, monkeypatch, backend)
    base = f"http://127.0.0.1:{srv.port}"
    try:
        status, body = _status(f"{base}/metrics")
        assert status == 200 and _energy(body) >= 1000
        assert 'fleetyield_agent_loop_round_age_seconds{loop="fleetyield-nvml-slow"} 0\n' in body
        hang.armed.set()
        assert hang.entered.wait(15), "the refresher reached the hanging read"
        served = energy[0]
        now[0] = 0.05 * STALE_FACTOR  # 3 intervals: not yet stale
        assert _status(f"{base}/healthz") == (200, "ok\n")
        status, body = _status(f"{base}/metrics")
        assert status == 200 and _energy(body) == served
        now[0] = 0.05 * STALE_FACTOR + 0.01
        status, body = _status(f"{base}/healthz")
        assert status == 503 and "fleetyield-nvml-slow finished no round" in body and "energy" in body
        status, body = _status(f"{base}/metrics")
        assert status == 503 and "fleetyield-nvml-slow" in body and "DCGM_FI_DEV" not in body
        sample = AgentScraper(f"{base}/metrics").sample_one("node-x", 0.0)
        assert sample.error == "HTTP 503 Service Unavailable" and not sample.gpus  # the node is UNKNOWN
        assert srv.agent is not None and srv.agent.guard.stuck() is None  # the fast path is fine meanwhile
        hang.free()
        wait_for(lambda: _status(f"{base}/metrics")[0] == 200, what="fresh data once the read returns")
        assert _energy(_status(f"{base}/metrics")[1]) > served
        assert _status(f"{base}/healthz") == (200, "ok\n")
    finally:
        hang.free()
        srv.stop()


@pytest.mark.parametrize("call", ["nvmlEventSetWait", "nvmlDeviceGetUUID"])
def test_a_hung_xid_call_makes_the_node_stale_until_it_returns(tmp_path: Path, call: str) -> None:
    """The XID thread hangs in NVML (its event wait, or naming the GPU of an XID): thread_up still says 1, but
    past 3 rounds health names the loop and the scrape fails rather than serve XID counters that no longer
    move; when the call returns, the XID is delivered and the node is fresh again."""
    events: queue.Queue = queue.Queue()
    nv = _fake_nvml(events, wait_s=0.05)
    hang = _Hang(getattr(nv, call))
    setattr(nv, call, hang)
    now = [0.0]
    backend = NvmlBackend("node-x", nvml=nv, monotonic=lambda: now[0])
    agent = Agent(backend, tmp_path, "node-x", lambda: 1000.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(backend, "node-x", lambda: 1000.0, call=agent.guard.call))
    registry.register(ThreadCollector(backend))
    backend.start()
    try:
        assert b'fleetyield_agent_loop_round_age_seconds{loop="fleetyield-nvml-xid"}' in render(registry)
        hang.armed.set()
        events.put(79)
        assert hang.entered.wait(15), f"the XID thread reached the hanging {call}"
        now[0] = XID_ROUND_S * STALE_FACTOR
        assert agent.health() == []
        now[0] += 1
        (problem,) = agent.health()
        assert problem.startswith("fleetyield-nvml-xid finished no round") and "XID events stale" in problem
        with pytest.raises(BackendStuck, match="fleetyield-nvml-xid"):
            render(registry)
        thread = {s.name: s.value for m in ThreadCollector(backend).collect() for s in m.samples}
        assert thread["fleetyield_agent_thread_up"] == 1  # what the thread gauge alone says
        hang.free()
        wait_for(lambda: agent.health() == [], what="fresh once the call returns")
        pending = wait_for(lambda: fatal.read_pending(tmp_path), what="the XID delivered")
        assert [(p["xid"], p["gpu"]) for p in pending] == [(79, 0)]
        assert b'fleetyield_gpu_xid_errors_total{gpu="0"' in render(registry)
    finally:
        hang.free()
        backend.stop()
