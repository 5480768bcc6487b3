"""Attestation state: enrolments (explicit admin step), nonces (single use), latest verdicts.

Input: a database path (SQLite, created on first use, mode 0600) or, with a PostgreSQL store (``[store]
url``), that URL: the tables live in the store's database, versioned in their own ``attest_schema_version``
row, so verdicts and enrolments survive a takeover by the standby.
Output: ``Enrolment`` rows by node; nonces that are issued for one node with an expiry and consumed at
most once (``consume`` raises ``NonceError`` naming
why: unknown, expired, already used, other node); the latest verdict per node (what the gate API serves).

The nonce table stays bounded. A nonce asked by a signed request (``POST /v1/attest/nonce``) is keyed by
the request's own id (``request_id``, random, in the signed body, as a push's events carry ``event_id``):
the same request again, a replay inside the signature's skew window or a retry, gets the nonce it got
before and adds no row (as a replayed push adds no log row, ``agent_seen``). Not the signature as the
key: it covers the body and the timestamp in whole seconds, so two hand-overs of one node in one second
would get one nonce and the second quote would fail as replayed. Fresh requests can only come from a
holder of the push secret; even so at most ``MAX_NONCES_PER_NODE`` rows per node are kept (the oldest go
first), and rows expired for an hour are pruned. Why not the cap alone: replays would push the node's own
outstanding nonce out, and its quote would then fail as ``unknown``: a drain by replay. A request without
an id (an agent from before it sent one) still gets a new row each time, under the cap.
Every write is one transaction; ``BEGIN IMMEDIATE`` (SQLite) or ``SELECT ... FOR UPDATE`` on the nonce
row (PostgreSQL) makes nonce consumption atomic across processes and controllers.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_fleetyield.adapters import store_pg
from slurm_fleetyield.adapters.sqlite_check import quick_check

DEFAULT_DB = "/var/lib/fleetyield/attest.db"
NONCE_TTL_S = 60.0
MAX_NONCES_PER_NODE = 32
"""Nonce rows kept per node. A node asks one per hand-over (each Epilog, and the agent's re-attestation every
15 minutes) and spends it within seconds of its 60 s TTL: 32 is far above what it ever holds, and bounds the
table at 32 rows a node whatever a sender holding the push secret does."""
PG_VERSION_TABLE = "attest_schema_version"
PG_SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS enrolment (
    node TEXT PRIMARY KEY, pubkey TEXT NOT NULL, key_id TEXT NOT NULL, node_class TEXT NOT NULL,
    ak_pem TEXT, enrolled_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS nonce (
    nonce TEXT PRIMARY KEY, node TEXT NOT NULL, issued_at REAL NOT NULL, expires_at REAL NOT NULL,
    used_at REAL);
CREATE INDEX IF NOT EXISTS nonce_expiry ON nonce(expires_at);
CREATE TABLE IF NOT EXISTS verdict (node TEXT PRIMARY KEY, time REAL NOT NULL, status TEXT NOT NULL,
    doc TEXT NOT NULL);
"""
_NONCE_REQUEST = "ALTER TABLE nonce ADD COLUMN request TEXT"
"""Schema 2: the ``request_id`` of the signed request a nonce answered; NULL without one."""
_NONCE_INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS nonce_request ON nonce(node, request);
CREATE INDEX IF NOT EXISTS nonce_by_node ON nonce(node, issued_at);
"""


class NonceError(ValueError):
    """A quote's nonce is not acceptable; ``code`` is unknown | expired | replayed | wrong_node."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Enrolment:
    node: str
    pubkey: str  # base64 of the raw 32-byte Ed25519 key
    key_id: str
    node_class: str
    ak_pem: str | None
    enrolled_at: float


class AttestStoreError(Exception):
    """The database cannot be used: absent (``open_readonly``), not an attestation database, or damaged
    (a page fails SQLite's ``quick_check`` when a writer opens it). ``str()`` names the file."""


PG_MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _SCHEMA), (2, f"{_NONCE_REQUEST};{_NONCE_INDEXES}"))
"""The attestation tables on PostgreSQL (``store_pg.migrate``; types through ``store_pg.ddl``). 2: the nonce's
request key (module docstring)."""


