"""The gate on the PostgreSQL store (``Gatekeeper.open(..., url=)``): two controllers share proposals, nonces
and one audit chain; the chain keeps its guarantees there (no gaps under concurrent writers, UPDATE/DELETE/
TRUNCATE refused, the head in a row), core-driven writes are fenced by the lease; and the SQLite gate.db of
schema 1 migrates to 2 (the head row)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import psycopg
import pytest

from slurm_fleetyield.adapters.proposals import read_proposals
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.gate.approvals import sign_statement
from slurm_fleetyield.gate.audit import head_filename, read_head
from slurm_fleetyield.gate.errors import ApprovalRejected, AuditIntegrityError, GateError
from slurm_fleetyield.gate.gatekeeper import Gatekeeper
from slurm_fleetyield.gate.proposal import ProposalStatus

from .conftest import Admins
from .helpers import PID, T0, make_proposal


def test_a_proposal_raised_on_one_host_is_approved_on_the_other(tmp_path: Path, pg_url, admins: Admins):
    with Gatekeeper.open(tmp_path / "a", url=pg_url) as a:
        a.propose(make_proposal())
    with Gatekeeper.open(tmp_path / "b", url=pg_url) as b:  # another host: no audit.head of its own yet
        applied = b.submit(sign_statement(admins.alice, b.get(PID), "approve", now=T0), admins.keys, T0 + 1)
        assert applied.proposal.status is ProposalStatus.APPROVED and applied.audit_seq == 2
        with pytest.raises(ApprovalRejected) as rej:
            b.submit(sign_statement(admins.alice, b.get(PID), "approve", now=T0), admins.keys, T0 + 2)
        assert rej.value.reason.value == "already_settled"
        assert b.verify_audit().ok
        assert b.audit.head_row() == b.audit.tail()
    assert (
        read_head(tmp_path / "a" / head_filename(pg_url)).seq == 1
    )  # a's file: what a last wrote (behind: fine)
    with Gatekeeper.open(tmp_path / "a", url=pg_url) as a:
        r = a.verify_audit()
        assert r.ok and r.last_seq == 3, r  # proposed, approved, rejected (the second envelope)
    (doc,) = read_proposals(tmp_path / "nowhere", url=pg_url, proposal_id=PID)
    assert doc["status"] == "approved" and doc["gpus"] == [3]


def test_audit_rows_cannot_be_updated_deleted_or_truncated(tmp_path: Path, pg_url):
    with Gatekeeper.open(tmp_path, url=pg_url) as g:
        g.propose(make_proposal())
    raw = psycopg.connect(pg_url, autocommit=True)
    try:
        for sql in ("UPDATE audit SET actor = 'x'", "DELETE FROM audit", "TRUNCATE audit"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                raw.execute(sql)
        assert raw.execute("SELECT count(*) FROM audit").fetchone()[0] == 1
    finally:
        raw.close()


def test_concurrent_writers_on_two_connections_leave_no_gap(tmp_path: Path, pg_url):
    Gatekeeper.open(tmp_path / "init", url=pg_url).close()
    errors: list[BaseException] = []

    def writer(host: str) -> None:
        try:
            with Gatekeeper.open(tmp_path / host, url=pg_url) as g:
                for i in range(25):
                    g.propose(make_proposal(id=f"p-{host}{i:010d}"[:14], node=f"{host}-{i}", now=T0 + i))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(h,)) for h in ("aa", "bb")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with Gatekeeper.open(tmp_path / "check", url=pg_url) as g:
        seqs = [e.seq for e in g.audit.entries()]
        assert seqs == list(range(1, 51))
        assert g.verify_audit().ok


def test_a_removed_tail_is_caught_by_the_head_row_on_a_host_without_a_file(tmp_path: Path, pg_url):
    with Gatekeeper.open(tmp_path / "a", url=pg_url) as g:
        g.propose(make_proposal())
        g.propose(make_proposal(id="p-333333333333", node="gpu-018", now=T0 + 2))
    raw = psycopg.connect(pg_url, autocommit=True)
    raw.execute("DROP TRIGGER audit_no_update ON audit")  # a DB writer: triggers stop bugs, not owners
    raw.execute("DELETE FROM audit WHERE seq = 2")
    raw.close()
    with Gatekeeper.open(tmp_path / "fresh-host", url=pg_url) as g:
        r = g.verify_audit()
        assert (r.ok, r.code, r.first_bad_seq) == (False, "truncated", 2)
        with pytest.raises(AuditIntegrityError, match="audit_head"):
            g.propose(make_proposal(id="p-444444444444", node="gpu-019", now=T0 + 3))


def test_core_driven_gate_writes_are_fenced_by_the_lease(tmp_path: Path, pg_url):
    store = Store(pg_url)
    try:
        old = store.lease_acquire("ctl-a", 5.0, T0)
        held: list[tuple[str, int] | None] = [("ctl-a", old)]
        with Gatekeeper.open(tmp_path, url=pg_url, lease=lambda: held[0]) as g:
            g.propose(make_proposal())
            assert store.lease_acquire("ctl-b", 5.0, T0 + 10) == old + 1  # a lapsed; b takes over
            with pytest.raises(GateError, match="fenced"):
                g.withdraw(PID, "recovered", T0 + 11)
            with pytest.raises(GateError, match="fenced"):
                g.propose(make_proposal(id="p-555555555555", node="gpu-020", now=T0 + 11))
            held[0] = None
            with pytest.raises(GateError, match="fenced"):
                g.expire(T0 + 9999)
            assert g.get(PID).status is ProposalStatus.PENDING and g.audit.tail().seq == 1
    finally:
        store.close()


def test_a_schema_1_sqlite_gate_db_migrates_to_the_head_row(tmp_path: Path):
    with Gatekeeper.open(tmp_path) as g:
        g.propose(make_proposal())
        g.propose(make_proposal(id="p-333333333333", node="gpu-018", now=T0 + 2))
        tail = g.audit.tail()
    conn = sqlite3.connect(tmp_path / "gate.db", isolation_level=None)  # back to what schema 1 was
    conn.execute("DROP TABLE audit_head")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    with Gatekeeper.open(tmp_path) as g:
        assert g.conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert g.audit.head_row() == tail
        assert g.verify_audit().ok
        g.propose(make_proposal(id="p-444444444444", node="gpu-019", now=T0 + 3))
        assert g.audit.head_row() == g.audit.tail() and g.audit.tail().seq == 3


def test_a_newer_gate_schema_on_postgresql_is_refused_naming_the_database(tmp_path: Path, pg_url):
    Gatekeeper.open(tmp_path, url=pg_url).close()
    raw = psycopg.connect(pg_url, autocommit=True)
    assert raw.execute("SELECT version FROM gate_schema_version").fetchone()[0] == 1
    raw.execute("UPDATE gate_schema_version SET version = 99")
    raw.close()
    with pytest.raises(GateError, match="schema version 99, this build knows 1"):
        Gatekeeper.open(tmp_path, url=pg_url)


def test_a_host_moving_between_sqlite_and_postgresql_keeps_one_checkpoint_per_chain(tmp_path: Path, pg_url):
    """The HA fixture's path: a host's gate dir served an SQLite chain, then a PostgreSQL one (whose head
    ran ahead), then SQLite again. Each chain is checked against its own checkpoint; neither reads as the
    other's truncation."""
    state = tmp_path / "gate"
    with Gatekeeper.open(state) as g:
        g.propose(make_proposal())
    with Gatekeeper.open(state, url=pg_url) as g:
        for i in range(3):
            g.propose(make_proposal(id=f"p-00000000000{i}", node=f"n{i}", now=T0 + i))
        assert g.audit.tail().seq == 3
    with Gatekeeper.open(state) as g:  # before: "chain ends at seq 1 but the head checkpoint is at seq 3"
        assert g.verify_audit().ok and g.audit.tail().seq == 1
        g.propose(make_proposal(id="p-0000000000ff", node="n9", now=T0 + 9))
    assert read_head(state / "audit.head").seq == 2
    assert read_head(state / head_filename(pg_url)).seq == 3
    with Gatekeeper.open(state, url=pg_url) as g:
        assert g.verify_audit().ok


def test_the_head_file_names_the_database_not_the_credentials():
    a = head_filename("postgresql://fy:secret@db1:5432/fleetyield")
    assert a == head_filename("postgresql://other:pw@db1/fleetyield?connect_timeout=3")
    assert a != head_filename("postgresql://fy:secret@db2:5432/fleetyield")
    assert a != head_filename("postgresql://fy:secret@db1:5432/other")
    assert head_filename(None) == "audit.head" and a.startswith("audit-") and a.endswith(".head")
