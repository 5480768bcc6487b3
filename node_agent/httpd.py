"""Bounded HTTP/1.1 serving for the agent and the controller: idle or slow clients cost an FD and a few KB
each, under fixed caps, and never a thread; a complete request never waits behind an incomplete one.

Input: a ``http.server.BaseHTTPRequestHandler`` subclass (the handlers stay stdlib handlers), an address,
``Limits`` and an optional ``WebConfig`` (TLS and basic auth, ``node_agent/webconfig.py``). Output: a
server with socketserver's surface (``server_address``, ``serve_forever``, ``shutdown``, ``server_close``)
and ``stats()`` (connections, workers, evictions, timeouts) for tests and metrics.

Why this and not ThreadingHTTPServer or a library. ThreadingHTTPServer gives every connection a thread
blocked in recv with no deadline: 300 idle connections were 304 threads on the agent, 1,017 half-sent
requests on the push port took every FD (issue 27). cheroot parks idle keep-alive connections in a
selector, but a worker thread reads each request with a per-recv timeout, so ``numthreads`` clients that
send one header line every few seconds hold every worker and every scrape waits. waitress reads whole
requests in its event loop (the design wanted) but serves no TLS, which the web-config file needs. This
module is that design on the standard library alone (selectors, ssl, a fixed thread pool): nothing new to
install on a GPU node, one thread per worker plus one, and the request handlers unchanged.

How it is bounded. One loop thread accepts, does TLS handshakes and reads each request (its head, then
the Content-Length body) into memory; only a complete request goes to one of ``workers`` threads, which
runs the handler on the buffered bytes and hands the reply back to the loop to write. Hence:
- threads: 1 + ``workers``, whatever the clients do;
- FDs: at most ``max_connections`` connections. At the cap a new connection evicts the one that has waited
  longest without a complete request (requests being served are never evicted), so a flood of idle
  connections cannot lock out a real client, which holds its connection for milliseconds;
- time: a request must arrive whole within ``request_timeout_s`` of its first byte (of the accept for the
  first one, TLS handshake included); a kept-alive connection idles at most ``idle_timeout_s``; a reply
  must drain within ``write_timeout_s``. Trickled bytes extend nothing;
- memory: a head of at most ``max_head_bytes`` (else 431), a body of at most ``max_body_bytes`` (larger,
  chunked or unparsable: the handler answers from the head alone, e.g. 413, and the connection closes),
  and bodies beyond 64 KiB per connection draw on one ``max_buffered_bytes`` budget (past it: 503).

The web-config file is re-read when it or a certificate it names changes (``webconfig.WebConfigWatcher``,
checked by the loop every ``RELOAD_CHECK_S``): new connections get the new TLS context and users.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node_agent.webconfig import WebConfig, WebConfigWatcher

log = logging.getLogger(__name__)

FREE_BUFFER = 64 << 10
"""Bytes each connection may buffer outside the shared ``max_buffered_bytes`` budget."""
_RECV = 64 << 10
_SWEEP_S = 0.2
RELOAD_CHECK_S = 1.0
"""Seconds between checks of the web-config file and its certificates for changes."""


@dataclass(frozen=True)
class Limits:
    """The caps of one listener (module docstring). Defaults suit the controller's listeners."""

    max_connections: int = 1024
    workers: int = 4
    request_timeout_s: float = 10.0
    idle_timeout_s: float = 300.0
    write_timeout_s: float = 10.0
    max_head_bytes: int = 64 << 10
    max_body_bytes: int = 1 << 20
    max_buffered_bytes: int = 64 << 20
    backlog: int = 1024


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    addr: Any
    deadline: float
    state: str = "handshake"  # handshake -> read -> busy -> write -> read ... | closed
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None
    started: bool = False  # bytes of the current request have arrived
    force_close: bool = False
    close_after: bool = False
    continued: bool = False  # "100 Continue" sent for the current request
    counted: int = 0  # bytes drawn from the shared buffer budget
    events: int = 0  # selector mask registered (0: not registered)


