"""Local control channel: a unix socket in the state dir (mode 0600, same-uid or root peers only).

Input: one JSON request line per connection (``ControlRequest``: op inject | clear | list |
reset | check | ping, with spec / gpu / fault_id; the attestation ops quote (nonce) | scrub
(gpus) | handover (job_id) | pubkey, answered by ``node_agent.attest.service.control_op``).
Output: one JSON response line ``{"ok": true, "result": ...}`` or ``{"ok": false, "error":
"..."}``. Never bound to a network address: fault injection is reachable only by local users
who can open the socket.

Bounded as the HTTP listeners are (node_agent/httpd.py, issue 27): a ThreadingUnixStreamServer spent a
thread per connection, blocked with no deadline, so idle local clients could pile up threads without end.
Here one loop thread (selectors) accepts, checks the peer's uid and reads each request line, which must
arrive within ``READ_TIMEOUT_S``; ``WORKERS`` threads answer complete lines; at most ``MAX_CONNECTIONS``
are held, and at the cap a new connection evicts the one waiting longest for its line. The loop is written
here rather than taken from httpd.py because this is a line protocol, not HTTP; the standard library is
all it needs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node_agent.agent import Agent
from node_agent.backends.base import BackendError
from node_agent.faults import FaultSpecError, parse_fault

log = logging.getLogger(__name__)
SOCKET_FILE = "agent.sock"
MAX_REQUEST = 64 * 1024
MAX_CONNECTIONS = 64
"""Connections held at once: its clients are the Prolog/Epilog and an admin, one request each."""
WORKERS = 2
"""Requests answered at once (a reset or a scrub may take seconds; the rest wait their turn)."""
READ_TIMEOUT_S = 5.0
"""A request line must arrive whole within this many seconds of the connect."""
WRITE_TIMEOUT_S = 10.0
BACKLOG = 128
SWEEP_S = 0.2


class ControlError(RuntimeError):
    pass


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: Literal["inject", "clear", "list", "reset", "check", "ping", "quote", "scrub", "handover", "pubkey"]
    spec: dict[str, Any] | None = None
    gpu: int | None = None
    fault_id: str | None = None
    nonce: str | None = None  # quote: the controller's nonce
    gpus: list[int] | None = None  # scrub: GPU indices (empty or unset: every GPU)
    job_id: str | None = None  # handover: the job that just ended (logged by the controller)
    # handover on a shared node: the jobs still running here ({"job_id": "123", "uid": 1001}), whose
    # tenants' files, IPC and processes are not leftovers (node_agent.attest.probes.CoResident)
    co_resident: list[dict[str, Any]] | None = Field(default=None, max_length=1024)
    diag_level: int = Field(default=0, ge=0, le=4)  # check: dcgmi diag -r N on real GPUs (0: none)


ATTEST_OPS = frozenset({"quote", "scrub", "handover", "pubkey"})


def dispatch(agent: Agent, req: ControlRequest) -> Any:
    if req.op in ATTEST_OPS:
        from node_agent.attest.service import control_op

        return control_op(agent.attestor, req.op, req.model_dump())
    if req.op == "ping":
        return {"node": agent.node, "backend": agent.backend.name}
    if req.op == "inject":
        if req.spec is None:
            raise FaultSpecError("inject needs a fault spec")
        return agent.inject(parse_fault(req.spec))
    if req.op == "clear":
        return agent.clear(gpu=req.gpu, fault_id=req.fault_id)
    if req.op == "list":
        return agent.list_faults(req.gpu)
    if req.op == "reset":
        if req.gpu is None:
            raise BackendError("reset needs --gpu")
        return agent.reset(req.gpu)
    return agent.check(req.gpu, req.diag_level).model_dump(mode="json")


def answer(agent: Agent, line: bytes) -> dict[str, Any]:
    """The response document for one request line."""
    try:
        req = ControlRequest.model_validate_json(line)
        return {"ok": True, "result": dispatch(agent, req)}
    except ValidationError as exc:
        return {"ok": False, "error": f"bad request: {exc.errors()[0]['msg']}"}
    except (FaultSpecError, BackendError, ValueError) as exc:
        return {"ok": False, "error": str(exc)}


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)


class ControlServer:
    """The control socket, bounded as the HTTP listeners are (module doc): one loop thread reads each
    request line with a deadline, ``workers`` threads answer complete ones, at most ``max_connections``
    are held (at the cap a new one evicts the one waiting longest)."""

    def __init__(
        self,
        state_dir: Path,
        agent: Agent,
        *,
        max_connections: int = MAX_CONNECTIONS,
        workers: int = WORKERS,
        read_timeout_s: float = READ_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``on_refused(reason)``: a caller refused for who it is (``peer_uid``: neither root nor the agent's
        uid, reachable only where the socket's mode was loosened); the agent counts them
        (``node_agent.unauthenticated``)."""
        self.agent = agent
        self.on_refused = on_refused
        self.path = Path(state_dir) / SOCKET_FILE
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self._clock = clock
        self.path.unlink(missing_ok=True)
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.socket.bind(str(self.path))
        except BaseException:
            self.socket.close()
            raise
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.socket.listen(BACKLOG)
        self.socket.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="fleetyield-control-worker")
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()  # reading, oldest first
        self._busy = 0  # handed to a worker, not yet closed
        self._busy_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counts = {"accepted": 0, "evicted": 0, "timed_out": 0, "refused": 0, "denied": 0, "requests": 0}

    def stats(self) -> dict[str, int]:
        return {**self.counts, "connections": len(self._waiting) + self._busy, "busy": self._busy}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="fleetyield-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in list(self._waiting):
            self._close(conn)
        self.socket.close()
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the loop
    def _serve(self) -> None:
        self._sel.register(self.socket, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        while not self._stop.is_set():
            for key, _ in self._sel.select(SWEEP_S):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                else:
                    self._read(key.data)
            now = self._clock()
            for conn in [c for c in self._waiting if c.deadline <= now]:
                self.counts["timed_out"] += 1
                self._close(conn)

    def _accept(self) -> None:
        for _ in range(256):
            try:
                sock, _addr = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE: free the longest-waiting connection, try later
                log.error("control socket: cannot accept: %s", exc)
                if self._waiting:
                    self._evict()
                return
            self.counts["accepted"] += 1
            sock.setblocking(False)
            uid = _peer_uid(sock)
            if uid not in (0, os.getuid()):
                self.counts["denied"] += 1
                if self.on_refused is not None:
                    self.on_refused("peer_uid")
                with contextlib.suppress(OSError):
                    sock.send(_line({"ok": False, "error": f"permission denied for uid {uid}"}))
                sock.close()
                continue
            if len(self._waiting) + self._busy >= self.max_connections:
                if not self._waiting:  # every connection is being answered: refuse this one
                    self.counts["refused"] += 1
                    sock.close()
                    continue
                self._evict()
            conn = _Conn(sock, self._clock() + self.read_timeout_s)
            self._waiting[conn] = None
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evict(self) -> None:
        conn, _ = self._waiting.popitem(last=False)
        self.counts["evicted"] += 1
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        self._waiting.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(MAX_REQUEST)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        conn.buf += data
        end = conn.buf.find(b"\n")
        if end < 0 and len(conn.buf) < MAX_REQUEST and data:
            return  # not whole yet
        if not conn.buf:  # closed before sending anything
            self._close(conn)
            return
        line = bytes(conn.buf[: end + 1] if end >= 0 else conn.buf[:MAX_REQUEST])
        self._waiting.pop(conn, None)
        self._sel.unregister(conn.sock)
        with self._busy_lock:
            self._busy += 1
        self.counts["requests"] += 1
        self._pool.submit(self._work, conn.sock, line)

    def _work(self, sock: socket.socket, line: bytes) -> None:
        """In a worker: answer, write with a deadline, close."""
        try:
            try:
                reply = answer(self.agent, line)
            except Exception as exc:  # a bug answers an error, never kills the worker
                log.exception("control request failed")
                reply = {"ok": False, "error": f"internal error: {type(exc).__name__}"}
            sock.settimeout(WRITE_TIMEOUT_S)
            with contextlib.suppress(OSError):
                sock.sendall(_line(reply))
        finally:
            sock.close()
            with self._busy_lock:
                self._busy -= 1


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


def call(state_dir: Path, request: dict[str, Any], timeout_s: float = 10.0) -> Any:
    """Send one request to the running server; raise ``ControlError`` with its message."""
    path = Path(state_dir) / SOCKET_FILE
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise ControlError(f"cannot reach the agent at {path}: {exc}") from None
        sock.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
    doc = json.loads(buf)
    if not doc.get("ok"):
        raise ControlError(doc.get("error", "unknown error"))
    return doc["result"]
