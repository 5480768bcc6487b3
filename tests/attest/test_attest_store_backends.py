"""The attestation store (slurm_fleetyield/attest/store.py) on both backends: an SQLite file, and the
PostgreSQL store's database, where a second controller's store (the standby after a takeover) sees the
enrolments and verdicts the first one wrote and cannot reuse a nonce it consumed."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from slurm_fleetyield.attest.store import MAX_NONCES_PER_NODE, AttestStore, AttestStoreError, NonceError

T0 = 1_700_000_000.0


def test_verdicts_enrolments_and_nonces_survive_a_second_store(store_url):
    first = AttestStore(store_url)
    first.enroll("gpu-1", "cHVia2V5", "k1", "h100", None, T0)
    nonce, expires = first.issue_nonce("gpu-1", T0)
    first.save_verdict({"node": "gpu-1", "time": T0 + 1, "status": "fail", "why": ["pcr 7"]})
    first.close()  # the leader dies
    second = AttestStore(store_url)  # the survivor (or a restart)
    try:
        assert second.enrolment("gpu-1").key_id == "k1" and expires == T0 + 60
        assert second.latest_verdict("gpu-1") == {
            "node": "gpu-1",
            "time": T0 + 1,
            "status": "fail",
            "why": ["pcr 7"],
        }
        second.consume_nonce("gpu-1", nonce, T0 + 2)
        with pytest.raises(NonceError) as e:
            second.consume_nonce("gpu-1", nonce, T0 + 3)
        assert e.value.code == "replayed"
        assert second.revoke("gpu-1") and second.enrolments() == []
    finally:
        second.close()


def test_one_nonce_consumed_by_two_stores_at_once_is_accepted_once(store_url):
    AttestStore(store_url).close()
    stores = [AttestStore(store_url) for _ in range(2)]
    nonces = [stores[0].issue_nonce("gpu-1", T0)[0] for _ in range(20)]
    outcomes: list[str] = []
    lock = threading.Lock()

    def consume(store: AttestStore) -> None:
        for n in nonces:
            try:
                store.consume_nonce("gpu-1", n, T0 + 1)
                code = "ok"
            except NonceError as exc:
                code = exc.code
            with lock:
                outcomes.append(code)

    threads = [threading.Thread(target=consume, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for s in stores:
        s.close()
    assert sorted(outcomes) == ["ok"] * 20 + ["replayed"] * 20


def test_readonly_open_needs_the_tables_and_reads_them(store_url, tmp_path):
    with pytest.raises(AttestStoreError):
        AttestStore.open_readonly(store_url)
    w = AttestStore(store_url)
    w.save_verdict({"node": "gpu-2", "time": T0, "status": "pass"})
    w.close()
    ro = AttestStore.open_readonly(store_url)
    try:
        assert [v["node"] for v in ro.latest_verdicts()] == ["gpu-2"]
    finally:
        ro.close()


def test_a_repeated_request_gets_its_nonce_again_and_rows_stay_bounded_per_node(store_url):
    # issue #27: each replayed signed /v1/attest/nonce request inserted one more row
    store = AttestStore(store_url)
    try:
        first = store.issue_nonce("gpu-1", T0, request="sig-a")
        for i in range(50):  # the same request, replayed inside its signature's skew window
            assert store.issue_nonce("gpu-1", T0 + i, request="sig-a") == first
        assert store.nonce_count("gpu-1") == 1
        # fresh requests (a holder of the push secret): the node keeps its newest MAX_NONCES_PER_NODE
        issued = [store.issue_nonce("gpu-1", T0 + 100 + i, request=f"sig-{i}")[0] for i in range(80)]
        manual = store.issue_nonce("gpu-1", T0 + 200)[0]  # `fleetyield attest nonce`: no request id
        assert store.nonce_count("gpu-1") == MAX_NONCES_PER_NODE
        store.consume_nonce("gpu-1", manual, T0 + 201)
        store.consume_nonce("gpu-1", issued[-1], T0 + 201)
        with pytest.raises(NonceError) as e:
            store.consume_nonce("gpu-1", first[0], T0 + 201)  # the oldest went first
        assert e.value.code == "unknown"
        assert store.issue_nonce("gpu-2", T0)[0] and store.nonce_count("gpu-2") == 1  # per node
        assert store.nonce_count() == MAX_NONCES_PER_NODE + 1
    finally:
        store.close()


def test_an_attestation_db_from_before_the_request_key_is_migrated(tmp_path):
    db = tmp_path / "attest.db"
    with sqlite3.connect(db) as conn:  # schema 1, as the previous release created it
        conn.executescript(
            "CREATE TABLE nonce (nonce TEXT PRIMARY KEY, node TEXT NOT NULL, issued_at REAL NOT NULL,"
            " expires_at REAL NOT NULL, used_at REAL);"
        )
        conn.execute("INSERT INTO nonce VALUES ('n-old', 'gpu-1', ?, ?, NULL)", (T0, T0 + 60))
    conn.close()
    store = AttestStore(db)
    try:
        nonce, _ = store.issue_nonce("gpu-1", T0 + 1, request="sig-a")
        assert store.issue_nonce("gpu-1", T0 + 2, request="sig-a")[0] == nonce
        store.consume_nonce("gpu-1", "n-old", T0 + 3)  # the old row survived the migration
        assert store.nonce_count("gpu-1") == 2
    finally:
        store.close()
    AttestStore(db).close()  # opening a migrated file again changes nothing
