"""What the controller's two HTTP listeners share (``api``: the read-only API, ``ingest``: the push listener).

Input: a request handler class, a host and a port; in a handler, the request's ``Content-Length`` and body.
Output: a bounded HTTP server (``node_agent.httpd``: connection cap, read deadlines, a fixed worker pool,
TLS and basic auth from a web-config file) on a background daemon thread (``BackgroundServer``), a request
body read under a size limit or the refusal to read it (``read_body`` raises ``RequestRefused`` with the
status and JSON document the listener answers: 411 without ``Content-Length``, 400 when it is not a
number, 413 over the limit; the body is then never read), and one way to write a reply (``send``).

This module imports no other adapter: both listeners may use it without reaching each other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from node_agent.httpd import BoundedHTTPServer, Limits

if TYPE_CHECKING:
    from node_agent.webconfig import WebConfig


class RequestRefused(Exception):
    """The request is refused before its body is read: ``status`` and the JSON ``doc`` to answer."""

    def __init__(self, status: int, doc: dict[str, Any]) -> None:
        super().__init__(doc.get("error", ""))
        self.status = status
        self.doc = doc


def read_body(handler: BaseHTTPRequestHandler, max_bytes: int) -> bytes:
    """The request body, at most ``max_bytes``; raises ``RequestRefused`` (411, 400, 413) otherwise."""
    length_header = handler.headers.get("Content-Length")
    if length_header is None:
        raise RequestRefused(411, {"error": "Content-Length required"})
    try:
        length = int(length_header)
    except ValueError:
        raise RequestRefused(400, {"error": f"bad Content-Length {length_header!r}"}) from None
    if length < 0 or length > max_bytes:
        raise RequestRefused(413, {"error": f"body of {length} bytes exceeds {max_bytes}"})
    return handler.rfile.read(length)


def send(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    headers: Iterable[tuple[str, str]] = (),
    *,
    close: bool = False,
) -> None:
    """Write one reply: the status, ``headers``, then Content-Length (and ``Connection: close`` with
    ``close``, which also ends the connection after this reply), then the body.

    Headers and body leave in two writes: a handler class using this sets ``disable_nagle_algorithm``,
    or on a keep-alive connection a small body waits ~40 ms for the client's delayed ACK."""
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    if close:
        handler.send_header("Connection", "close")
        handler.close_connection = True
    handler.end_headers()
    if body:
        handler.wfile.write(body)


class BackgroundServer:
    """A ``BoundedHTTPServer`` on a daemon thread named ``name``. ``port=0`` binds any free port (``.port``).
    ``web``: TLS and basic auth (``node_agent.webconfig``); ``limits``: its caps (``node_agent.httpd``)."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: type[BaseHTTPRequestHandler],
        name: str,
        limits: Limits | None = None,
        web: WebConfig | None = None,
    ) -> None:
        self._httpd = BoundedHTTPServer((host, port), handler, limits, web, name=name)
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def httpd(self) -> BoundedHTTPServer:
        return self._httpd

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.1,), name=self._name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread:
            self._thread.join(5)
