"""Read the gate's proposals without writing: for the API, ``fleetyield pending`` and ``approve``.

With a PostgreSQL store (``url``) the proposals are in that database, read on a read-only session.

Input: the gate's state directory (``gate.db``, written only by the daemon and the approval listener through
``Gatekeeper``). Output: proposals as JSON-able dicts (pending first, then the recently settled ones). The
database is opened read-only (``mode=ro``): a reader never creates it, migrates it or takes its write lock,
so ``fleetyield pending`` works for an admin who can read but not write the gate directory.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from slurm_fleetyield.adapters import store_pg

DB_FILENAME = "gate.db"
_COLUMNS = (
    "id",
    "node",
    "gpus",
    "risk",
    "evidence",
    "affected_jobs",
    "created_at",
    "expires_at",
    "status",
    "settled_at",
    "settled_by",
)


class ProposalsUnavailable(RuntimeError):
    """The gate database does not exist (yet) or cannot be read."""


def _doc(row: tuple[Any, ...]) -> dict[str, Any]:
    doc = dict(zip(_COLUMNS, row, strict=True))
    doc["gpus"] = json.loads(doc["gpus"])
    doc["affected_jobs"] = json.loads(doc["affected_jobs"])
    return doc


def read_proposals(
    state_dir: str | Path,
    *,
    status: str | None = None,
    proposal_id: str | None = None,
    settled_since: float | None = None,
    limit: int = 1000,
    url: str | None = None,
) -> list[dict[str, Any]]:
    """Proposals, oldest first: those with ``status`` / ``proposal_id``; with ``settled_since``, pending ones
    plus those settled since then (``/v1/proposals``: pending + recent). ``url``: a PostgreSQL store."""
    path = Path(state_dir) / DB_FILENAME
    if url is None and not path.exists():
        raise ProposalsUnavailable(f"{path}: no gate database (has the controller run with a gate yet?)")
    where, args = [], []
    if status is not None:
        where.append("status = ?")
        args.append(status)
    if proposal_id is not None:
        where.append("id = ?")
        args.append(proposal_id)
    if settled_since is not None:
        where.append("(status = 'pending' OR settled_at >= ?)")
        args.append(settled_since)
    sql = f"SELECT {', '.join(_COLUMNS)} FROM proposals"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY created_at, id LIMIT ?"
    args.append(limit)
    if url is not None:
        return _read_pg(url, sql, args)
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
        try:
            return [_doc(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise ProposalsUnavailable(f"{path}: {exc}") from None


def _read_pg(url: str, sql: str, args: list[Any]) -> list[dict[str, Any]]:
    where = store_pg.redact(url)
    try:
        conn = store_pg.connect(url, readonly=True)
    except store_pg.connection_errors() as exc:
        raise ProposalsUnavailable(f"{where}: {exc}") from None
    try:
        if conn.raw.execute("SELECT to_regclass('proposals')").fetchone()[0] is None:
            raise ProposalsUnavailable(f"{where}: no gate tables (has the controller run with a gate yet?)")
        return [_doc(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()
