"""The gate's append-only, hash-chained audit log.

Input: events of the gate (proposals, approvals, denials, rejections with their reason code, expiries, manual
settlements). Output: rows in a table ``audit`` (SQLite, or PostgreSQL when ``[store] url`` is one: two
controllers share one chain), the head checkpoint (row ``audit_head`` and the file ``audit.head``), a JSONL
export, and ``AuditReport`` from ``verify_chain``.

Sequence without gaps under concurrent writers. SQLite: ``BEGIN IMMEDIATE`` takes the database's write lock
before the tail is read. PostgreSQL: every gate write transaction takes ``pg_advisory_xact_lock(GATE_LOCK)``
first (``immediate_transaction``), so two controllers' gate writes run one after the other exactly as on
SQLite: the tail read, the nonce check and the insert of ``seq + 1`` see everything committed before. An
advisory lock rather than SERIALIZABLE: SERIALIZABLE would abort one of two concurrent appends and every
caller would need a retry loop (an approval's nonce, status and entry re-done), and a row lock on the tail
needs a tail row (none on an empty chain); the advisory lock costs one round trip and never aborts. The
primary key on ``seq`` makes a duplicate impossible even if a writer skipped the lock.

Chain: entry ``n`` stores ``prev_hash`` = hash of entry ``n-1`` (``GENESIS_HASH`` for seq 1) and
``hash = sha256(canonical_json({actor, data, kind, prev_hash, seq, subject, time}))`` where
``canonical_json`` is sorted-keys compact UTF-8 JSON. ``verify_chain`` walks the entries in order and
reports the first one that breaks: a seq gap or out-of-order seq (deleted or reordered rows), a ``prev_hash``
that is not the previous hash (deleted/reordered/rewritten rows), a hash that does not match the content
(edited rows), and, given a head checkpoint ``(seq, hash)``, a chain that is shorter than the checkpoint or
disagrees with it (truncated tail, or everything rewritten from some point on).

Threat model, honestly:
* The chain alone detects edits, deletions and reordering *inside* the log by anyone who does not bother to
  recompute hashes. It cannot detect removal of the newest entries, nor a full rewrite: the hashes are not
  secret, so anyone with write access to the database can recompute a consistent chain.
* The head checkpoint (``audit.head``, a small JSON file beside the database, rewritten atomically after each
  commit) detects truncation and rewrites *unless the attacker can write it too*. An attacker with write
  access to both the database and the head file can rewrite everything undetectably.
* The head row (``audit_head``, rewritten in each append's transaction) is in the same database as the
  chain: it catches a careless truncation (rows deleted, the row left) on a host with no head file of
  its own, never someone who can write the database.
* Therefore ship the head hash off the machine (syslog to a remote collector, a ticket, a WORM bucket) at
  whatever cadence you need to bound undetected tampering: ``AuditLog.tail()`` returns it, and every
  ``AuditHead`` published can be compared later with ``verify_chain(entries, head=that_head)``.
* ``AuditLog.append`` refuses (``AuditIntegrityError``) to extend a chain that no longer contains the
  recorded head, so the gate fails closed instead of silently overwriting the evidence of a truncation.
  After investigation an operator may ``reseal_head`` (itself an audited event).
* Triggers refuse UPDATE/DELETE on ``audit`` (and TRUNCATE on PostgreSQL); they stop bugs and careless
  hands, not an attacker: the table's owner can drop them.
* On PostgreSQL the chain and its ``audit_head`` row live in a database both controllers (and its admins)
  write: anyone with write access to it can rewrite both consistently. Each controller host still writes
  its own ``audit.head`` file (what that host last committed; another host's file may be behind, which
  verification accepts, and a host that never wrote has none, which is not an error there; its name names
  the database, ``head_filename``), but those files
  are evidence only against a DB writer who cannot also reach every host. The only real defence is the
  same as above: ship the head off-host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slurm_fleetyield.adapters import store_pg
from slurm_fleetyield.gate.errors import AuditIntegrityError

GENESIS_HASH = "0" * 64
HEAD_FILENAME = "audit.head"


def head_filename(url: str | None = None) -> str:
    """The head checkpoint file of a chain: ``audit.head`` for the host's own SQLite gate, and for a
    PostgreSQL chain ``audit-<12 hex of its host:port/dbname>.head``. One file per chain, so a host that
    moves between stores (SQLite to PostgreSQL and back, or to another database) never checks one chain
    against another chain's checkpoint: that reads as a truncation and stops the gate."""
    if url is None:
        return HEAD_FILENAME
    digest = hashlib.sha256(store_pg.identity(url).encode()).hexdigest()[:12]
    return f"audit-{digest}.head"


SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq       INTEGER PRIMARY KEY,
    time      REAL    NOT NULL,
    actor     TEXT    NOT NULL,
    kind      TEXT    NOT NULL,
    subject   TEXT    NOT NULL,
    data      TEXT    NOT NULL,
    prev_hash TEXT    NOT NULL,
    hash      TEXT    NOT NULL
);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TABLE IF NOT EXISTS audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  INTEGER NOT NULL,
    hash TEXT    NOT NULL
);
"""
GATE_LOCK = 0x46590002
"""``pg_advisory_xact_lock`` key of every gate write transaction on PostgreSQL (see the module docstring)."""

PG_SCHEMA: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS audit (
        seq BIGINT PRIMARY KEY, time DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL, kind TEXT NOT NULL,
        subject TEXT NOT NULL, data TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)""",
    """CREATE OR REPLACE FUNCTION fy_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'audit log is append-only'; END $$""",
    "DROP TRIGGER IF EXISTS audit_no_update ON audit",
    """CREATE TRIGGER audit_no_update BEFORE UPDATE OR DELETE ON audit
        FOR EACH ROW EXECUTE FUNCTION fy_audit_append_only()""",
    "DROP TRIGGER IF EXISTS audit_no_truncate ON audit",
    """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
        FOR EACH STATEMENT EXECUTE FUNCTION fy_audit_append_only()""",
    """CREATE TABLE IF NOT EXISTS audit_head (
        id INTEGER PRIMARY KEY CHECK (id = 1), seq BIGINT NOT NULL, hash TEXT NOT NULL)""",
)
"""The audit tables on PostgreSQL (part of the gate's migration, ``gatekeeper.PG_MIGRATIONS``)."""


def canonical_json(obj: Any) -> bytes:
    """Sorted-keys, compact, UTF-8 JSON, NaN/Infinity refused: the one serialization hashed or signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def entry_hash(
    prev_hash: str, seq: int, time: float, actor: str, kind: str, subject: str, data: dict[str, Any]
) -> str:
    body = {
        "actor": actor,
        "data": data,
        "kind": kind,
        "prev_hash": prev_hash,
        "seq": seq,
        "subject": subject,
        "time": float(time),  # REAL in SQLite: hash the float form so a reload hashes identically
    }
    return hashlib.sha256(canonical_json(body)).hexdigest()


class AuditEntry(BaseModel):
    """One link of the chain, as stored and as exported (one JSON object per JSONL line)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(ge=1)
    time: float
    actor: str
    kind: str
    subject: str
    data: dict[str, Any]
    prev_hash: str
    hash: str

    def expected_hash(self) -> str:
        return entry_hash(self.prev_hash, self.seq, self.time, self.actor, self.kind, self.subject, self.data)


class AuditHead(BaseModel):
    """A checkpoint of the chain: the newest seq and its hash (seq 0 and ``GENESIS_HASH`` when empty)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq: int = Field(ge=0)
    hash: str = Field(pattern=r"^[0-9a-f]{64}$")


class AuditReport(BaseModel):
    """Result of ``verify_chain``. ``ok`` is False iff ``problem`` is set; ``code`` is the problem's kind."""

    ok: bool
    entries: int = Field(description="entries examined")
    first_bad_seq: int | None = None
    code: str | None = Field(
        default=None,
        description="gap|broken_link|hash_mismatch|truncated|head_mismatch|head_missing|malformed",
    )
    problem: str | None = None
    last_seq: int = 0
    last_hash: str = GENESIS_HASH


