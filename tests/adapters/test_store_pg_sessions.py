"""The store's PostgreSQL sessions end themselves when their client is gone mid-transaction (a controller's
container killed, a hung process): its row locks go, and the new leader's writes proceed. Real PostgreSQL
(tests/pgcluster.py)."""

from __future__ import annotations

import time

from slurm_fleetyield.adapters import store_pg


def test_sessions_carry_the_keepalive_and_idle_transaction_settings(pg_url):
    conn = store_pg.connect(pg_url, readonly=False)
    try:
        (timeout,) = conn.raw.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert timeout == "15s", timeout
    finally:
        conn.close()


def test_a_session_idle_in_a_transaction_loses_its_locks(pg_url, monkeypatch):
    monkeypatch.setattr(store_pg, "SESSION_OPTIONS", "-c idle_in_transaction_session_timeout=1000")
    holder, waiter = store_pg.connect(pg_url, False), store_pg.connect(pg_url, False)
    try:
        holder.execute("CREATE TABLE lease_probe (id INTEGER PRIMARY KEY, v INTEGER)")
        holder.execute("INSERT INTO lease_probe (id, v) VALUES (1, 0)")
        holder.execute("BEGIN")
        holder.execute("UPDATE lease_probe SET v = 1 WHERE id = 1")  # row lock held, then silence
        waiter.raw.execute("SET lock_timeout = '20s'")
        t0 = time.monotonic()
        waiter.execute("UPDATE lease_probe SET v = 2 WHERE id = 1")  # blocks until the holder is ended
        waited = time.monotonic() - t0
        assert 0.5 < waited < 15, waited
        assert waiter.raw.execute("SELECT v FROM lease_probe WHERE id = 1").fetchone() == (2,)
        assert holder.raw.closed or holder.raw.broken or _dead(holder)
    finally:
        holder.close()
        waiter.close()


def _dead(conn: store_pg.PgConnection) -> bool:
    try:
        conn.raw.execute("SELECT 1")
    except Exception as exc:  # the server ended the session: IdleInTransactionSessionTimeout, then closed
        return "idle-in-transaction" in str(exc) or isinstance(exc, store_pg.connection_errors())
    return False
