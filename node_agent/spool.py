"""Send spooled files to the controller, signed, deleting each only after a 2xx; retry with backoff.

What the agent's two senders share (``push.Pusher``: fatal events, ``outcomes.OutcomeForwarder``: the
Epilog's job outcomes). Input: a sender's ``flush_once() -> bool`` (True when nothing is left to send),
which posts chunks of spooled files through ``SpoolSender.send_chunk``; the controller URL, the shared push
secret, a clock. Output: ``POST`` bodies signed with the push scheme (``protocol.signed_headers``); a
chunk's files are unlinked only after the controller answered 2xx, so a controller that is down, slow or
refusing loses nothing.

The sender thread flushes when woken (``wake``, ``start``), or every ``interval_s`` when one is given;
after a failed flush it waits ``backoff_initial_s`` doubling to ``backoff_max_s`` (only ``stop`` cuts the
wait short) and tries again; a successful flush resets the backoff.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node_agent.httpclient import HttpClient, urlopen
from node_agent.protocol import signed_headers


def post_signed(
    url: str,
    secret: bytes,
    node: str,
    body: bytes,
    now: float,
    timeout_s: float,
    client: HttpClient | None = None,
) -> None:
    """POST ``body`` signed with the push scheme (``protocol.signed_headers``), with ``client``'s basic
    auth and TLS when the listener asks for them (``node_agent/httpclient.py``); raises on any failure
    (``urllib.error.URLError``, ``OSError``, ``ValueError``), so the caller keeps its spool files."""
    headers = signed_headers(secret, node, int(now), body)
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urlopen(req, timeout_s, client) as resp:
        resp.read()


class SpoolSender:
    """A spool's sender: ``send_chunk`` and the retry thread. Subclasses define ``flush_once``."""

    def __init__(
        self,
        node: str,
        url: str | None,
        secret: bytes | None,
        clock: Callable[[], float],
        *,
        log: logging.Logger,
        thread_name: str,
        crash_log: str,
        timeout_s: float,
        backoff_initial_s: float,
        backoff_max_s: float,
        interval_s: float | None = None,
        client: HttpClient | None = None,
    ) -> None:
        self.node = node
        self.client = client
        self.url = url
        self.secret = secret
        self.clock = clock
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.interval_s = interval_s
        self._log = log
        self._thread_name = thread_name
        self._crash_log = crash_log
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.failures = 0

    def flush_once(self) -> bool:
        raise NotImplementedError

    def send_chunk(self, chunk: Sequence[tuple[Path, Any]], body: bytes, failed: str) -> bool:
        """Post ``body`` (the chunk's records); on 2xx unlink the chunk's files and count them delivered.
        On failure count it, log ``failed % (url, len(chunk), error)`` and keep the files: False."""
        assert self.url is not None and self.secret is not None
        try:
            post_signed(self.url, self.secret, self.node, body, self.clock(), self.timeout_s, self.client)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failures += 1
            self._log.warning(failed, self.url, len(chunk), exc)
            return False
        for path, _ in chunk:
            path.unlink(missing_ok=True)
        self.delivered += len(chunk)
        return True

    def wake(self) -> None:
        """Flush now (new files are spooled)."""
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()
        self._wake.set()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        delay = self.backoff_initial_s
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                ok = self.flush_once()
            except Exception:  # a bug must not kill the sender
                self._log.exception(self._crash_log)
                ok = False
            if ok:
                delay = self.backoff_initial_s
                continue
            # Retry after the backoff; only stop cuts it short.
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self.backoff_max_s)
            self._wake.set()
