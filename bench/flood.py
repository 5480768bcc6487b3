"""Hold N idle or slow connections open against one port (issue 27 item 1's attack), in its own process.

Input: host and port (or ``--unix PATH``: the agent's control socket), N and a mode: ``idle`` (connect,
send nothing), ``half`` (send half a request head),
``trickle`` (half a head, then one more header line per connection every ``--every`` seconds, reconnecting
any the server closed), ``body`` (a whole POST head promising 4 KiB, then 10 bytes of it). Output: one line
``ready <open> <failed>`` on stdout once every connection was attempted, then ``stats <open> <reconnects>``
lines every second; it runs until stdin closes (the parent's signal to stop), then closes everything.
Own process: its FDs do not count against the server process under test. Used by tests/test_listeners.py
and bench/bench_listeners.py.
"""

from __future__ import annotations

import contextlib
import errno
import resource
import select
import socket
import sys
import time

import click

HEADS = {
    "idle": b"",
    "half": b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
    "trickle": b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
    "body": b"POST /v1/agent/events HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\n\r\n0123456789",
}


def raise_nofile(want: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``want`` (never above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


UNIX_HEADS = {"idle": b"", "half": b'{"op": "pi'}
"""``--unix``: the agent's control socket speaks JSON lines; half a line never ends."""


def _connect_unix(s: socket.socket, path: str, timeout_s: float = 5.0) -> None:
    """A unix socket with a timeout is non-blocking inside: its connect fails with EAGAIN at once while the
    server's backlog is full, where TCP's waits. Retry until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            s.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.001)  # the backlog drains as the server accepts


def _open(host: str, port: int, head: bytes, unix: str | None = None) -> socket.socket | None:
    if unix:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        if unix:
            _connect_unix(s, unix)
        else:
            s.connect((host, port))
        if head:
            s.sendall(head)
    except OSError:
        s.close()
        return None
    s.setblocking(False)
    return s


@click.command()
@click.option("--host", default="127.0.0.1")
@click.option("--port", type=int, default=0, help="TCP port (or --unix).")
@click.option("--unix", default=None, help="A unix socket path instead (modes idle and half only).")
@click.option("-n", "count", type=int, default=1000, help="Connections to hold.")
@click.option("--mode", type=click.Choice(sorted(HEADS)), default="half")
@click.option("--every", type=float, default=1.0, help="trickle: seconds between header lines.")
def main(host: str, port: int, unix: str | None, count: int, mode: str, every: float) -> None:
    raise_nofile(count + 64)
    if unix and mode not in UNIX_HEADS:
        raise click.BadParameter(f"--unix takes {sorted(UNIX_HEADS)}, got {mode!r}", param_hint="--mode")
    if not unix and not port:
        raise click.BadParameter("give --port or --unix", param_hint="--port")
    head = UNIX_HEADS[mode] if unix else HEADS[mode]
    socks: list[socket.socket | None] = []
    failed = 0
    for _ in range(count):
        s = _open(host, port, head, unix)
        failed += s is None
        socks.append(s)
    print(f"ready {sum(s is not None for s in socks)} {failed}", flush=True)
    reconnects = 0
    next_stats = time.monotonic() + 1.0
    while True:
        readable, _, _ = select.select([sys.stdin], [], [], every)
        if readable and not sys.stdin.readline():
            break
        for i, s in enumerate(socks):
            if s is None:
                continue
            try:
                with contextlib.suppress(BlockingIOError):
                    if s.recv(4096) == b"":  # the server closed it
                        raise ConnectionResetError(errno.ECONNRESET, "closed")
                if mode == "trickle":
                    s.send(b"X-a: b\r\n")
            except OSError:
                s.close()
                socks[i] = None
                if mode == "trickle":
                    socks[i] = _open(host, port, head, unix)
                    reconnects += 1
        if time.monotonic() >= next_stats:
            print(f"stats {sum(s is not None for s in socks)} {reconnects}", flush=True)
            next_stats = time.monotonic() + 1.0
    for s in socks:
        if s is not None:
            s.close()


if __name__ == "__main__":
    main()
