"""The hash-chained audit log (slurm_fleetyield/gate/audit.py): tampering is detected, honest logs verify."""

from __future__ import annotations

import io
import itertools
import json
import sqlite3
from pathlib import Path

import pytest

from slurm_fleetyield.gate.audit import (
    GENESIS_HASH,
    AuditEntry,
    AuditHead,
    AuditLog,
    canonical_json,
    connect,
    entry_hash,
    immediate_transaction,
    read_head,
    verify_chain,
    verify_jsonl,
    write_head,
)
from slurm_fleetyield.gate.errors import AuditIntegrityError

from .helpers import T0


def _log(tmp_path: Path, n: int = 5, head: bool = True) -> AuditLog:
    log = AuditLog.open(tmp_path / "audit.db", tmp_path / "audit.head" if head else None)
    for i in range(n):
        log.append(
            time=T0 + i, actor="admin:alice", kind="approved", subject=f"p-{i:012x}", data={"i": i, "n": "ü"}
        )
    return log


def _attacker(log: AuditLog) -> sqlite3.Connection:
    """A second connection without the append-only triggers, like someone with write access to the file."""
    conn = sqlite3.connect(str(log.conn.execute("PRAGMA database_list").fetchone()[2]), isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS audit_no_update")
    conn.execute("DROP TRIGGER IF EXISTS audit_no_delete")
    return conn


def test_honest_log_verifies(tmp_path: Path) -> None:
    log = _log(tmp_path)
    entries = list(log.entries())
    assert [e.seq for e in entries] == [1, 2, 3, 4, 5]
    assert entries[0].prev_hash == GENESIS_HASH
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(entries))
    report = log.verify()
    assert report.ok and report.entries == 5 and report.last_seq == 5 and report.last_hash == entries[-1].hash
    assert report.first_bad_seq is None and report.problem is None
    assert read_head(tmp_path / "audit.head") == AuditHead(seq=5, hash=entries[-1].hash)


def test_hash_is_sha256_of_the_canonical_fields(tmp_path: Path) -> None:
    import hashlib

    e = next(_log(tmp_path, 1).entries())
    body = {"actor": e.actor, "data": e.data, "kind": e.kind, "prev_hash": e.prev_hash, "seq": 1,
            "subject": e.subject, "time": float(T0)}  # fmt: skip
    assert e.hash == hashlib.sha256(canonical_json(body)).hexdigest() == e.expected_hash()


def test_empty_log_verifies(tmp_path: Path) -> None:
    log = _log(tmp_path, 0)
    assert log.verify().ok and log.tail() == AuditHead(seq=0, hash=GENESIS_HASH)
    assert verify_chain([], AuditHead(seq=0, hash=GENESIS_HASH)).ok


