"""Spool and push agent events to the controller(s), signed (see ``protocol``), retried with backoff.

Input: ``AgentEvent``s (``enqueue``), one push URL or several (two controllers in high availability), the
shared secret, a clock. Output: ``POST url`` of ``AgentEventBatch`` bodies to every URL. Each event is
first written to its destination's spool (``STATE_DIR/spool/<event_id>.json`` for the first URL,
``STATE_DIR/spool-<hash of the URL>/`` for each further one; idempotent by event id), then each
destination's sender thread is woken at once and posts everything in its spool; an event file is deleted
only after that destination answered 2xx. So every destination has its own delivery cursor: a dead
controller holds back none of the others, and gets every event once it answers again (the controllers
share one inbox, which commits an event id once, so the second copy is a 202 duplicate). Failures back off
exponentially (``backoff_initial_s`` doubling to ``backoff_max_s``); nothing is dropped. Without a push URL
events stay spooled (``spool/``) for a later configured start, which hands them to every destination.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node_agent.httpclient import HttpClient
from node_agent.protocol import AgentEvent, AgentEventBatch
from node_agent.spool import SpoolSender
from node_agent.state import write_atomic

log = logging.getLogger(__name__)
SPOOL_DIR = "spool"
MAX_BATCH = 200


def spool_event(state_dir: Path, event: AgentEvent, spool_dir: str = SPOOL_DIR) -> Path:
    path = state_dir / spool_dir / f"{event.event_id}.json"
    if not path.exists():
        write_atomic(path, event.model_dump_json().encode())
    return path


def spooled(state_dir: Path, spool_dir: str = SPOOL_DIR) -> list[tuple[Path, AgentEvent]]:
    directory = state_dir / spool_dir
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


def spool_dir_name(url: str, index: int) -> str:
    """The spool directory of destination ``index``: ``spool`` for the first (as with one URL), keyed by the
    URL for the others (a reordered list keeps each destination's backlog)."""
    if index == 0:
        return SPOOL_DIR
    return f"{SPOOL_DIR}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"


class _Destination(SpoolSender):
    """One controller's sender: posts its own spool directory."""

    def __init__(self, state_dir: Path, spool_dir: str, node: str, url: str | None, **kw: Any) -> None:
        super().__init__(node, url, kw.pop("secret"), kw.pop("clock"), log=log, **kw)
        self.state_dir = state_dir
        self.spool_dir = spool_dir

    def flush_once(self) -> bool:
        items = spooled(self.state_dir, self.spool_dir)
        if not self.url or not self.secret:
            return not items
        while items:
            chunk, items = items[:MAX_BATCH], items[MAX_BATCH:]
            body = AgentEventBatch(node=self.node, events=[e for _, e in chunk]).model_dump_json().encode()
            if not self.send_chunk(chunk, body, "push to %s failed (%d event(s) stay spooled): %s"):
                return False
        return True


class Pusher:
    """Posts every event to each URL (one sender thread and spool per URL); woken at once by ``enqueue``."""

    def __init__(
        self,
        state_dir: Path,
        node: str,
        url: str | Sequence[str] | None,
        secret: bytes | None,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 5.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 60.0,
        client: HttpClient | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url or [])
        if urls and not secret:
            raise ValueError("a push URL needs a secret (--push-secret-file)")
        self.state_dir = state_dir
        self.node = node
        self.urls = urls
        self.secret = secret
        self.destinations = [
            _Destination(
                state_dir,
                spool_dir_name(u, i),
                node,
                u,
                secret=secret,
                clock=clock,
                thread_name=f"fleetyield-push-{i}",
                crash_log="push sender error",
                timeout_s=timeout_s,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                client=client,
            )
            for i, u in enumerate(urls or [None])
        ]

    @property
    def url(self) -> str | None:
        return self.urls[0] if self.urls else None

    @property
    def delivered(self) -> int:
        return sum(d.delivered for d in self.destinations)

    @property
    def failures(self) -> int:
        return sum(d.failures for d in self.destinations)

    def enqueue(self, events: list[AgentEvent]) -> None:
        for event in events:
            for d in self.destinations:
                spool_event(self.state_dir, event, d.spool_dir)
        self.wake()

    def fan_out(self) -> None:
        """Give the further destinations a copy of what waits in ``spool/`` (spooled offline, or before a
        second URL was configured): each destination then delivers it on its own."""
        if len(self.destinations) < 2:
            return
        for _, event in spooled(self.state_dir):
            for d in self.destinations[1:]:
                spool_event(self.state_dir, event, d.spool_dir)

    def flush_once(self) -> bool:
        """Post everything spooled to every destination; True when every spool is empty afterwards."""
        results = [d.flush_once() for d in self.destinations]
        return all(results)

    def wake(self) -> None:
        for d in self.destinations:
            d.wake()

    def start(self) -> None:
        self.fan_out()
        for d in self.destinations:
            d.start()

    def stop(self, timeout: float = 2.0) -> None:
        for d in self.destinations:
            d.stop(timeout)


def dumps_events(events: list[AgentEvent]) -> str:
    return json.dumps([e.model_dump(mode="json") for e in events])
