"""The attestation store (slurm_fleetyield/attest/store.py) on both backends: an SQLite file, and the
PostgreSQL store's database, where a second controller's store (the standby after a takeover) sees the
enrolments and verdicts the first one wrote and cannot reuse a nonce it consumed."""

from __future__ import annotations

import threading

import pytest

from slurm_fleetyield.attest.store import AttestStore, AttestStoreError, NonceError

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
