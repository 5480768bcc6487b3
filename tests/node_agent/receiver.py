"""A local HTTP receiver that verifies pushed batches (test helper)."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from node_agent.protocol import AgentEventBatch, SignatureError, verify


class Receiver:
    def __init__(self, secret: bytes, port: int = 0) -> None:
        self.secret = secret
        self.batches: list[AgentEventBatch] = []
        self.rejected: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                try:
                    outer.batches.append(verify(outer.secret, dict(self.headers), body, now=time.time()))
                    self.send_response(204)
                except SignatureError as exc:
                    outer.rejected.append(str(exc))
                    self.send_response(401)
                self.end_headers()

            def log_message(self, *_a: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/agent/events"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def events(self) -> list:
        return [e for b in self.batches for e in b.events]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.01) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