def test_triggers_refuse_update_and_delete(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log.conn.execute("UPDATE audit SET actor = 'x' WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        log.conn.execute("DELETE FROM audit WHERE seq = 2")


def test_deleted_entry_is_a_gap(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _attacker(log).execute("DELETE FROM audit WHERE seq = 3")
    r = log.verify()
    assert not r.ok and r.code == "gap" and r.first_bad_seq == 3 and "deleted" in (r.problem or "")


def test_deleted_first_entry(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _attacker(log).execute("DELETE FROM audit WHERE seq = 1")
    r = verify_chain(log.entries())
    assert (r.ok, r.code, r.first_bad_seq) == (False, "gap", 1)


def test_deleted_entry_renumbered_is_a_broken_link(tmp_path: Path) -> None:
    log = _log(tmp_path)
    a = _attacker(log)
    a.execute("DELETE FROM audit WHERE seq = 3")
    a.execute("UPDATE audit SET seq = seq - 1 WHERE seq > 3")  # close the gap
    r = verify_chain(log.entries())
    assert not r.ok and r.first_bad_seq == 3 and r.code in ("broken_link", "hash_mismatch")


def test_edited_entry_is_a_hash_mismatch(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _attacker(log).execute("""UPDATE audit SET data = '{"i":99,"n":"ü"}' WHERE seq = 2""")
    r = log.verify()
    assert (r.ok, r.code, r.first_bad_seq) == (False, "hash_mismatch", 2)


@pytest.mark.parametrize("column", ["time", "actor", "kind", "subject"])
def test_any_edited_column_is_detected(tmp_path: Path, column: str) -> None:
    log = _log(tmp_path)
    value = 1.0 if column == "time" else "forged"
    _attacker(log).execute(f"UPDATE audit SET {column} = ? WHERE seq = 4", (value,))
    r = verify_chain(log.entries())
    assert (r.ok, r.code, r.first_bad_seq) == (False, "hash_mismatch", 4)


def test_edit_with_recomputed_hash_breaks_the_next_link(tmp_path: Path) -> None:
    log = _log(tmp_path)
    e = next(log.entries(since_seq=1))
    data = {"i": 99}
    h = entry_hash(e.prev_hash, e.seq, e.time, e.actor, e.kind, e.subject, data)
    _attacker(log).execute("UPDATE audit SET data = ?, hash = ? WHERE seq = 2", (json.dumps(data), h))
    r = verify_chain(log.entries())
    assert (r.ok, r.code, r.first_bad_seq) == (False, "broken_link", 3)


def test_reordered_rows_are_detected(tmp_path: Path) -> None:
    log = _log(tmp_path)
    a = _attacker(log)
    rows = {
        s: r
        for s, *r in a.execute("SELECT seq, time, actor, kind, subject, data, prev_hash, hash FROM audit")
    }
    for seq, other in ((2, 3), (3, 2)):  # swap the contents of 2 and 3, keep the seq numbers
        a.execute(
            "UPDATE audit SET time=?, actor=?, kind=?, subject=?, data=?, prev_hash=?, hash=? WHERE seq=?",
            (*rows[other], seq),
        )
    r = log.verify()
    assert not r.ok and r.first_bad_seq == 2


def test_reordered_jsonl_lines_are_detected(tmp_path: Path) -> None:
    log = _log(tmp_path)
    out = io.StringIO()
    assert log.export_jsonl(out) == 5
    lines = out.getvalue().splitlines()
    assert verify_jsonl(lines).ok
    lines[1], lines[2] = lines[2], lines[1]
    r = verify_jsonl(lines)
    assert (r.ok, r.code, r.first_bad_seq) == (False, "gap", 2)


def test_jsonl_export_is_canonical_and_round_trips(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    out = io.StringIO()
    log.export_jsonl(out)
    lines = out.getvalue().splitlines()
    for line, e in zip(lines, log.entries(), strict=True):
        assert AuditEntry.model_validate_json(line) == e
        assert canonical_json(json.loads(line)).decode() == line
    assert verify_jsonl(lines, log.tail()).ok


def test_malformed_jsonl_line_is_reported(tmp_path: Path) -> None:
    r = verify_jsonl(['{"seq": 1}'])
    assert not r.ok and r.code == "malformed" and "line 1" in (r.problem or "")


def test_truncated_tail_needs_the_head_to_be_seen(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _attacker(log).execute("DELETE FROM audit WHERE seq >= 4")
    assert verify_chain(log.entries()).ok  # without a checkpoint, a shorter chain looks honest
    r = log.verify()  # the head file says seq 5
    assert (r.ok, r.code, r.first_bad_seq) == (False, "truncated", 4)


def test_full_rewrite_is_caught_by_the_head(tmp_path: Path) -> None:
    log = _log(tmp_path)
    shipped = log.tail()  # e.g. sent to syslog
    a = _attacker(log)
    a.execute("DELETE FROM audit")
    prev = GENESIS_HASH
    for seq in range(1, 6):  # a perfectly consistent forged chain
        h = entry_hash(prev, seq, T0, "admin:mallory", "approved", "p-x", {})
        a.execute("INSERT INTO audit VALUES (?, ?, 'admin:mallory', 'approved', 'p-x', '{}', ?, ?)",
                  (seq, T0, prev, h))  # fmt: skip
        prev = h
    assert verify_chain(log.entries()).ok
    r = verify_chain(log.entries(), shipped)
    assert (r.ok, r.code, r.first_bad_seq) == (False, "head_mismatch", 5)
    assert not log.verify().ok  # the head file too, as long as the attacker could not write it


def test_head_one_behind_after_a_crash_is_fine(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    old = log.tail()
    with immediate_transaction(log.conn):  # committed, but "crashed" before publish_head
        log.append(time=T0 + 9, actor="a", kind="k", subject="s", data={})
    write_head(tmp_path / "audit.head", old)
    assert log.verify().ok
    log.append(time=T0 + 10, actor="a", kind="k", subject="s", data={})  # the gate keeps working


def test_append_refuses_to_extend_a_truncated_log(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _attacker(log).execute("DELETE FROM audit WHERE seq = 5")
    with pytest.raises(AuditIntegrityError, match="seq 5"):
        log.append(time=T0 + 9, actor="a", kind="k", subject="s", data={})
    assert log.tail().seq == 4  # nothing was written, the evidence is intact


def test_missing_head_file_is_reported_and_blocks_appends(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    (tmp_path / "audit.head").unlink()
    r = log.verify()
    assert (r.ok, r.code) == (False, "head_missing")
    with pytest.raises(AuditIntegrityError, match="missing"):
        log.append(time=T0, actor="a", kind="k", subject="s", data={})


def test_corrupt_head_file(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    (tmp_path / "audit.head").write_text("{not json")
    assert log.verify().code == "malformed"
    with pytest.raises(AuditIntegrityError, match="corrupt"):
        log.append(time=T0, actor="a", kind="k", subject="s", data={})


def test_reseal_head_is_an_audited_recovery(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _attacker(log).execute("DELETE FROM audit WHERE seq = 5")
    entry = log.reseal_head(time=T0 + 100, actor="root", reason="INC-42: restored from backup")
    assert entry.kind == "head_resealed" and entry.seq == 5
    assert entry.data["old_head"]["seq"] == 5 and entry.data["tail"]["seq"] == 4
    assert log.verify().ok and read_head(tmp_path / "audit.head") == log.tail()


def test_append_inside_a_rolled_back_transaction_leaves_nothing(tmp_path: Path) -> None:
    log = _log(tmp_path, 1)
    with pytest.raises(RuntimeError), immediate_transaction(log.conn):
        log.append(time=T0, actor="a", kind="k", subject="s", data={})
        raise RuntimeError("crash before commit")
    assert log.tail().seq == 1 and log.verify().ok


def test_survives_reopen(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    tail = log.tail()
    log.conn.close()
    again = AuditLog(connect(tmp_path / "audit.db"), tmp_path / "audit.head")
    assert again.tail() == tail and again.verify().ok
    again.append(time=T0, actor="a", kind="k", subject="s", data={})
    assert again.verify().ok and again.tail().seq == 4


def test_unserializable_data_is_refused(tmp_path: Path) -> None:
    log = _log(tmp_path, 0)
    with pytest.raises(ValueError):
        log.append(time=T0, actor="a", kind="k", subject="s", data={"x": float("nan")})
    assert log.tail().seq == 0
