"""Spool and push agent events to the controller, signed (see ``protocol``), retried with backoff.

Input: ``AgentEvent``s (``enqueue``), the push URL, the shared secret, a clock. Output:
``POST push_url`` of ``AgentEventBatch`` bodies. Each event is first written to
``STATE_DIR/spool/<event_id>.json`` (idempotent by event id), then a sender thread is
woken at once and posts everything spooled; an event file is deleted only after a 2xx.
Failures back off exponentially (``backoff_initial_s`` doubling to ``backoff_max_s``);
nothing is dropped. Without a push URL events stay spooled for a later configured start.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from node_agent.protocol import AgentEvent, AgentEventBatch, signed_headers
from node_agent.state import write_atomic

log = logging.getLogger(__name__)
SPOOL_DIR = "spool"
MAX_BATCH = 200


def spool_event(state_dir: Path, event: AgentEvent) -> Path:
    path = state_dir / SPOOL_DIR / f"{event.event_id}.json"
    if not path.exists():
        write_atomic(path, event.model_dump_json().encode())
    return path


def spooled(state_dir: Path) -> list[tuple[Path, AgentEvent]]:
    directory = state_dir / SPOOL_DIR
    out: list[tuple[Path, AgentEvent]] = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = directory / name
        try:
            out.append((path, AgentEvent.model_validate_json(path.read_bytes())))
        except (OSError, ValueError) as exc:
            log.error("dropping unreadable spool file %s: %s", path, exc)
            path.rename(path.with_suffix(".bad"))
    out.sort(key=lambda pe: pe[1].time)
    return out



def post_signed(url: str, secret: bytes, node: str, body: bytes, now: float, timeout_s: float) -> None:
    """POST ``body`` signed with the push scheme (``protocol.signed_headers``); raises on any failure
    (``urllib.error.URLError``, ``OSError``, ``ValueError``), so the caller keeps its spool files."""
    headers = signed_headers(secret, node, int(now), body)
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()


class Pusher:
    def __init__(
        self,
        state_dir: Path,
        node: str,
        url: str | None,
        secret: bytes | None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 5.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 60.0,
    ) -> None:
        if url and not secret:
            raise ValueError("a push URL needs a secret (--push-secret-file)")
        self.state_dir = state_dir
        self.node = node
        self.url = url
        self.secret = secret
        self.clock = clock
        self.timeout_s = timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self.failures = 0

    def enqueue(self, events: list[AgentEvent]) -> None:
        for event in events:
            spool_event(self.state_dir, event)
        self._wake.set()

    def flush_once(self) -> bool:
        """Post everything spooled; True when the spool is empty afterwards."""
        if not self.url or not self.secret:
            return not spooled(self.state_dir)
        items = spooled(self.state_dir)
        while items:
            chunk, items = items[:MAX_BATCH], items[MAX_BATCH:]
            body = AgentEventBatch(node=self.node, events=[e for _, e in chunk]).model_dump_json().encode()
            try:
                post_signed(self.url, self.secret, self.node, body, self.clock(), self.timeout_s)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                self.failures += 1
                log.warning("push to %s failed (%d event(s) stay spooled): %s", self.url, len(chunk), exc)
                return False
            for path, _ in chunk:
                path.unlink(missing_ok=True)
            self.delivered += len(chunk)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetyield-push", daemon=True)
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
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                ok = self.flush_once()
            except Exception:  # a bug must not kill the sender
                log.exception("push sender error")
                ok = False
            if ok:
                delay = self.backoff_initial_s
                continue
            # Retry after the backoff unless new events (or stop) wake us sooner.
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self.backoff_max_s)
            self._wake.set()


def dumps_events(events: list[AgentEvent]) -> str:
    return json.dumps([e.model_dump(mode="json") for e in events])
