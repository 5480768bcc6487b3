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
import time
from collections.abc import Callable
from pathlib import Path

from node_agent.httpclient import HttpClient
from node_agent.protocol import AgentEvent, AgentEventBatch
from node_agent.spool import SpoolSender
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


class Pusher(SpoolSender):
    """Posts ``STATE_DIR/spool``; woken at once by ``enqueue`` (no polling)."""

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
        client: HttpClient | None = None,
    ) -> None:
        if url and not secret:
            raise ValueError("a push URL needs a secret (--push-secret-file)")
        super().__init__(
            node,
            url,
            secret,
            clock,
            log=log,
            thread_name="fleetyield-push",
            crash_log="push sender error",
            timeout_s=timeout_s,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            client=client,
        )
        self.state_dir = state_dir

    def enqueue(self, events: list[AgentEvent]) -> None:
        for event in events:
            spool_event(self.state_dir, event)
        self.wake()

    def flush_once(self) -> bool:
        """Post everything spooled; True when the spool is empty afterwards."""
        if not self.url or not self.secret:
            return not spooled(self.state_dir)
        items = spooled(self.state_dir)
        while items:
            chunk, items = items[:MAX_BATCH], items[MAX_BATCH:]
            body = AgentEventBatch(node=self.node, events=[e for _, e in chunk]).model_dump_json().encode()
            if not self.send_chunk(chunk, body, "push to %s failed (%d event(s) stay spooled): %s"):
                return False
        return True


def dumps_events(events: list[AgentEvent]) -> str:
    return json.dumps([e.model_dump(mode="json") for e in events])