def verify_chain(entries: Iterable[AuditEntry], head: AuditHead | None = None) -> AuditReport:
    """Check the chain from seq 1, in the given order (storage order, or file order for a JSONL export)."""
    count = 0
    prev_seq, prev_hash = 0, GENESIS_HASH
    hash_at_head: str | None = GENESIS_HASH if head is not None and head.seq == 0 else None

    def bad(seq: int, code: str, problem: str) -> AuditReport:
        return AuditReport(
            ok=False,
            entries=count,
            first_bad_seq=seq,
            code=code,
            problem=problem,
            last_seq=prev_seq,
            last_hash=prev_hash,
        )

    for e in entries:
        count += 1
        if e.seq != prev_seq + 1:
            what = "missing (deleted)" if e.seq > prev_seq + 1 else "out of order (reordered or duplicated)"
            return bad(prev_seq + 1, "gap", f"expected seq {prev_seq + 1}, found {e.seq}: entries {what}")
        if e.prev_hash != prev_hash:
            return bad(
                e.seq, "broken_link", f"seq {e.seq} does not link to seq {prev_seq} (prev_hash differs)"
            )
        if e.hash != e.expected_hash():
            return bad(e.seq, "hash_mismatch", f"seq {e.seq} content does not match its hash (edited)")
        prev_seq, prev_hash = e.seq, e.hash
        if head is not None and e.seq == head.seq:
            hash_at_head = e.hash

    if head is not None:
        if head.seq > prev_seq:
            return bad(
                prev_seq + 1,
                "truncated",
                f"chain ends at seq {prev_seq} but the head checkpoint is at seq {head.seq} (tail removed)",
            )
        if hash_at_head != head.hash:
            return bad(
                head.seq,
                "head_mismatch",
                f"seq {head.seq} hash differs from the head checkpoint (log rewritten from there on)",
            )
    return AuditReport(ok=True, entries=count, last_seq=prev_seq, last_hash=prev_hash)


# --------------------------------------------------------------------------------------------------------
# Head checkpoint file
# --------------------------------------------------------------------------------------------------------


