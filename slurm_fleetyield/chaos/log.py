"""The chaos log: one JSON object per line, enough to replay a run exactly.

Records: ``{"type": "header", "seed", "timeline", "arm", "version", "started"}`` first, then one
``{"type": "action", "ref", "kind", "planned_at_s", "t", "command", "rc", "out", "outcome"}`` per executed
command (``admin_seen`` / ``admin_approve`` records of the emulated admin, chaos/admin.py, in between), and
``{"type": "result", ...}`` at the end (the ledger totals). ``read`` returns the header's
``Timeline`` and the records; ``replay`` re-executes the header's timeline (not the recorded outputs: a replay
is a new run of the same plan, whose own log can be compared with the first).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from slurm_fleetyield.chaos.timeline import Timeline


class ChaosLog:
    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self._lock = threading.Lock()  # the emulated admin (chaos/admin.py) writes from its own thread

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"
        with self._lock:
            self.fh.write(line)
            self.fh.flush()

    def header(self, timeline: Timeline, arm: str, version: str, started: float) -> None:
        self.write(
            {"type": "header", "seed": timeline.seed, "timeline": timeline.to_dict(), "arm": arm,
             "version": version, "started": started}
        )  # fmt: skip


def records(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from None


def read(path: str | Path) -> tuple[Timeline, list[dict[str, Any]]]:
    recs = list(records(path))
    heads = [r for r in recs if r.get("type") == "header"]
    if not heads:
        raise ValueError(f"{path}: no header record: not a chaos log")
    return Timeline.from_dict(heads[0]["timeline"]), recs
