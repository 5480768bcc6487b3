"""The page check every SQLite writer runs when it opens its file (the store, the gate, attestation).

Input: an open ``sqlite3`` connection. Output: nothing when SQLite's ``quick_check`` finds every page sound,
else ``DamagedDatabase``. It is an ``sqlite3.DatabaseError``, so each opener's existing handler for "not a
database" turns it into that opener's own typed error naming the file (``StoreError``, ``GateError``,
``AttestStoreError``): a damaged file stops the start with one clear message instead of a tick that runs
until some query lands on the bad page.

Why at open: SQLite reads pages lazily. A file whose header and schema page are intact opens and answers
the queries that miss the damaged page, so without this check the controller ticks and ``audit verify``
says ok over a file that a later read finds malformed. Why ``quick_check`` and not ``integrity_check``: it
reads every page and checks the b-trees and record formats in O(N), skipping only the index-versus-table
cross-check that makes ``integrity_check`` O(N log N); ``(1)`` stops at the first problem.

This module imports no other adapter: every store may use it.
"""

from __future__ import annotations

import sqlite3


class DamagedDatabase(sqlite3.DatabaseError):
    """``PRAGMA quick_check`` found a damaged page; the message quotes SQLite's first finding."""


def quick_check(conn: sqlite3.Connection) -> None:
    """Raise ``DamagedDatabase`` unless every page of ``conn``'s main database checks out. SQLite may also
    raise its own ``sqlite3.DatabaseError`` ("database disk image is malformed") for damage it meets while
    checking: callers catch ``sqlite3.DatabaseError`` for both."""
    (check,) = conn.execute("PRAGMA quick_check(1)").fetchone()
    if check != "ok":
        found = " ".join(check.split())  # one line: the message goes into logs and JSON errors
        raise DamagedDatabase(f"integrity check failed: {found}")
