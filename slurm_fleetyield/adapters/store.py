"""Durable controller memory in one SQLite file (WAL mode).

Input: the daemon's tick outcome (state, processed event ids, log rows, the rendered result) and fatal
events from the push listener. Output: the last committed state on restart, pending inbox events, and the
read models the CLI and API serve (``last_view``, ``node_explanation``, ``events``).

Tables: the controller state since schema 4 as ``state_head`` (one row: tick, time, commit generation,
node count), ``state_parts`` (fleet-level parts: name -> JSON) and ``state_nodes`` (one document per node,
upserted only when the node changed; ``core.state_rows``), before schema 4 ``state`` (one row: the whole
ControllerState as one JSON blob, 40-90 MB at 10k nodes, rewritten every tick; migrated to rows),
``view_header`` + ``view_nodes`` (since
schema 3, the read model: the tick's header, and per node its row, floor and explanation, upserted only
for nodes whose entry changed; ``views.ViewRenderer``), ``last_result`` (before schema 3 the whole read
model as one JSON blob; still read when no ``view_header`` exists, written only by tools), ``events``
(append-only log, pruned to ``events_keep`` rows), ``inbox`` (fatal events: id PK, payload, received_at,
processed_at). Since schema 2 also: ``outcomes`` (the Epilog's
job-outcome records as agents forwarded them: key PK, processed_at), ``attempts`` (job attempts delivered
to the core, so a late record of another node of the same attempt is not delivered twice), ``ledger``
(one row per settled job attempt, append-only), ``gate_marks`` (what the shell did with a gate decision:
``executed`` = Slurm shows the approved drain, ``delivered`` = a denial was handed to the core), and
``canary_rounds`` / ``canary_seen`` (canary job names submitted, results handed to the core), and
``agent_seen`` (ids of the agents' non-fatal events already logged, kept ``INBOX_KEEP_S``: a replayed or
retried push adds no row to the log; the fatal ones are deduplicated by the inbox itself), and ``intents``
(each non-idempotent action - GPU reset, reboot, power cycle - by its ``intent``, committed BEFORE it is
acted on, and its result after: ``executor.py`` never acts twice on one intent, and after a crash between
the two checks what the world shows was done; kept ``INBOX_KEEP_S``).

Exactly once. Everything the core is handed from these tables (outcomes, denials, canary results) is marked
in ``commit_tick``'s transaction together with the state that consumed it: a kill -9 before the commit
hands it again to a core restarted from the previous state; after it, never again.

Crash safety. ``commit_tick`` writes state + processed marks + log rows + the view in ONE transaction, so a
kill -9 at any point leaves either the previous tick or this one, never a mix. A crash between applying a
plan to Slurm and committing is harmless: the next tick recomputes the plan as a diff against Slurm as
observed, so actions already applied produce no action again, and unprocessed inbox events are simply
taken again (the core also remembers processed event ids).

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
from typing import Any, Protocol

from slurm_fleetyield.adapters import store_pg
from slurm_fleetyield.adapters.sqlite_check import quick_check
from slurm_fleetyield.core.explain import explain_text
from slurm_fleetyield.core.model import FatalEvent
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.core.state_rows import StateEncoder, StateRows, decode

SCHEMA_VERSION = 5
# 1 -> 2 only adds tables (CREATE IF NOT EXISTS); 2 -> 3: _MIGRATIONS[3]; 3 -> 4: _MIGRATIONS[4] and
# ``_state_to_rows`` (the state blob becomes rows); 4 -> 5: _MIGRATIONS[5] (the leader lease)
KNOWN_SCHEMAS = (0, 1, 2, 3, 4, 5)
ATTEMPT_SLOP_S = 300.0
"""Records of one job whose start times differ by less than this are one attempt (each node's Prolog has
its own clock; a requeued attempt starts after the previous one ended, minutes later at least)."""
INBOX_KEEP_S = 7 * 86400.0
_INTENT_COLUMNS = "key, node, kind, created, done_at, ok, detail"
"""Processed inbox rows are kept this long so a late retry of the same event_id is still a duplicate."""

_SCHEMA = """
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
CREATE TABLE IF NOT EXISTS outcomes (
    key TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    node TEXT NOT NULL,
    record TEXT NOT NULL,
    received_at REAL NOT NULL,
    processed_at REAL
);
CREATE INDEX IF NOT EXISTS outcomes_by_state ON outcomes (processed_at, received_at);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL,
    start REAL NOT NULL,
    delivered_at REAL NOT NULL,
    PRIMARY KEY (job_id, start)
);
CREATE TABLE IF NOT EXISTS ledger (
    job_id INTEGER NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    workload TEXT,
    nodes TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    state TEXT NOT NULL,
    useful_gpu_s REAL NOT NULL,
    wasted_gpu_s REAL NOT NULL,
    premium_misuse_gpu_s REAL NOT NULL,
    failure INTEGER NOT NULL,
    tier_at_start TEXT NOT NULL,
    cause TEXT NOT NULL,
    tick INTEGER,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (job_id, start)
);
CREATE INDEX IF NOT EXISTS ledger_by_end ON ledger ("end");
CREATE TABLE IF NOT EXISTS gate_marks (
    proposal_id TEXT NOT NULL,
    mark TEXT NOT NULL,
    node TEXT NOT NULL DEFAULT '',
    time REAL NOT NULL,
    tick INTEGER,
    PRIMARY KEY (proposal_id, mark)
);
CREATE TABLE IF NOT EXISTS canary_rounds (
    token TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    jobs INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS canary_seen (
    job_id TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    node TEXT NOT NULL,
    state TEXT NOT NULL,
    seen_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_seen (
    id TEXT PRIMARY KEY,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS intents (
    key TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    kind TEXT NOT NULL,
    created REAL NOT NULL,
    done_at REAL,
    ok INTEGER,
    detail TEXT NOT NULL DEFAULT ''
);
"""

_MIGRATIONS: dict[int, str] = {
    # 3: the view per node (``view_nodes``: one small row per node, upserted only when it changed) and its
    # header (``view_header``), instead of one ``last_result`` JSON blob rewritten whole every tick. An
    # older database keeps its ``last_result`` row: readers fall back to it until the first new commit.
    3: """
CREATE TABLE IF NOT EXISTS view_header (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    tick INTEGER NOT NULL,
    time REAL NOT NULL,
    header TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS view_nodes (
    node TEXT PRIMARY KEY,
    tick INTEGER NOT NULL,
    row TEXT NOT NULL,
    floor TEXT NOT NULL,
    explain TEXT
);
""",
    # 4: the controller state per node (``state_nodes``, upserted only when the node changed) plus its fleet
    # parts and a header, instead of one ``state`` JSON blob rewritten whole every tick. ``_state_to_rows``
    # converts an existing blob in the same transaction and drops the ``state`` table.
    4: """
CREATE TABLE IF NOT EXISTS state_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    tick INTEGER NOT NULL,
    time REAL NOT NULL,
    gen INTEGER NOT NULL,
    nodes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS state_parts (
    part TEXT PRIMARY KEY,
    tick INTEGER NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state_nodes (
    node TEXT PRIMARY KEY,
    tick INTEGER NOT NULL,
    doc TEXT NOT NULL
);
""",
    # 5: the leader lease (``lease.py``): one row, the holder, its fencing token, its expiry. Used with
    # PostgreSQL (two controllers); an SQLite store has one controller and leaves it empty.
    5: """
CREATE TABLE IF NOT EXISTS leader_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    token INTEGER NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
""",
}
"""Schema version -> the SQL that brings a database of the version before it up to it (run in order, each
in the transaction that sets ``user_version``)."""
MIGRATIONS: tuple[tuple[int, str], ...] = ((2, _SCHEMA), *sorted(_MIGRATIONS.items()))
"""The versioned list both backends apply at start: SQLite from ``user_version`` (its own path, which also
converts a pre-4 state blob), PostgreSQL from the ``schema_version`` row (``store_pg.migrate``)."""

LEDGER_COLUMNS = (
    "job_id",
    "start",
    "end",
    "workload",
    "nodes",
    "gpus",
    "state",
    "useful_gpu_s",
    "wasted_gpu_s",
    "premium_misuse_gpu_s",
    "failure",
    "tier_at_start",
    "cause",
)
_LEDGER_SQL = ", ".join(f'"{c}"' if c == "end" else c for c in LEDGER_COLUMNS)


class StoreError(RuntimeError):
    """The database cannot be opened, has an unknown schema or damaged contents; ``str()`` names the file
    (or the PostgreSQL URL, password redacted)."""


def _db_errors() -> tuple[type[BaseException], ...]:
    """sqlite3's errors, and psycopg's when it is installed (a PostgreSQL store)."""
    try:
        import psycopg
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, psycopg.Error)


@dataclass(frozen=True, slots=True)
class LogRow:
    """One row of the append-only event log."""

    time: float
    kind: str
    node: str = ""
    message: str = ""
    data: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredOutcome:
    """One forwarded Epilog record (the raw dict) with its store key."""

    key: str
    job_id: str
    node: str
    record: dict[str, Any]
    received_at: float


@dataclass(frozen=True, slots=True)
class TickMarks:
    """What a tick consumed or produced besides its state, committed in the same transaction."""

    outcome_keys: Sequence[str] = ()  # forwarded records handed to the core (or merged into an attempt)
    attempts: Sequence[tuple[str, float]] = ()  # (job_id, start) attempts delivered as JobOutcome
    ledger: Sequence[Mapping[str, Any]] = ()  # LedgerEntry rows (LEDGER_COLUMNS)
    gate_marks: Sequence[tuple[str, str, str]] = ()  # (proposal_id, mark, node)
    canary_seen: Sequence[tuple[str, str, str, str]] = ()  # (job_id, token, node, state)


def outcome_key(node: str, record: Mapping[str, Any]) -> str:
    """Idempotency key of a forwarded record: the same file sent twice is one row; the record of a requeued
    attempt (another start) or of another node of the job is another row."""
    start = record.get("start_time")
    end = record.get("slurm_end_time") or record.get("end_time") or record.get("epilog_time")
    return f"{record.get('job_id')}|{node}|{start!r}|{end!r}"


class RenderedView(Protocol):
    """One tick's view as ``views.ViewRenderer`` renders it (duck-typed: adapters do not import each other):
    the header (the view without its nodes), and the nodes whose entry changed as (node, row JSON, floor
    JSON, explanation JSON or None: not explained yet); ``deletes`` are nodes gone; ``replace`` drops every
    stored node first."""

    tick: int
    header: Mapping[str, Any]
    nodes: Sequence[tuple[str, str, str, str | None]]
    deletes: Sequence[str]
    replace: bool


@dataclass(frozen=True, slots=True)
class StoredState:
    tick: int
    time: float
    state: ControllerState


def _ledger_value(column: str, value: Any) -> Any:
    if column == "nodes":
        return json.dumps(list(value))
    if column == "failure":
        return int(bool(value))
    if column == "workload":
        return None if value is None else str(value)
    return value


def event_to_json(event: FatalEvent) -> str:
    return json.dumps(asdict(event), sort_keys=True)


def event_from_json(text: str) -> FatalEvent:
    return FatalEvent(**json.loads(text))


@dataclass(frozen=True, slots=True)
class Intent:
    """A non-idempotent action recorded before it was acted on; ``done_at`` None: its outcome is unknown."""

    key: str
    node: str
    kind: str
    created: float
    done_at: float | None = None
    ok: bool | None = None
    detail: str = ""


class Store:
    """SQLite (a file path) or PostgreSQL (a ``postgresql://`` URL) store; safe to share between threads
    (one connection per thread; WAL on SQLite for concurrent reads)."""

    def __init__(
        self,
        path: str | Path,
        *,
        events_keep: int = 100_000,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pg = store_pg.is_url(str(path))
        self._url = str(path)
        self.path = store_pg.redact(str(path)) if self._pg else str(path)
        self._events_keep = events_keep
        self._readonly = readonly
        self._clock = clock
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        # what this Store last wrote to (or read from) the state tables: the encoder's base and the commit
        # generation it belongs to; any other generation found at commit time means a full rewrite
        self._encoder = StateEncoder()
        self._state_gen: int | None = None
        self._state_lock = threading.Lock()
        if self._pg:
            self._open_pg(readonly)
            return
        if readonly:
            if not Path(self.path).exists():
                raise StoreError(f"{self.path}: no such database (has the daemon run yet?)")
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            if Path(self.path).stat().st_size == 0 and not Path(f"{self.path}-wal").exists():
                # SQLite would take an empty file for a new database: a truncated store would start the
                # controller from nothing (every drain, proposal and attempt forgotten) without a word
                raise StoreError(
                    f"{self.path}: the store is an empty file (0 bytes), not a database; refusing to start "
                    "over an existing store. Restore it from backup, or move it away to start fresh"
                )
        try:
            self._open(readonly)
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StoreError(
                f"{self.path}: not a usable store database ({exc}); restore it from backup, or move it away "
                "to start fresh (nothing was written to it)"
            ) from None

    def _open_pg(self, readonly: bool) -> None:
        try:
            conn = self._conn()
            if readonly:
                if store_pg.schema_version(conn) is None:
                    raise StoreError(
                        f"{self.path}: no store schema in this database (has the daemon run yet?)"
                    )
            else:
                store_pg.migrate(conn, MIGRATIONS, SCHEMA_VERSION)
        except StoreError:
            self.close()
            raise
        except ValueError as exc:
            self.close()
            raise StoreError(f"{self.path}: {exc}") from None
        except _db_errors() as exc:
            self.close()
            raise StoreError(f"{self.path}: cannot open the PostgreSQL store: {exc}") from None

    def _open(self, readonly: bool) -> None:
        """Connect; the writer also checks every page (``quick_check``) and brings the schema up to date."""
        conn = self._conn()
        if not readonly:
            quick_check(conn)
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in KNOWN_SCHEMAS:
                raise StoreError(f"{self.path}: schema version {version}, this build knows {SCHEMA_VERSION}")
            conn.executescript(_SCHEMA)
            for target in sorted(_MIGRATIONS):
                if version < target:
                    # each migration's DDL, data conversion and version bump share one transaction
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        for statement in _MIGRATIONS[target].split(";"):
                            if statement.strip():
                                conn.execute(statement)
                        if target == 4:
                            self._state_to_rows(conn)
                        conn.execute(f"PRAGMA user_version = {target}")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- connections ----------------------------------------------------------------------------------

    def _conn(self) -> Any:
        """This thread's connection: ``sqlite3.Connection``, or ``store_pg.PgConnection`` taking the same
        SQL."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._pg and conn.raw.closed:  # the server went away: connect again
            with self._lock:
                self._all = [c for c in self._all if c is not conn]
            conn = None
        if conn is None and self._pg:
            try:
                conn = store_pg.connect(self._url, self._readonly)
            except _db_errors() as exc:
                raise StoreError(f"{self.path}: {exc}") from None
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
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
    def _write(self) -> Iterator[Any]:
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
                with contextlib.suppress(*_db_errors()):
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

    def log_agent_events(self, rows: Sequence[tuple[str, LogRow]], received_at: float) -> tuple[int, int]:
        """Append the log row of each agent event ``(event_id, row)`` not logged before (idempotent by
        event_id, like ``put_events``: a replayed or retried push writes nothing). Returns (new, duplicates).
        """
        new = 0
        with self._write() as conn:
            fresh = []
            for event_id, row in rows:
                cur = conn.execute(
                    "INSERT OR IGNORE INTO agent_seen (id, received_at) VALUES (?, ?)",
                    (event_id, received_at),
                )
                if cur.rowcount:
                    fresh.append(row)
            self._append(conn, fresh, None)
            new = len(fresh)
        return new, len(rows) - new

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
    def _mark_processed(conn: Any, event_ids: Sequence[str], now: float) -> None:
        conn.executemany(
            "UPDATE inbox SET processed_at = ? WHERE id = ? AND processed_at IS NULL",
            [(now, eid) for eid in event_ids],
        )

    # -- the tick -------------------------------------------------------------------------------------

    def load_state(self) -> StoredState | None:
        """The last committed state; None before the first commit. Raises ``StoreError`` naming the file
        when the stored state cannot be read (unsupported version, missing part, edited or damaged rows)."""
        try:
            return self._load_state()
        except Exception as exc:
            if self._pg and isinstance(exc, store_pg.connection_errors()):  # the server, not the data
                raise StoreError(f"{self.path}: the database is unreachable ({exc})") from None
            if not isinstance(exc, (*_db_errors(), ValueError, KeyError, TypeError)):
                raise
            raise StoreError(
                f"{self.path}: the stored controller state cannot be read ({type(exc).__name__}: {exc}); "
                "restore the store from backup (a fresh start would forget every drain and proposal)"
            ) from None

    def _load_state(self) -> StoredState | None:
        conn = self._conn()
        with self._state_lock, self._snapshot(conn):
            try:
                head = conn.execute("SELECT tick, time, gen, nodes FROM state_head WHERE id = 1").fetchone()
            except sqlite3.OperationalError as exc:  # read-only open of a database before schema 4
                if "no such table" not in str(exc):
                    raise
                row = conn.execute("SELECT tick, time, state FROM state WHERE id = 1").fetchone()
                return (
                    None
                    if row is None
                    else StoredState(row[0], row[1], ControllerState.from_dict(json.loads(row[2])))
                )
            if head is None:
                return None
            tick, saved_at, gen, count = head
            parts = dict(conn.execute("SELECT part, doc FROM state_parts").fetchall())
            nodes = conn.execute("SELECT node, doc FROM state_nodes").fetchall()
        if len(nodes) != count:
            raise ValueError(f"{self.path}: stored state has {len(nodes)} node rows, its header says {count}")
        state = decode(parts, nodes)
        if not self._readonly:
            with self._state_lock:
                self._encoder.seed(state)
                self._state_gen = gen
        return StoredState(tick, saved_at, state)

    @staticmethod
    def _write_state(conn: Any, rows: StateRows, tick: int, now: float, gen: int) -> None:
        if rows.full:
            conn.execute("DELETE FROM state_nodes")
            conn.execute("DELETE FROM state_parts")
        conn.executemany(
            "INSERT INTO state_parts (part, tick, doc) VALUES (?, ?, ?) ON CONFLICT (part) "
            "DO UPDATE SET tick = excluded.tick, doc = excluded.doc",
            [(p, tick, doc) for p, doc in rows.parts],
        )
        conn.executemany("DELETE FROM state_nodes WHERE node = ?", [(n,) for n in rows.deletes])
        conn.executemany(
            "INSERT INTO state_nodes (node, tick, doc) VALUES (?, ?, ?) ON CONFLICT (node) "
            "DO UPDATE SET tick = excluded.tick, doc = excluded.doc",
            [(n, tick, doc) for n, doc in rows.nodes],
        )
        conn.execute(
            "INSERT INTO state_head (id, tick, time, gen, nodes) VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET tick = excluded.tick, time = excluded.time, gen = excluded.gen, "
            "nodes = excluded.nodes",
            (tick, now, gen, rows.node_count),
        )

    def _state_to_rows(self, conn: Any) -> None:
        """Migration 4, inside its transaction: the ``state`` blob (if any) becomes rows, ``state`` goes."""
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'state'"
        ).fetchone()
        if exists is None:
            return
        row = conn.execute("SELECT tick, time, state FROM state WHERE id = 1").fetchone()
        if row is not None:
            try:
                state = ControllerState.from_dict(json.loads(row[2]))
                rows = StateEncoder().encode(state, full=True)
            except ValueError as exc:  # JSONDecodeError is one
                raise StoreError(
                    f"{self.path}: cannot migrate the stored controller state to schema 4: {exc}"
                ) from None
            self._write_state(conn, rows, row[0], row[1], 1)
        conn.execute("DROP TABLE state")

    def commit_tick(
        self,
        tick: int,
        now: float,
        state: ControllerState,
        processed_event_ids: Sequence[str] = (),
        log_rows: Sequence[LogRow] = (),
        last_result: Mapping[str, Any] | None = None,
        marks: TickMarks | None = None,
        view: RenderedView | None = None,
        lease: tuple[str, int] | None = None,
    ) -> None:
        """State + processed marks + log rows (+ the rendered view, + ``marks``) in one transaction.

        ``state``: only its fleet parts and nodes that changed since this Store's last commit (or load) are
        written (``core.state_rows``); everything when another writer committed since, or a commit failed.

        ``view`` (what the daemon writes): the header and only the changed nodes, by ``executemany``.
        ``last_result`` (a whole view dict as ``views.render_result`` builds it, or any JSON-able dict):
        written as one blob in ``last_result`` as before schema 3, for tools and tests.

        ``lease`` (holder, fencing token; two controllers): the commit is refused (``StoreError``, nothing
        written) unless the lease row still shows this holder and token, checked under the row's lock in
        the same transaction: a deposed leader's tick never overwrites the new leader's state.
        """
        result_json = (
            None if last_result is None else json.dumps(last_result, separators=(",", ":"), allow_nan=False)
        )
        with self._state_lock:
            try:
                rows = self._encoder.encode(state, full=self._state_gen is None)
                with self._write() as conn:
                    if lease is not None:
                        self._check_lease(conn, *lease)
                    found = conn.execute("SELECT gen FROM state_head WHERE id = 1").fetchone()
                    gen = found[0] if found else 0
                    if not rows.full and gen != self._state_gen:  # someone else wrote the state meanwhile
                        rows = self._encoder.encode(state, full=True)
                    self._write_state(conn, rows, tick, now, gen + 1)
                    self._commit_rest(
                        conn, tick, now, processed_event_ids, log_rows, result_json, marks, view
                    )
            except BaseException:
                self._encoder.forget()  # unknown what the store holds: the next commit writes everything
                self._state_gen = None
                raise
            self._encoder.accept(rows)
            self._state_gen = gen + 1

    def _check_lease(self, conn: Any, holder: str, token: int) -> None:
        lock = " FOR UPDATE" if self._pg else ""
        row = conn.execute(
            f"SELECT 1 FROM leader_lease WHERE id = 1 AND holder = ? AND token = ?{lock}", (holder, token)
        ).fetchone()
        if row is None:
            raise StoreError(
                f"{self.path}: fenced: token {token} of {holder} is stale; the tick is not committed"
            )

    def _commit_rest(
        self,
        conn: Any,
        tick: int,
        now: float,
        processed_event_ids: Sequence[str],
        log_rows: Sequence[LogRow],
        result_json: str | None,
        marks: TickMarks | None,
        view: RenderedView | None,
    ) -> None:
        """What ``commit_tick`` writes besides the state, inside its transaction."""
        self._mark_processed(conn, processed_event_ids, now)
        if marks is not None:
            self._apply_marks(conn, marks, tick, now)
        self._append(conn, log_rows, tick)
        if result_json is not None:
            conn.execute(
                "INSERT INTO last_result (id, tick, time, result) VALUES (1, ?, ?, ?) ON CONFLICT (id) "
                "DO UPDATE SET tick = excluded.tick, time = excluded.time, result = excluded.result",
                (tick, now, result_json),
            )
            conn.execute("DELETE FROM view_header")  # the newest view wins, whichever its form
        if view is not None:
            self._write_view(conn, view, tick, now)
        conn.execute(
            "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (self._events_keep,)
        )
        conn.execute(
            "DELETE FROM inbox WHERE processed_at IS NOT NULL AND processed_at < ?", (now - INBOX_KEEP_S,)
        )
        conn.execute("DELETE FROM agent_seen WHERE received_at < ?", (now - INBOX_KEEP_S,))

    @staticmethod
    def _write_view(conn: Any, view: RenderedView, tick: int, now: float) -> None:
        header = json.dumps(view.header, separators=(",", ":"), allow_nan=False)
        conn.execute("DELETE FROM last_result")  # a pre-3 blob (or a tool's) is superseded
        conn.execute(
            "INSERT INTO view_header (id, tick, time, header) VALUES (1, ?, ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET tick = excluded.tick, time = excluded.time, header = excluded.header",
            (tick, now, header),
        )
        if view.replace:
            conn.execute("DELETE FROM view_nodes")
        else:
            conn.executemany("DELETE FROM view_nodes WHERE node = ?", [(n,) for n in view.deletes])
        conn.executemany(
            "INSERT INTO view_nodes (node, tick, row, floor, explain) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (node) DO UPDATE SET tick = excluded.tick, row = excluded.row, "
            "floor = excluded.floor, explain = excluded.explain",
            [(n, tick, row, floor, x) for n, row, floor, x in view.nodes],
        )

    @staticmethod
    def _apply_marks(conn: Any, marks: TickMarks, tick: int, now: float) -> None:
        conn.executemany(
            "UPDATE outcomes SET processed_at = ? WHERE key = ? AND processed_at IS NULL",
            [(now, k) for k in marks.outcome_keys],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO attempts (job_id, start, delivered_at) VALUES (?, ?, ?)",
            [(j, s, now) for j, s in marks.attempts],
        )
        cols = _LEDGER_SQL
        conn.executemany(
            f"INSERT OR IGNORE INTO ledger ({cols}, tick, recorded_at) "
            f"VALUES ({', '.join('?' * len(LEDGER_COLUMNS))}, ?, ?)",
            [(*(_ledger_value(c, row[c]) for c in LEDGER_COLUMNS), tick, now) for row in marks.ledger],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO gate_marks (proposal_id, mark, node, time, tick) VALUES (?, ?, ?, ?, ?)",
            [(p, m, n, now, tick) for p, m, n in marks.gate_marks],
        )
        conn.executemany(
            "INSERT OR IGNORE INTO canary_seen (job_id, token, node, state, seen_at) VALUES (?, ?, ?, ?, ?)",
            [(j, t, n, st, now) for j, t, n, st in marks.canary_seen],
        )

    @staticmethod
    def _append(conn: Any, rows: Sequence[LogRow], tick: int | None) -> None:
        conn.executemany(
            "INSERT INTO events (time, tick, node, kind, message, data) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (r.time, tick, r.node, r.kind, r.message, json.dumps(dict(r.data or {}), default=str))
                for r in rows
            ],
        )

    # -- job outcomes (forwarded by agents) ------------------------------------------------------------

    def put_outcomes(
        self, node: str, records: Sequence[Mapping[str, Any]], received_at: float | None = None
    ) -> tuple[int, int]:
        """Store forwarded Epilog records durably, idempotent by ``outcome_key``. Returns (new, dups)."""
        received_at = self._clock() if received_at is None else received_at
        new = 0
        with self._write() as conn:
            for record in records:
                rec = {**record, "node": record.get("node") or node}
                cur = conn.execute(
                    "INSERT OR IGNORE INTO outcomes (key, job_id, node, record, received_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        outcome_key(node, rec),
                        str(rec["job_id"]),
                        node,
                        json.dumps(rec, sort_keys=True, default=str),
                        received_at,
                    ),
                )
                new += cur.rowcount
        return new, len(records) - new

    def pending_outcomes(self, limit: int = 10_000) -> list[StoredOutcome]:
        rows = (
            self._conn()
            .execute(
                "SELECT key, job_id, node, record, received_at FROM outcomes WHERE processed_at IS NULL "
                "ORDER BY received_at, key LIMIT ?",
                (limit,),
            )
            .fetchall()
        )
        return [StoredOutcome(r[0], r[1], r[2], json.loads(r[3]), r[4]) for r in rows]

    def delivered_attempt(self, job_id: str, start: float) -> bool:
        """Whether an attempt of ``job_id`` starting within ``ATTEMPT_SLOP_S`` of ``start`` was delivered."""
        row = (
            self._conn()
            .execute(
                "SELECT 1 FROM attempts WHERE job_id = ? AND start BETWEEN ? AND ? LIMIT 1",
                (job_id, start - ATTEMPT_SLOP_S, start + ATTEMPT_SLOP_S),
            )
            .fetchone()
        )
        return row is not None

    def outcome_counts(self) -> dict[str, int]:
        pending, processed = (
            self._conn()
            .execute(
                "SELECT COUNT(*) FILTER (WHERE processed_at IS NULL), "
                "COUNT(*) FILTER (WHERE processed_at IS NOT NULL) FROM outcomes"
            )
            .fetchone()
        )
        return {"pending": pending, "processed": processed}

    # -- ledger ---------------------------------------------------------------------------------------

    def ledger(self, since: float | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Settled job attempts (newest end first), ended at or after ``since``."""
        sql = f"SELECT {_LEDGER_SQL} FROM ledger"
        args: list[Any] = []
        if since is not None:
            sql += ' WHERE "end" >= ?'
            args.append(since)
        sql += ' ORDER BY "end" DESC, job_id DESC'
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        out = []
        for row in self._conn().execute(sql, args):
            doc = dict(zip(LEDGER_COLUMNS, row, strict=True))
            doc["nodes"] = json.loads(doc["nodes"])
            doc["failure"] = bool(doc["failure"])
            out.append(doc)
        return out

    def ledger_totals(self) -> dict[str, float]:
        row = (
            self._conn()
            .execute(
                "SELECT COUNT(*), COALESCE(SUM(useful_gpu_s), 0), COALESCE(SUM(wasted_gpu_s), 0), "
                "COALESCE(SUM(premium_misuse_gpu_s), 0), CAST(COALESCE(SUM(failure), 0) AS INTEGER) "
                "FROM ledger"
            )
            .fetchone()
        )
        return {
            "jobs": row[0],
            "useful_gpu_s": row[1],
            "wasted_gpu_s": row[2],
            "premium_misuse_gpu_s": row[3],
            "failures": row[4],
        }

    # -- gate marks and canaries ----------------------------------------------------------------------

    def gate_marked(self, mark: str) -> set[str]:
        rows = self._conn().execute("SELECT proposal_id FROM gate_marks WHERE mark = ?", (mark,)).fetchall()
        return {r[0] for r in rows}

    def record_canary_round(self, token: str, node: str, now: float) -> None:
        """Intent log, written BEFORE sbatch: a crash right after submitting still lets the next tick find
        the round's jobs by name."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO canary_rounds (token, node, submitted_at) VALUES (?, ?, ?)",
                (token, node, now),
            )

    def note_canary_jobs(self, token: str, jobs: int) -> None:
        with self._write() as conn:
            conn.execute("UPDATE canary_rounds SET jobs = jobs + ? WHERE token = ?", (jobs, token))

    def canary_rounds(self, since: float) -> dict[str, str]:
        """token -> node of rounds submitted at or after ``since``."""
        rows = (
            self._conn()
            .execute("SELECT token, node FROM canary_rounds WHERE submitted_at >= ?", (since,))
            .fetchall()
        )
        return {r[0]: r[1] for r in rows}

    def canary_seen(self, job_ids: Sequence[str]) -> set[str]:
        if not job_ids:
            return set()
        conn = self._conn()
        seen: set[str] = set()
        for i in range(0, len(job_ids), 500):
            chunk = list(job_ids[i : i + 500])
            rows = conn.execute(
                f"SELECT job_id FROM canary_seen WHERE job_id IN ({', '.join('?' * len(chunk))})", chunk
            ).fetchall()
            seen.update(r[0] for r in rows)
        return seen

    # -- intents of non-idempotent actions -------------------------------------------------------------

    def intent(self, key: str) -> Intent | None:
        row = self._conn().execute(f"SELECT {_INTENT_COLUMNS} FROM intents WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        key, node, kind, created, done_at, ok, detail = row
        return Intent(key, node, kind, created, done_at, None if ok is None else bool(ok), detail)

    def record_intent(self, key: str, node: str, kind: str, now: float) -> None:
        """Durable (committed, fsynced) BEFORE the action: a crash after acting still finds it."""
        with self._write() as conn:
            conn.execute("DELETE FROM intents WHERE created < ?", (now - INBOX_KEEP_S,))
            conn.execute(
                "INSERT OR IGNORE INTO intents (key, node, kind, created) VALUES (?, ?, ?, ?)",
                (key, node, kind, now),
            )

    def mark_intent(self, key: str, detail: str) -> None:
        """Committed just before an unfinished intent's action reaches a system whose effect shows only
        later (a BMC's power cycle): a replay then knows it may have been done though nothing shows it."""
        with self._write() as conn:
            conn.execute(
                "UPDATE intents SET detail = ? WHERE key = ? AND done_at IS NULL", (detail[:1000], key)
            )

    def finish_intent(self, key: str, ok: bool, detail: str, now: float) -> None:
        with self._write() as conn:
            conn.execute(
                "UPDATE intents SET done_at = ?, ok = ?, detail = ? WHERE key = ? AND done_at IS NULL",
                (now, int(ok), detail[:1000], key),
            )

    # -- the leader lease (PostgreSQL; ``lease.py`` holds the policy) -----------------------------------

    def lease_acquire(self, holder: str, ttl_s: float, now: float) -> int | None:
        """Take or renew the lease for ``holder`` until ``now + ttl_s``: its fencing token, or None when
        another holder's lease is still running. The token is kept while the same holder renews in time and
        incremented on every takeover (another holder, or a lapsed lease): strictly monotonic. One
        statement: the row lock of ``ON CONFLICT DO UPDATE`` makes two racing controllers take turns, the
        second seeing the first's row."""
        with self._write() as conn:
            row = conn.execute(
                "INSERT INTO leader_lease (id, holder, token, acquired_at, expires_at) "
                "VALUES (1, ?, 1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET "
                "token = CASE WHEN leader_lease.holder = excluded.holder AND leader_lease.expires_at > ? "
                "THEN leader_lease.token ELSE leader_lease.token + 1 END, "
                "acquired_at = CASE WHEN leader_lease.holder = excluded.holder "
                "AND leader_lease.expires_at > ? "
                "THEN leader_lease.acquired_at ELSE excluded.acquired_at END, "
                "holder = excluded.holder, expires_at = excluded.expires_at "
                "WHERE leader_lease.holder = excluded.holder OR leader_lease.expires_at <= ? "
                "RETURNING token",
                (holder, now, now + ttl_s, now, now, now),
            ).fetchone()
        return None if row is None else int(row[0])

    def lease_holds(self, holder: str, token: int, now: float) -> bool:
        """The fencing check: ``holder`` still holds the lease with ``token`` and it has not expired."""
        row = (
            self._conn()
            .execute(
                "SELECT 1 FROM leader_lease WHERE id = 1 AND holder = ? AND token = ? AND expires_at > ?",
                (holder, token, now),
            )
            .fetchone()
        )
        return row is not None

    def lease_release(self, holder: str, token: int) -> None:
        """Give the lease up at a clean stop (the standby takes over at its next try, not after the TTL)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE leader_lease SET expires_at = 0 WHERE id = 1 AND holder = ? AND token = ?",
                (holder, token),
            )

    def leader_status(self, now: float) -> dict[str, Any]:
        """Which controller leads, from the store: ``{"mode": "single"}`` on SQLite (one controller), else
        the lease's holder (None: lapsed, a takeover is due), token and seconds left."""
        if not self._pg:
            return {"mode": "single"}
        row = self.lease_row()
        if row is None:
            return {"mode": "lease", "leader": None, "token": None, "expires_in_s": None}
        live = row["expires_at"] > now
        return {
            "mode": "lease",
            "leader": row["holder"] if live else None,
            "token": row["token"],
            "expires_in_s": round(row["expires_at"] - now, 3),
        }

    def lease_row(self) -> dict[str, Any] | None:
        row = (
            self._conn()
            .execute("SELECT holder, token, acquired_at, expires_at FROM leader_lease WHERE id = 1")
            .fetchone()
        )
        return (
            None
            if row is None
            else dict(zip(("holder", "token", "acquired_at", "expires_at"), row, strict=True))
        )

    def append_log(self, rows: Sequence[LogRow]) -> None:
        """Log rows outside a tick (e.g. the push listener's rejections)."""
        with self._write() as conn:
            self._append(conn, rows, None)

    # -- read models ----------------------------------------------------------------------------------

    def _view_header(self) -> tuple[int, str] | None:
        """(tick, header JSON) of the schema-3 view; None when there is none (or the database predates it:
        a read-only open does not migrate)."""
        try:
            return self._conn().execute("SELECT tick, header FROM view_header WHERE id = 1").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise

    def last_result_tick(self) -> int | None:
        found = self._view_header()
        if found is not None:
            return found[0]
        row = self._conn().execute("SELECT tick FROM last_result WHERE id = 1").fetchone()
        return None if row is None else row[0]

    def last_view(self) -> dict[str, Any] | None:
        """The last view without explanations: the header, ``nodes`` (name -> row) and ``floor`` (name ->
        the floor's compact GPUs and proposal). From a pre-3 blob: the blob as it is (explanations inline)."""
        conn = self._conn()
        with self._snapshot(conn):
            found = self._view_header()
            if found is None:
                row = conn.execute("SELECT result FROM last_result WHERE id = 1").fetchone()
                return None if row is None else json.loads(row[0])
            view = json.loads(found[1])
            nodes: dict[str, Any] = {}
            floor: dict[str, Any] = {}
            for name, row_json, floor_json in conn.execute(
                "SELECT node, row, floor FROM view_nodes ORDER BY node"
            ):
                nodes[name] = json.loads(row_json)
                floor[name] = json.loads(floor_json)
        return {**view, "nodes": nodes, "floor": floor}

    def node_explanation(self, node: str) -> tuple[int, dict[str, Any]] | None:
        """(tick the explanation was rendered at, its ``explain_dict`` document) of one node; None when the
        node has none stored (unknown, or not explained yet: ``views.EXPLAIN_PER_TICK``)."""
        try:
            row = (
                self._conn()
                .execute(
                    "SELECT tick, explain FROM view_nodes WHERE node = ? AND explain IS NOT NULL", (node,)
                )
                .fetchone()
            )
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return None if row is None else (row[0], json.loads(row[1]))

    def last_result(self) -> dict[str, Any] | None:
        """The whole last view, explanations inline (every node's: megabytes at fleet scale; for tools and
        tests, the API and the CLI read ``last_view`` and ``node_explanation``)."""
        conn = self._conn()
        with self._snapshot(conn):
            found = self._view_header()
            if found is None:
                row = conn.execute("SELECT result FROM last_result WHERE id = 1").fetchone()
                return None if row is None else json.loads(row[0])
            nodes = {}
            for name, row_json, x in conn.execute("SELECT node, row, explain FROM view_nodes ORDER BY node"):
                doc = None if x is None else json.loads(x)
                nodes[name] = {
                    **json.loads(row_json),
                    "explain": doc,
                    "explain_text": None if doc is None else explain_text(doc),
                }
        return {**json.loads(found[1]), "nodes": nodes}

    @contextlib.contextmanager
    def _snapshot(self, conn: Any) -> Iterator[None]:
        """Several SELECTs from one snapshot (header and nodes of the same tick), unless a transaction is
        already open on this connection."""
        if conn.in_transaction:
            yield
            return
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ" if self._pg else "BEGIN")
        try:
            yield
        finally:
            conn.execute("COMMIT")

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
