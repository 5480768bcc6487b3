"""The agent's one network control operation: a GPU reset the controller asks for, signed.

Input: ``POST /v1/control/reset`` on the agent's HTTP port with a ``ResetRequest`` body and the push
protocol's headers (node, timestamp, ``HMAC-SHA256(secret, "<ts>." + body)``; the same shared secret as the
event push). Output: ``(status, JSON)``: 200 with the per-GPU reset results, 400 malformed, 401 bad or stale
signature, 403 not addressed to this node, 409 the ``request_id`` was already used, 503 no secret
configured, 500 the backend failed.

Why a nonce on top of the timestamp: a reset is not idempotent (it kills whatever runs on the GPU), and a
captured request would otherwise be replayable for the whole skew window. Used ids are kept (in memory and
in ``STATE_DIR/control_nonces.json``, so an agent restart does not reopen the window) until their signature
could no longer pass the timestamp check and the controller would no longer send them again
(``protocol.reset_id_memory_s``). Fault injection stays local-only (unix socket, ``control``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from node_agent.agent import Agent
from node_agent.backends.base import BackendError
from node_agent.protocol import ResetRequest, SignatureError, reset_id_memory_s, verify_signed
from node_agent.state import write_atomic

log = logging.getLogger(__name__)
NONCE_FILE = "control_nonces.json"
MAX_BODY = 16 * 1024


class ResetEndpoint:
    def __init__(
        self,
        agent: Agent,
        secret: bytes | None,
        clock: Callable[[], float],
        *,
        max_skew_s: float = 300.0,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``on_refused(reason)``: a request refused for its authentication (``bad_signature``, the 401) or
        its addressee (``wrong_node``, the 403); the agent counts them (``node_agent.unauthenticated``)."""
        self.agent = agent
        self.secret = secret
        self.clock = clock
        self.max_skew_s = max_skew_s
        self.on_refused = on_refused
        self._lock = threading.Lock()
        self._path = Path(agent.state_dir) / NONCE_FILE
        self._seen: dict[str, float] = self._load()

    def _load(self) -> dict[str, float]:
        try:
            doc = json.loads(self._path.read_bytes())
            return {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
        except (OSError, ValueError, TypeError):
            return {}

    def _remember(self, request_id: str, now: float) -> bool:
        """Consume ``request_id``; False when it was already used (a replay)."""
        with self._lock:
            horizon = now - reset_id_memory_s(self.max_skew_s)
            self._seen = {k: t for k, t in self._seen.items() if t >= horizon}
            if request_id in self._seen:
                return False
            self._seen[request_id] = now
            write_atomic(self._path, json.dumps(self._seen).encode())
            return True

    def handle(self, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        if not self.secret:
            return 503, {"error": "remote control is disabled (no --push-secret-file)"}
        if len(body) > MAX_BODY:
            return 413, {"error": f"body larger than {MAX_BODY} bytes"}
        now = self.clock()
        try:
            node = verify_signed(self.secret, headers, body, now, self.max_skew_s)
        except SignatureError as exc:
            self._refused("bad_signature")
            return 401, {"error": str(exc)}
        try:
            req = ResetRequest.model_validate_json(body)
        except ValidationError as exc:
            return 400, {"error": f"malformed body: {exc.errors()[0]['msg']}"}
        if req.node != node or node != self.agent.node:
            self._refused("wrong_node")
            return 403, {"error": f"request for {req.node!r} (header {node!r}), this is {self.agent.node!r}"}
        if not self._remember(req.request_id, now):
            return 409, {"error": f"request_id {req.request_id} was already used (replay)"}
        gpus = req.gpus or self._all_gpus()
        results = []
        try:
            for gpu in gpus:
                results.append(self.agent.reset(gpu))
        except (BackendError, ValueError) as exc:
            log.error("remote reset %s of gpus %s failed: %s", req.request_id, gpus, exc)
            return 500, {"error": str(exc), "request_id": req.request_id, "done": results}
        log.info("remote reset %s: gpus %s", req.request_id, gpus)
        return 200, {"request_id": req.request_id, "node": node, "gpus": gpus, "results": results}

    def _refused(self, reason: str) -> None:
        if self.on_refused is not None:
            self.on_refused(reason)

    def _all_gpus(self) -> list[int]:
        state = getattr(self.agent.backend, "state", None)
        if state is not None and getattr(state, "gpus", None) is not None:
            return [g.index for g in state.gpus]
        return list(range(self.agent.backend.expected_gpus()))
