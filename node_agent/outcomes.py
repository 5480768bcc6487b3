"""Forward the Epilog's job-outcome records to the controller, signed, deleting each only after a 2xx.

Input: ``<outcomes_dir>/*.json`` (written atomically by ``fleetyield-epilog``, which never does network
I/O), the controllers' outcome URLs (``.../v1/agent/outcomes``), the shared push secret, a clock. Output:
``POST`` of ``OutcomeBatch`` bodies (``protocol``); a record file is removed only after a controller
answered 2xx, which it does only once the records are durable in its store. So a controller that is down,
slow or refusing loses nothing: the files wait, and the next attempt (backoff ``backoff_initial_s``
doubling to ``backoff_max_s``) sends them again. The controller is idempotent per record, so a reply lost
after the commit only causes a duplicate it ignores.

Several URLs (two controllers in high availability, one PostgreSQL store): one 2xx is enough, so each
chunk goes to the URL that last answered and, when that fails, to the next; unlike fatal events (one spool
per controller, ``node_agent/push.py``), an outcome is a row in the shared store, not a wake-up.

A file that is not a JSON object with a ``job_id`` is renamed ``*.bad`` (kept for an operator, never sent);
a record naming another node is sent anyway with its ``node`` left out so the controller sees this node.
The directory is polled every ``interval_s`` (an Epilog cannot wake the agent without network I/O).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from node_agent.httpclient import HttpClient
from node_agent.protocol import MAX_OUTCOMES_PER_BATCH, OutcomeBatch
from node_agent.spool import SpoolSender

log = logging.getLogger(__name__)
DEFAULT_OUTCOMES_DIR = Path("/var/spool/fleetyield/outcomes")
MAX_RECORD_BYTES = 64 * 1024


def outcomes_url_from_push(push_url: str) -> str:
    """The outcome URL on the same listener as the event push URL (``.../v1/agent/events``)."""
    base = push_url.split("?", 1)[0]
    if base.endswith("/v1/agent/events"):
        return base[: -len("/v1/agent/events")] + "/v1/agent/outcomes"
    return base.rstrip("/") + "/v1/agent/outcomes"


def pending_records(directory: Path) -> list[tuple[Path, dict]]:
    """Readable records, oldest file first; unreadable ones are renamed ``.bad``."""
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out: list[tuple[float, Path, dict]] = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = directory / name
        try:
            if path.stat().st_size > MAX_RECORD_BYTES:
                raise ValueError(f"larger than {MAX_RECORD_BYTES} bytes")
            record = json.loads(path.read_bytes())
            if not isinstance(record, dict) or not str(record.get("job_id") or "").strip():
                raise ValueError("not an outcome record (no job_id)")
            out.append((path.stat().st_mtime, path, record))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            log.error("outcome record %s unusable (%s): renamed .bad", path, exc)
            with contextlib.suppress(OSError):
                path.rename(path.with_suffix(".bad"))
    out.sort(key=lambda t: (t[0], t[1].name))
    return [(p, r) for _, p, r in out]


class OutcomeForwarder(SpoolSender):
    """Posts the outcome records in ``directory``, polled every ``interval_s``."""

    def __init__(
        self,
        directory: Path,
        node: str,
        urls: Sequence[str],
        secret: bytes | None,
        clock: Callable[[], float] = time.time,
        *,
        interval_s: float = 5.0,
        timeout_s: float = 5.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        client: HttpClient | None = None,
    ) -> None:
        self.urls = list(urls)
        super().__init__(
            node,
            self.urls[0] if self.urls else None,
            secret,
            clock,
            log=log,
            thread_name="fleetyield-outcomes",
            crash_log="outcome forwarder error",
            timeout_s=timeout_s,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            client=client,
            interval_s=interval_s,
        )
        self.directory = Path(directory)

    def flush_once(self) -> bool:
        """Send everything waiting; True when nothing is left (or nothing can be sent: no URL)."""
        if not self.url or not self.secret:
            return True
        items = pending_records(self.directory)
        while items:
            chunk, items = items[:MAX_OUTCOMES_PER_BATCH], items[MAX_OUTCOMES_PER_BATCH:]
            records = [r if r.get("node") in (None, self.node) else {**r, "node": None} for _, r in chunk]
            body = OutcomeBatch(node=self.node, records=records).model_dump_json().encode()
            if not self._send_anywhere(chunk, body):
                return False
        return True

    def _send_anywhere(self, chunk: Sequence[tuple[Path, Any]], body: bytes) -> bool:
        """The chunk to ``self.url`` (the one that last answered), else to each other URL in turn; the
        one that takes it goes first next time."""
        for url in [self.url, *(u for u in self.urls if u != self.url)]:
            self.url = url
            if self.send_chunk(chunk, body, "outcome forward to %s failed (%d record(s) kept): %s"):
                return True
        self.url = self.urls[0]
        return False