class AttestStore:
    _pg = False
    _lock: Any = None
    db: Any  # sqlite3.Connection, or store_pg.PgConnection taking the same SQL

    def __init__(self, path: str | Path) -> None:
        self._lock = threading.RLock()  # one connection shared by threads: one transaction at a time
        if store_pg.is_url(str(path)):
            self._pg = True
            self.path = Path(store_pg.redact(str(path)))  # for messages only
            errors: tuple[type[BaseException], ...] = (ValueError, *store_pg.connection_errors())
            try:
                self.db = store_pg.connect(str(path), readonly=False)
                store_pg.migrate(self.db, PG_MIGRATIONS, PG_SCHEMA_VERSION, table=PG_VERSION_TABLE)
            except errors as exc:
                raise AttestStoreError(f"{self.path}: cannot open the attestation tables: {exc}") from None
            return
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        self.db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            quick_check(self.db)  # a damaged page stops the open, not a later nonce or verdict write
            self.db.executescript(_SCHEMA)
            if "request" not in {row[1] for row in self.db.execute("PRAGMA table_info(nonce)")}:
                self.db.execute(_NONCE_REQUEST)  # a database from before schema 2
            self.db.executescript(_NONCE_INDEXES)
        except sqlite3.DatabaseError as exc:  # not a database, or a damaged header, schema or data page
            self.db.close()
            raise AttestStoreError(
                f"{self.path}: not a usable attestation database ({exc}); restore it from backup, or move "
                "it away to start fresh (enrolments must then be made again)"
            ) from None

    @classmethod
    def open_readonly(cls, path: str | Path) -> AttestStore:
        """For the read-only verbs: creates nothing (no directory, no database, no schema); an absent or
        foreign file is an ``AttestStoreError`` naming it. Writes through it fail (SQLite's ``mode=ro``)."""
        if store_pg.is_url(str(path)):
            return cls._open_pg_readonly(str(path))
        p = Path(path)
        if not p.is_file():
            raise AttestStoreError(f"{p}: no attestation database (nothing enrolled yet, or another --db)")
        try:
            db = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True, timeout=10,
                                 isolation_level=None, check_same_thread=False)  # fmt: skip
            missing = {"enrolment", "verdict"} - {
                r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        except sqlite3.Error as exc:
            raise AttestStoreError(f"{p}: cannot read the attestation database: {exc}") from None
        if missing:
            db.close()
            tables = ", ".join(sorted(missing))
            raise AttestStoreError(f"{p}: not an attestation database (no table {tables})")
        store = cls.__new__(cls)  # __init__ would create and migrate
        store.path, store.db, store._lock = p, db, threading.RLock()
        return store

    @classmethod
    def _open_pg_readonly(cls, url: str) -> AttestStore:
        where = store_pg.redact(url)
        try:
            db = store_pg.connect(url, readonly=True)
            version = store_pg.schema_version(db, PG_VERSION_TABLE)
        except store_pg.connection_errors() as exc:
            raise AttestStoreError(f"{where}: cannot read the attestation tables: {exc}") from None
        if version is None:
            db.close()
            raise AttestStoreError(f"{where}: no attestation tables (nothing enrolled yet)")
        store = cls.__new__(cls)
        store.path, store.db, store._pg, store._lock = Path(where), db, True, threading.RLock()
        return store

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ enrolment
    def enroll(
        self, node: str, pubkey_b64: str, key_id: str, node_class: str, ak_pem: str | None, now: float
    ) -> Enrolment:
        self.db.execute(
            "INSERT INTO enrolment VALUES (?,?,?,?,?,?) ON CONFLICT(node) DO UPDATE SET"
            " pubkey=excluded.pubkey, key_id=excluded.key_id, node_class=excluded.node_class,"
            " ak_pem=excluded.ak_pem, enrolled_at=excluded.enrolled_at",
            (node, pubkey_b64, key_id, node_class, ak_pem, now),
        )
        return Enrolment(node, pubkey_b64, key_id, node_class, ak_pem, now)

    def revoke(self, node: str) -> bool:
        return self.db.execute("DELETE FROM enrolment WHERE node=?", (node,)).rowcount > 0

    def enrolment(self, node: str) -> Enrolment | None:
        row = self.db.execute("SELECT * FROM enrolment WHERE node=?", (node,)).fetchone()
        return Enrolment(*row) if row else None

    def enrolments(self) -> list[Enrolment]:
        return [Enrolment(*r) for r in self.db.execute("SELECT * FROM enrolment ORDER BY node")]

    # ------------------------------------------------------------------ nonces
    def issue_nonce(
        self, node: str, now: float, ttl_s: float = NONCE_TTL_S, *, request: str | None = None
    ) -> tuple[str, float]:
        """A fresh nonce for ``node`` and its expiry. ``request``: the asking request's ``request_id``; the
        same id of the same node again gets the nonce it got before, and no row is added. The node's oldest
        rows beyond ``MAX_NONCES_PER_NODE`` are dropped (module docstring)."""
        nonce = secrets.token_hex(32)
        expires = now + ttl_s
        with self._tx():
            self.db.execute("DELETE FROM nonce WHERE expires_at < ?", (now - 3600,))
            self.db.execute(
                "INSERT OR IGNORE INTO nonce (nonce, node, issued_at, expires_at, used_at, request)"
                " VALUES (?,?,?,?,NULL,?)",
                (nonce, node, now, expires, request),
            )
            if request is not None:  # this request's row: the one just made, or the one a first copy made
                nonce, expires = self.db.execute(
                    "SELECT nonce, expires_at FROM nonce WHERE node=? AND request=?", (node, request)
                ).fetchone()
            older = self.db.execute(
                "SELECT nonce FROM nonce WHERE node=? AND nonce<>? ORDER BY issued_at DESC, nonce",
                (node, nonce),
            ).fetchall()
            drop = older[MAX_NONCES_PER_NODE - 1 :]
            if drop:
                self.db.executemany("DELETE FROM nonce WHERE nonce=?", drop)
        return nonce, expires

    def nonce_count(self, node: str | None = None) -> int:
        """Nonce rows kept (of ``node``, or all)."""
        where, args = ("WHERE node=?", (node,)) if node is not None else ("", ())
        return int(self.db.execute(f"SELECT COUNT(*) FROM nonce {where}", args).fetchone()[0])

    def consume_nonce(self, node: str, nonce: str, now: float) -> None:
        with self._tx():
            lock = " FOR UPDATE" if self._pg else ""  # PostgreSQL: another controller waits for this row
            row = self.db.execute(
                f"SELECT node, expires_at, used_at FROM nonce WHERE nonce=?{lock}", (nonce,)
            ).fetchone()
            if row is None:
                raise NonceError("unknown", "nonce unknown: not issued by this controller (or long expired)")
            owner, expires, used = row
            if used is not None:
                raise NonceError("replayed", f"nonce already used at {used:.3f}: a replayed quote")
            if owner != node:
                raise NonceError("wrong_node", f"nonce was issued to {owner!r}, not {node!r}")
            # Burn it even when expired: a nonce never gets a second chance.
            self.db.execute("UPDATE nonce SET used_at=? WHERE nonce=?", (now, nonce))
            if now > expires:
                raise NonceError("expired", f"nonce expired {now - expires:.1f}s ago")

    # ------------------------------------------------------------------ verdicts
    def save_verdict(self, doc: dict[str, Any]) -> None:
        self.db.execute(
            "INSERT INTO verdict VALUES (?,?,?,?) ON CONFLICT(node) DO UPDATE SET time=excluded.time,"
            " status=excluded.status, doc=excluded.doc",
            (doc["node"], doc["time"], doc["status"], json.dumps(doc, sort_keys=True)),
        )

    def latest_verdict(self, node: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT doc FROM verdict WHERE node=?", (node,)).fetchone()
        return json.loads(row[0]) if row else None

    def latest_verdicts(self) -> list[dict[str, Any]]:
        return [json.loads(r[0]) for r in self.db.execute("SELECT doc FROM verdict ORDER BY node")]

    def _tx(self) -> Any:
        db, lock = self.db, self._lock

        class _Tx:
            def __enter__(self) -> None:
                lock.acquire()
                try:
                    db.execute("BEGIN IMMEDIATE")
                except BaseException:
                    lock.release()
                    raise

            def __exit__(self, exc_type: Any, *_: Any) -> None:
                # A NonceError still commits: the nonce is burnt either way.
                try:
                    if exc_type is None or issubclass(exc_type, NonceError):
                        db.execute("COMMIT")
                    else:
                        db.execute("ROLLBACK")
                finally:
                    lock.release()

        return _Tx()
