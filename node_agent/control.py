"""Local control channel: a unix socket in the state dir (mode 0600, same-uid or root peers only).

Input: one JSON request line per connection (``ControlRequest``: op inject | clear | list |
reset | check | ping, with spec / gpu / fault_id; the attestation ops quote (nonce) | scrub
(gpus) | handover (job_id) | pubkey, answered by ``node_agent.attest.service.control_op``).
Output: one JSON response line ``{"ok": true, "result": ...}`` or ``{"ok": false, "error":
"..."}``. Never bound to a network address: fault injection is reachable only by local users
who can open the socket.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import struct
import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node_agent.agent import Agent
from node_agent.backends.base import BackendError
from node_agent.faults import FaultSpecError, parse_fault

SOCKET_FILE = "agent.sock"
MAX_REQUEST = 64 * 1024


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


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        creds = self.request.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        if uid not in (0, os.getuid()):
            self._reply({"ok": False, "error": f"permission denied for uid {uid}"})
            return
        line = self.rfile.readline(MAX_REQUEST)
        try:
            req = ControlRequest.model_validate_json(line)
            result = dispatch(self.server.agent, req)
            self._reply({"ok": True, "result": result})
        except ValidationError as exc:
            self._reply({"ok": False, "error": f"bad request: {exc.errors()[0]['msg']}"})
        except (FaultSpecError, BackendError, ValueError) as exc:
            self._reply({"ok": False, "error": str(exc)})

    def _reply(self, doc: dict) -> None:
        self.wfile.write(json.dumps(doc).encode() + b"\n")


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, state_dir: Path, agent: Agent) -> None:
        self.agent = agent
        self.path = Path(state_dir) / SOCKET_FILE
        self.path.unlink(missing_ok=True)
        old = os.umask(0o177)
        try:
            super().__init__(str(self.path), _Handler)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.serve_forever, args=(0.05,), name="fleetyield-control", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.path.unlink(missing_ok=True)


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