class _Buffered:
    """Mixed in before a handler class: the handler reads the buffered request and writes into memory."""

    request: bytes
    server: BoundedHTTPServer

    def setup(self) -> None:
        self.rfile = io.BytesIO(self.request)
        self.wfile = io.BytesIO()

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()  # type: ignore[attr-defined]

    def finish(self) -> None:
        pass

    def handle_expect_100(self) -> bool:
        return True  # the loop already sent "100 Continue" before it read the body

    def parse_request(self) -> bool:
        if not super().parse_request():  # type: ignore[misc]
            return False
        auth = self.server.web.basic_auth if self.server.web is not None else None
        if auth is not None and not auth.allows(self.headers.get("Authorization")):  # type: ignore[attr-defined]
            self.close_connection = True
            self.send_response(401)  # type: ignore[attr-defined]
            self.send_header("WWW-Authenticate", 'Basic realm="fleetyield"')  # type: ignore[attr-defined]
            self.send_header("Content-Length", "0")  # type: ignore[attr-defined]
            self.send_header("Connection", "close")  # type: ignore[attr-defined]
            self.end_headers()  # type: ignore[attr-defined]
            if self.server.on_unauthorized is not None:
                self.server.on_unauthorized()
            return False
        return True


def _simple(status: int, reason: str) -> bytes:
    return f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode()


def _head_end(buf: bytearray) -> int:
    """Index just past the blank line ending the head, or -1."""
    i = buf.find(b"\r\n\r\n")
    j = buf.find(b"\n\n")
    ends = [k + 4 for k in (i,) if k >= 0] + [k + 2 for k in (j,) if k >= 0]
    return min(ends) if ends else -1


