"""Durable controller memory in one SQLite file (WAL mode).

Input: the daemon's tick outcome (state, processed event ids, log rows, the rendered result) and fatal
events from the push listener. Output: the last committed state on restart, pending inbox events, and the
read models the CLI and API serve (``last_result``, ``events``).

Tables: ``state`` (one row: ControllerState JSON + tick number), ``last_result`` (one row: node decisions,
risks and explanations as JSON), ``events`` (append-only log, pruned to ``events_keep`` rows), ``inbox``
(fatal events: id PK, payload, received_at, processed_at).

Crash safety. ``commit_tick`` writes state + processed marks + log rows in ONE transaction, so a kill -9 at
any point leaves either the previous tick or this one, never a mix. A crash between applying a plan to
Slurm and committing is harmless: the next tick recomputes the plan as a diff against Slurm as observed,
so actions already applied produce no action again, and unprocessed inbox events are simply taken again
(the core also remembers processed event ids).

``synchronous=FULL`` rather than NORMAL: in WAL mode NORMAL already survives kill -9 of this process (the
WAL is in the OS page cache when COMMIT returns) and loses only the last commits on power loss or a kernel
crash. But the push listener acknowledges an agent's event only after it is in the inbox: that 202 is a
promise, and under NORMAL a power cut right after it could drop a fatal event the agent will never resend.
FULL fsyncs the WAL at every commit; at one commit per tick plus rare pushes the cost is negligible.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from slurm_fleetyield.core.model import FatalEvent

SCHEMA_VERSION = 1
INBOX_KEEP_S = 7 * 86400.0
"""Processed inbox rows are kept this long so a late retry of the same event_id is still a duplicate."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    tick INTEGER NOT NULL,
    time REAL NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS last_result (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    tick INTEGER NOT NULL,
    time REAL NOT NULL,
    result TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    tick INTEGER,
    node TEXT NOT NULL DEFAULT '',
    kind TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_node ON events (node, seq);
CREATE TABLE IF NOT EXISTS inbox (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    payload TEXT NOT NULL,
    received_at REAL NOT NULL,
    processed_at REAL
);
CREATE INDEX IF NOT EXISTS inbox_by_state ON inbox (processed_at, received_at);
"""


class StoreError(RuntimeError):
    """The database cannot be opened or has an unknown schema."""


@dataclass(frozen=True, slots=True)
class LogRow:
    """One row of the append-only event log."""

    time: float
    kind: str
    node: str = ""
    message: str = ""
    data: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredState:
    tick: int
    time: float
    state: dict[str, Any]


def event_to_json(event: FatalEvent) -> str:
    return json.dumps(asdict(event), sort_keys=True)


def event_from_json(text: str) -> FatalEvent:
    return FatalEvent(**json.loads(text))


class Store:
    """SQLite store; safe to share between threads (one connection per thread, WAL for concurrent reads)."""

    def __init__(
        self,
        path: str | Path,
        *,
        events_keep: int = 100_000,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = str(path)
        self._events_keep = events_keep
        self._readonly = readonly
        self._clock = clock
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        if readonly:
            if not Path(self.path).exists():
                raise StoreError(f"{self.path}: no such database (has the daemon run yet?)")
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = self._conn()
        if not readonly:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise StoreError(f"{self.path}: schema version {version}, this build knows {SCHEMA_VERSION}")
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- connections ----------------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                if self._readonly:
                    conn = sqlite3.connect(
                        f"file:{self.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
                    )
                else:
                    conn = sqlite3.connect(
                        self.path, isolation_level=None, timeout=30.0, check_same_thread=False
                    )
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA busy_timeout=30000")
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from None
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._all.clear()
        self._local = threading.local()

    # -- inbox (EventInbox) ---------------------------------------------------------------------------

    def put_events(self, events: Sequence[FatalEvent], received_at: float | None = None) -> tuple[int, int]:
        """Insert events durably (idempotent by event_id). Returns (new, duplicates)."""
        received_at = self._clock() if received_at is None else received_at
        new = 0
        with self._write() as conn:
            for event in events:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO inbox (id, node, payload, received_at) VALUES (?, ?, ?, ?)",
                    (event.event_id, event.node, event_to_json(event), received_at),
                )
                new += cur.rowcount
        return new, len(events) - new

    def pending(self) -> list[FatalEvent]:
        rows = (
            self._conn()
            .execute("SELECT payload FROM inbox WHERE processed_at IS NULL ORDER BY received_at, id")
            .fetchall()
        )
        return [event_from_json(r[0]) for r in rows]

    def acknowledge(self, event_ids: Sequence[str]) -> None:
        with self._write() as conn:
            self._mark_processed(conn, event_ids, self._clock())

    @staticmethod
    def _mark_processed(conn: sqlite3.Connection, event_ids: Sequence[str], now: float) -> None:
        conn.executemany(
            "UPDATE inbox SET processed_at = ? WHERE id = ? AND processed_at IS NULL",
            [(now, eid) for eid in event_ids],
        )

    # -- the tick -------------------------------------------------------------------------------------

    def load_state(self) -> StoredState | None:
        row = self._conn().execute("SELECT tick, time, state FROM state WHERE id = 1").fetchone()
        return None if row is None else StoredState(row[0], row[1], json.loads(row[2]))

    def commit_tick(
        self,
        tick: int,
        now: float,
        state: Mapping[str, Any],
        processed_event_ids: Sequence[str] = (),
        log_rows: Sequence[LogRow] = (),
        last_result: Mapping[str, Any] | None = None,
    ) -> None:
        """State + processed marks + log rows (+ the rendered result) in one transaction."""
        state_json = json.dumps(state, separators=(",", ":"), allow_nan=False)
        result_json = (
            None if last_result is None else json.dumps(last_result, separators=(",", ":"), allow_nan=False)
        )
        with self._write() as conn:
            conn.execute(
                "INSERT INTO state (id, tick, time, state) VALUES (1, ?, ?, ?) ON CONFLICT (id) "
                "DO UPDATE SET tick = excluded.tick, time = excluded.time, state = excluded.state",
                (tick, now, state_json),
            )
            self._mark_processed(conn, processed_event_ids, now)
            self._append(conn, log_rows, tick)
            if result_json is not None:
                conn.execute(
                    "INSERT INTO last_result (id, tick, time, result) VALUES (1, ?, ?, ?) ON CONFLICT (id) "
                    "DO UPDATE SET tick = excluded.tick, time = excluded.time, result = excluded.result",
                    (tick, now, result_json),
                )
            conn.execute(
                "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (self._events_keep,)
            )
            conn.execute(
                "DELETE FROM inbox WHERE processed_at IS NOT NULL AND processed_at < ?", (now - INBOX_KEEP_S,)
            )

    @staticmethod
    def _append(conn: sqlite3.Connection, rows: Sequence[LogRow], tick: int | None) -> None:
        conn.executemany(
            "INSERT INTO events (time, tick, node, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (r.time, tick, r.node, r.kind, r.message, json.dumps(dict(r.data or {}), default=str))
                for r in rows
            ],
        )

    def append_log(self, rows: Sequence[LogRow]) -> None:
        """Log rows outside a tick (e.g. the push listener's rejections)."""
        with self._write() as conn:
            self._append(conn, rows, None)

    # -- read models ----------------------------------------------------------------------------------

    def last_result_tick(self) -> int | None:
        row = self._conn().execute("SELECT tick FROM last_result WHERE id = 1").fetchone()
        return None if row is None else row[0]

    def last_result(self) -> dict[str, Any] | None:
        row = self._conn().execute("SELECT result FROM last_result WHERE id = 1").fetchone()
        return None if row is None else json.loads(row[0])

    def events(self, limit: int = 100, node: str | None = None) -> list[dict[str, Any]]:
        """Newest first."""
        sql = "SELECT seq, time, tick, node, kind, message, data FROM events"
        args: tuple[Any, ...] = ()
        if node:
            sql += " WHERE node = ?"
            args = (node,)
        rows = self._conn().execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [
            {
                "seq": r[0],
                "time": r[1],
                "tick": r[2],
                "node": r[3],
                "kind": r[4],
                "message": r[5],
                "data": json.loads(r[6]),
            }
            for r in rows
        ]

    def inbox_counts(self) -> dict[str, int]:
        pending, processed = (
            self._conn()
            .execute(
                "SELECT COUNT(*) FILTER (WHERE processed_at IS NULL), "
                "COUNT(*) FILTER (WHERE processed_at IS NOT NULL) FROM inbox"
            )
            .fetchone()
        )
        return {"pending": pending, "processed": processed}
