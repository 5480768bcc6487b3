"""Attestation state: enrolments (explicit admin step), nonces (single use), latest verdicts.

Input: a database path (SQLite, created on first use, mode 0600) or, with a PostgreSQL store (``[store]
url``), that URL: the tables live in the store's database, versioned in their own ``attest_schema_version``
row, so verdicts and enrolments survive a takeover by the standby.
Output: ``Enrolment`` rows by node; nonces that are issued for one node with an expiry and consumed at
most once (``consume`` raises ``NonceError`` naming
why: unknown, expired, already used, other node); the latest verdict per node (what the gate API serves).
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
PG_VERSION_TABLE = "attest_schema_version"
PG_SCHEMA_VERSION = 1

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


PG_MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _SCHEMA),)
"""The attestation tables on PostgreSQL (``store_pg.migrate``; types through ``store_pg.ddl``)."""


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
    def issue_nonce(self, node: str, now: float, ttl_s: float = NONCE_TTL_S) -> tuple[str, float]:
        nonce = secrets.token_hex(32)
        expires = now + ttl_s
        with self._tx():
            self.db.execute("DELETE FROM nonce WHERE expires_at < ?", (now - 3600,))  # bounded table
            self.db.execute("INSERT INTO nonce VALUES (?,?,?,?,NULL)", (nonce, node, now, expires))
        return nonce, expires

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