def _framing(head: bytes) -> tuple[int | None, bool]:
    """(Content-Length or None when the body cannot be framed by it, Expect: 100-continue)."""
    lengths: set[bytes] = set()
    chunked = expect = False
    for line in head.split(b"\n")[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length":
            lengths.add(value)
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"expect" and value.lower() == b"100-continue":
            expect = True
    if chunked or len(lengths) > 1:
        return None, expect
    if not lengths:
        return 0, expect
    value = lengths.pop()
    return (int(value) if value.isdigit() and len(value) <= 18 else None), expect


class BoundedHTTPServer:
    """A bounded HTTP server (module docstring) serving ``handler`` on ``address``. Bound at construction
    (``server_address`` holds the port when 0 was asked); ``serve_forever`` runs the loop."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits | None = None,
        web: WebConfig | None = None,
        *,
        name: str = "fy-http",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits or Limits()
        self.web = web
        self.name = name
        self.on_unauthorized: Callable[[], None] | None = None
        self._clock = clock
        self._handler = type(f"Buffered{handler.__name__}", (_Buffered, handler), {})
        self._nodelay = bool(getattr(handler, "disable_nagle_algorithm", False))
        self._tls = web.tls_context() if web is not None else None
        self.watcher: WebConfigWatcher | None = None
        if web is not None:
            from node_agent.webconfig import WebConfigWatcher

            self.watcher = WebConfigWatcher(web)
        self._next_reload_check = clock() + RELOAD_CHECK_S
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(self.limits.backlog)
            self.socket.setblocking(False)
        except BaseException:
            self.socket.close()
            raise
        self.server_address: tuple[Any, ...] = self.socket.getsockname()
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._done: queue.SimpleQueue[tuple[_Conn, bytes, bool]] = queue.SimpleQueue()
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self._conns: dict[int, _Conn] = {}
        self._waiting: OrderedDict[_Conn, None] = OrderedDict()  # evictable, oldest first
        self._buffered = 0
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()
        self._closed = False
        self._accept_paused_until = 0.0
        self._last_emfile_log = -1e9
        self.counts = {"accepted": 0, "evicted": 0, "timed_out": 0, "refused": 0, "requests": 0}

    # ------------------------------------------------------------------ public surface
    def stats(self) -> dict[str, int]:
        reloads = (
            {"web_config_reloads": self.watcher.reloads, "web_config_errors": self.watcher.errors}
            if self.watcher is not None
            else {}
        )
        return {**self.counts, **reloads, "connections": len(self._conns), "busy": self._busy()}

    def _busy(self) -> int:
        return sum(1 for c in list(self._conns.values()) if c.state in ("busy", "write"))

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stopped.clear()
        try:
            self._sel.register(self.socket, selectors.EVENT_READ, "listen")
            self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            next_sweep = self._clock() + _SWEEP_S
            while not self._stopping.is_set():
                for key, mask in self._sel.select(min(poll_interval, _SWEEP_S)):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    else:
                        self._on_event(key.data, mask)
                self._completions()
                now = self._clock()
                if now >= next_sweep:
                    self._sweep(now)
                    next_sweep = now + _SWEEP_S
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(self.socket)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(self._wake_r)
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait for it (socketserver's contract)."""
        self._stopping.set()
        self._wake()
        self._stopped.wait()

    def server_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in list(self._conns.values()):
            self._close(conn)
        self.socket.close()
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    # ------------------------------------------------------------------ connections
    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _watch(self, conn: _Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events and events:
            self._sel.modify(conn.sock, events, conn)
        elif events:
            self._sel.register(conn.sock, events, conn)
        else:
            self._sel.unregister(conn.sock)
        conn.events = events

    def _accept(self) -> None:
        now = self._clock()
        if now < self._accept_paused_until:
            return
        for _ in range(256):
            try:
                sock, addr = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE/ENFILE/ENOBUFS: free one idle connection, pause accepting
                if now - self._last_emfile_log > 10:
                    log.error("%s: cannot accept: %s", self.name, exc)
                    self._last_emfile_log = now
                if self._waiting:
                    self._evict()
                self._accept_paused_until = now + 0.05
                return
            self.counts["accepted"] += 1
            if len(self._conns) >= self.limits.max_connections:
                if self._waiting:
                    self._evict()
                else:  # every connection is being served: this one must wait its turn elsewhere
                    self.counts["refused"] += 1
                    sock.close()
                    continue
            self._add(sock, addr, now)

    def _add(self, sock: socket.socket, addr: Any, now: float) -> None:
        sock.setblocking(False)
        if self._nodelay:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                sock.close()
                return
        conn = _Conn(sock, addr, now + self.limits.request_timeout_s)
        conn.state = "handshake" if self._tls is not None else "read"
        self._conns[sock.fileno()] = conn
        self._waiting[conn] = None
        self._watch(conn, selectors.EVENT_READ)
        if self._tls is not None:
            self._handshake(conn)

    def _evict(self) -> None:
        conn, _ = self._waiting.popitem(last=False)
        self.counts["evicted"] += 1
        self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if conn.state == "closed":
            return
        self._waiting.pop(conn, None)
        self._uncount(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            if conn.events:
                self._sel.unregister(conn.sock)
        conn.events = 0
        self._conns.pop(conn.sock.fileno(), None)
        conn.state = "closed"
        with contextlib.suppress(OSError):
            conn.sock.close()

    def _fail(self, conn: _Conn, status: int, reason: str) -> None:
        """Answer ``status`` if the socket takes it at once, then close."""
        if conn.state in ("read", "write") and not isinstance(conn.sock, ssl.SSLSocket):
            with contextlib.suppress(OSError):
                conn.sock.send(_simple(status, reason))
        self._close(conn)

    def _sweep(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now and c.state != "busy"]:
            self.counts["timed_out"] += 1
            if conn.state == "read" and conn.started:
                self._fail(conn, 408, "Request Timeout")
            else:
                self._close(conn)
        if self.watcher is not None and now >= self._next_reload_check:
            self._next_reload_check = now + RELOAD_CHECK_S
            web = self.watcher.check()
            if web is not None:  # new connections use it; open ones keep their TLS session
                self.web = web
                self._tls = web.tls_context()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._accept()

    # ------------------------------------------------------------------ reading
    def _on_event(self, conn: _Conn, mask: int) -> None:
        if conn.state == "handshake":
            self._handshake(conn)
        elif conn.state == "read" and mask & selectors.EVENT_READ:
            self._read(conn)
        elif conn.state == "write":
            self._write(conn)

    def _handshake(self, conn: _Conn) -> None:
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:
            log.debug("%s: TLS handshake with %s failed: %s", self.name, conn.addr, exc)
            self._close(conn)
            return
        assert self.web is not None
        if not self.web.peer_allowed(sock.getpeercert()):
            log.debug("%s: client certificate of %s has no allowed SAN", self.name, conn.addr)
            self._close(conn)
            return
        conn.state = "read"
        self._watch(conn, selectors.EVENT_READ)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        sock = conn.sock
        got = False
        for _ in range(64):
            try:
                data = sock.recv(_RECV)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._close(conn)
                return
            if not data:
                self._close(conn)
                return
            got = True
            conn.inbuf += data
            if len(conn.inbuf) > self.limits.max_head_bytes + self.limits.max_body_bytes:
                break  # framing below decides; never buffer past one request's limit
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()) and len(data) < _RECV:
                break
        if got and not conn.started:
            conn.started = True
            conn.deadline = min(conn.deadline, self._clock() + self.limits.request_timeout_s)
        if not self._recount(conn):
            return
        self._frame(conn)

    def _recount(self, conn: _Conn) -> bool:
        want = max(0, len(conn.inbuf) - FREE_BUFFER)
        self._buffered += want - conn.counted
        conn.counted = want
        if self._buffered > self.limits.max_buffered_bytes:
            log.warning(
                "%s: request buffers full (%d bytes): refusing %s", self.name, self._buffered, conn.addr
            )
            self._fail(conn, 503, "Service Unavailable")
            return False
        return True

    def _uncount(self, conn: _Conn) -> None:
        self._buffered -= conn.counted
        conn.counted = 0

    def _frame(self, conn: _Conn) -> None:
        """Dispatch the request in ``inbuf`` once it is whole."""
        buf = conn.inbuf
        end = _head_end(buf)
        if end < 0:
            if len(buf) > self.limits.max_head_bytes:
                self._fail(conn, 431, "Request Header Fields Too Large")
            return
        if end > self.limits.max_head_bytes:
            self._fail(conn, 431, "Request Header Fields Too Large")
            return
        length, expect = _framing(bytes(buf[:end]))
        if length is None or length > self.limits.max_body_bytes:
            request = bytes(buf[:end])  # the handler answers from the head; the rest is not read
            conn.force_close = True
            buf.clear()
        elif len(buf) - end >= length:
            request = bytes(buf[: end + length])
            del buf[: end + length]
        else:
            if expect and not conn.continued:
                conn.continued = True
                with contextlib.suppress(OSError, ssl.SSLError):
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        self._recount(conn)
        self._dispatch(conn, request)

    def _dispatch(self, conn: _Conn, request: bytes) -> None:
        conn.state = "busy"
        self._waiting.pop(conn, None)
        self._watch(conn, 0)
        self.counts["requests"] += 1
        self._pool.submit(self._work, conn, request)

    def _work(self, conn: _Conn, request: bytes) -> None:
        """In a worker: run the handler on the buffered request; the loop writes the reply."""
        try:
            h = self._handler(request, conn.addr, self)  # type: ignore[call-arg]
            reply, close = h.wfile.getvalue(), bool(h.close_connection)
        except Exception:
            log.error("%s: error serving %s", self.name, conn.addr, exc_info=sys.exc_info())
            reply, close = _simple(500, "Internal Server Error"), True
        self._done.put((conn, reply, close))
        self._wake()

    # ------------------------------------------------------------------ writing
    def _completions(self) -> None:
        while True:
            try:
                conn, reply, close = self._done.get_nowait()
            except queue.Empty:
                return
            if conn.state != "busy":
                continue
            conn.state = "write"
            conn.out = memoryview(reply)
            conn.close_after = close or conn.force_close
            conn.deadline = self._clock() + self.limits.write_timeout_s
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        while conn.out:
            try:
                n = conn.sock.send(conn.out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except OSError:
                self._close(conn)
                return
            conn.out = conn.out[n:]
        conn.out = None
        if conn.close_after:
            with contextlib.suppress(OSError):
                if not isinstance(conn.sock, ssl.SSLSocket):
                    conn.sock.shutdown(socket.SHUT_WR)
            self._close(conn)
            return
        now = self._clock()
        conn.state = "read"
        conn.started = bool(conn.inbuf)
        conn.continued = False
        conn.deadline = now + (self.limits.request_timeout_s if conn.started else self.limits.idle_timeout_s)
        self._waiting[conn] = None
        self._watch(conn, selectors.EVENT_READ)
        if conn.inbuf:
            self._frame(conn)


_COUNTERS = {
    "accepted": "Connections accepted.",
    "evicted": "Connections closed at the cap to make room (the longest-waiting first).",
    "timed_out": "Connections closed at a read, idle or write deadline.",
    "refused": "Connections refused at the cap while every held one was being served.",
    "requests": "Complete requests handed to a worker.",
    "web_config_reloads": "Web-config files reloaded after a change.",
    "web_config_errors": "Changed web-config files that did not load (the previous config stayed in force).",
}


class ListenerCollector:
    """Prometheus collector over listeners' ``stats()`` (this module's servers and the agent's control
    socket), read at scrape time: ``<prefix>_listener_<count>_total{listener}`` and
    ``<prefix>_listener_connections{listener}``. ``listeners()`` returns (name, server) pairs."""

    def __init__(self, prefix: str, listeners: Callable[[], list[tuple[str, Any]]]) -> None:
        self._prefix = prefix
        self._listeners = listeners

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = [(name, server.stats()) for name, server in self._listeners() if server is not None]
        for key, doc in _COUNTERS.items():
            family = CounterMetricFamily(f"{self._prefix}_listener_{key}", doc, labels=["listener"])
            for name, s in stats:
                if key in s:
                    family.add_metric([name], s[key])
            yield family
        gauge = GaugeMetricFamily(
            f"{self._prefix}_listener_connections", "Connections held now.", labels=["listener"]
        )
        for name, s in stats:
            gauge.add_metric([name], s["connections"])
        yield gauge