def read_head(path: str | Path) -> AuditHead | None:
    """The checkpoint in ``path``, None if there is no file; a corrupt file raises ``AuditIntegrityError``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return AuditHead.model_validate_json(text)
    except ValidationError as e:
        raise AuditIntegrityError(f"{p}: corrupt audit head checkpoint: {e}") from e


def write_head(path: str | Path, head: AuditHead) -> None:
    """Atomically replace ``path`` with ``head`` (write temp, fsync, rename, fsync directory)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # concurrent writers
    data = canonical_json(head.model_dump()) + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, p)
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# --------------------------------------------------------------------------------------------------------
# SQLite store
# --------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def immediate_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error); joins the caller's open transaction.

    IMMEDIATE takes the write lock up front, so read-then-write sequences (next seq, nonce unused?) cannot
    interleave with another process. Needs a connection opened with ``isolation_level=None``.
    """
    if conn.in_transaction:
        yield
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if store_pg.is_pg(conn):
            conn.execute("SELECT pg_advisory_xact_lock(?)", (GATE_LOCK,))
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def connect(path: str | Path) -> Any:
    """A connection for the gate: PostgreSQL for a ``postgresql://`` URL (``store_pg.PgConnection``: the
    same SQL, explicit transactions), else SQLite: WAL, synchronous=FULL, explicit transactions, busy
    timeout."""
    if store_pg.is_url(str(path)):
        return store_pg.connect(str(path), readonly=False)
    conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")  # an applied approval must survive a power cut, like its nonce
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _row_to_entry(row: tuple[Any, ...]) -> AuditEntry:
    seq, time, actor, kind, subject, data, prev_hash, hash_ = row
    return AuditEntry(
        seq=seq,
        time=time,
        actor=actor,
        kind=kind,
        subject=subject,
        data=json.loads(data),
        prev_hash=prev_hash,
        hash=hash_,
    )


class AuditLog:
    """The audit table in ``conn`` plus, optionally, its head checkpoint file.

    ``append`` joins the caller's open transaction (so an approval and its audit entry commit together) or
    runs its own. The head file is rewritten by ``publish_head`` after the commit; ``append`` calls it itself
    when it ran its own transaction, otherwise the caller does after committing.
    """

    def __init__(self, conn: Any, head_path: str | Path | None = None) -> None:
        self.conn = conn
        self.head_path = Path(head_path) if head_path is not None else None
        self.shared = store_pg.is_pg(conn)
        """PostgreSQL: other controllers append too; this host's head file may be behind or absent."""
        if self.shared:  # the tables come with the gate's migration (``gatekeeper.PG_MIGRATIONS``)
            return
        with immediate_transaction(conn):
            _exec_schema(conn)

    @classmethod
    def open(cls, db_path: str | Path, head_path: str | Path | None = None) -> AuditLog:
        return cls(connect(db_path), head_path)

    def tail(self) -> AuditHead:
        row = self.conn.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        return AuditHead(seq=row[0], hash=row[1]) if row else AuditHead(seq=0, hash=GENESIS_HASH)

    def head_row(self) -> AuditHead | None:
        """The checkpoint row (written with every append, in its transaction); None before the first."""
        row = self.conn.execute("SELECT seq, hash FROM audit_head WHERE id = 1").fetchone()
        return AuditHead(seq=row[0], hash=row[1]) if row else None

    def _contains(self, head: AuditHead, where: str) -> None:
        if head.seq == 0:
            return
        row = self.conn.execute("SELECT hash FROM audit WHERE seq = ?", (head.seq,)).fetchone()
        if row is None or row[0] != head.hash:
            raise AuditIntegrityError(
                f"audit log no longer contains the head checkpoint seq {head.seq} ({where}): "
                "entries were removed or rewritten; verify the log, then reseal_head"
            )

    def check_head(self) -> None:
        """Raise ``AuditIntegrityError`` unless the chain still contains the recorded head checkpoints (the
        row; the file, when there is one: on PostgreSQL a host that never wrote has none)."""
        row = self.head_row()
        if row is not None:
            self._contains(row, "row audit_head")
        if self.head_path is None:
            return
        head = read_head(self.head_path)
        tail = self.tail()
        if head is None:
            if tail.seq > 0 and not self.shared:
                raise AuditIntegrityError(
                    f"{self.head_path} is missing but the audit log has {tail.seq} entries; "
                    "verify the log, then reseal_head"
                )
            return
        self._contains(head, str(self.head_path))

    def append(self, *, time: float, actor: str, kind: str, subject: str, data: dict[str, Any]) -> AuditEntry:
        """Add one entry at the end of the chain. See the class docstring for transactions."""
        own = not self.conn.in_transaction
        with immediate_transaction(self.conn):
            self.check_head()
            tail = self.tail()
            seq = tail.seq + 1
            data_text = canonical_json(data).decode("utf-8")
            data = json.loads(data_text)  # what will be read back is what gets hashed
            h = entry_hash(tail.hash, seq, time, actor, kind, subject, data)
            self.conn.execute(
                "INSERT INTO audit (seq, time, actor, kind, subject, data, prev_hash, hash)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (seq, float(time), actor, kind, subject, data_text, tail.hash, h),
            )
            self._write_head_row(AuditHead(seq=seq, hash=h))
        if own:
            self.publish_head()
        return AuditEntry(
            seq=seq,
            time=time,
            actor=actor,
            kind=kind,
            subject=subject,
            data=data,
            prev_hash=tail.hash,
            hash=h,
        )

    def _write_head_row(self, head: AuditHead) -> None:
        self.conn.execute(
            "INSERT INTO audit_head (id, seq, hash) VALUES (1, ?, ?) ON CONFLICT (id) "
            "DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
            (head.seq, head.hash),
        )

    def publish_head(self) -> AuditHead:
        """Write the current tail to the head file (after a commit). Returns it, e.g. to ship to syslog."""
        tail = self.tail()
        if self.head_path is not None:
            write_head(self.head_path, tail)
        return tail

    def reseal_head(self, *, time: float, actor: str, reason: str) -> AuditEntry:
        """Accept the log as it is now: an operator's decision after investigating an ``AuditIntegrityError``.

        The resealing itself is audited (kind ``head_resealed``, with the old and the new checkpoint).
        """
        with immediate_transaction(self.conn):
            old = read_head(self.head_path) if self.head_path is not None else None
            tail = self.tail()
            if self.head_path is not None:
                write_head(self.head_path, tail)  # so the append below passes check_head
            self._write_head_row(tail)
            entry = self.append(
                time=time,
                actor=actor,
                kind="head_resealed",
                subject="audit",
                data={
                    "reason": reason,
                    "old_head": old.model_dump() if old else None,
                    "tail": tail.model_dump(),
                },
            )
        self.publish_head()
        return entry

    def entries(self, since_seq: int = 0) -> Iterator[AuditEntry]:
        """Entries with seq > ``since_seq``, in seq order. Unparseable data raises ``ValueError``."""
        cur = self.conn.execute(
            "SELECT seq, time, actor, kind, subject, data, prev_hash, hash FROM audit"
            " WHERE seq > ? ORDER BY seq",
            (since_seq,),
        )
        for row in cur:
            yield _row_to_entry(row)

    def verify(self, head: AuditHead | None = None) -> AuditReport:
        """``verify_chain`` over the stored entries against ``head`` or, if None, the head file (if any) and
        the head row: the one further on is checked by the walk, the other must match its entry too."""
        try:
            if head is None:
                row = self.head_row()
                if row is not None:
                    report = verify_chain(self.entries(), row)
                    if not report.ok:
                        return report
            if head is None and self.head_path is not None:
                head = read_head(self.head_path)
                if head is None and self.tail().seq > 0 and not self.shared:
                    n = self.tail().seq
                    return AuditReport(
                        ok=False,
                        entries=n,
                        code="head_missing",
                        last_seq=n,
                        last_hash=self.tail().hash,
                        problem=f"{self.head_path} is missing although the log has {n} entries (deleted?)",
                    )
            return verify_chain(self.entries(), head)
        except (ValueError, AuditIntegrityError) as e:
            return AuditReport(ok=False, entries=0, code="malformed", problem=str(e))

    def export_jsonl(self, out: TextIO) -> int:
        """Write every entry as one canonical JSON line. Returns the number of entries written."""
        n = 0
        for e in self.entries():
            out.write(canonical_json(e.model_dump()).decode("utf-8") + "\n")
            n += 1
        return n


def _exec_schema(conn: sqlite3.Connection) -> None:
    # executescript() would COMMIT the caller's transaction; run the statements one by one instead.
    for stmt in _split_schema(SCHEMA):
        conn.execute(stmt)


def _split_schema(script: str) -> list[str]:
    out: list[str] = []
    buf = ""
    for line in script.strip().splitlines():
        buf += line + "\n"
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    return out


def read_jsonl(lines: Iterable[str]) -> Iterator[AuditEntry]:
    """Parse a JSONL export. A bad line raises ``ValueError`` naming its line number."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield AuditEntry.model_validate_json(line)
        except ValidationError as e:
            raise ValueError(f"line {lineno}: not an audit entry: {e}") from e


def verify_jsonl(lines: Iterable[str], head: AuditHead | None = None) -> AuditReport:
    """``verify_chain`` over a JSONL export; a malformed line is reported, not raised."""
    try:
        return verify_chain(read_jsonl(lines), head)
    except ValueError as e:
        return AuditReport(ok=False, entries=0, code="malformed", problem=str(e))
