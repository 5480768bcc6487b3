"""The Gatekeeper (slurm_fleetyield/gate/gatekeeper.py): exactly-once, persistent, audited decisions."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from slurm_fleetyield.gate.approvals import parse_envelope, sign_statement, verify_statement
from slurm_fleetyield.gate.audit import AuditLog
from slurm_fleetyield.gate.errors import (
    ApprovalRejected,
    AuditIntegrityError,
    GateError,
    ProposalNotPending,
    ReasonMismatch,
    UnknownProposal,
)
from slurm_fleetyield.gate.gatekeeper import AppliedDecision, Gatekeeper
from slurm_fleetyield.gate.proposal import ProposalStatus

from .conftest import Admins
from .helpers import NODE, PID, T0, make_proposal


@pytest.fixture
def gk(tmp_path: Path) -> Gatekeeper:
    g = Gatekeeper.open(tmp_path / "state")
    g.propose(make_proposal())
    yield g
    g.close()


def _kinds(gk: Gatekeeper) -> list[str]:
    return [e.kind for e in gk.audit.entries()]


def _rejected(gk: Gatekeeper, env: str | bytes, admins: Admins, now: float = T0 + 5, **kw: object) -> str:
    with pytest.raises(ApprovalRejected) as e:
        gk.submit(env, admins.keys, now, **kw)  # type: ignore[arg-type]
    last = list(gk.audit.entries())[-1]
    assert last.kind == "rejected" and last.data["reason"] == e.value.reason.value
    return e.value.reason.value


def test_open_lays_out_the_state_dir(tmp_path: Path) -> None:
    with Gatekeeper.open(tmp_path / "s") as g:
        g.propose(make_proposal())
    assert (tmp_path / "s" / "gate.db").exists() and (tmp_path / "s" / "audit.head").exists()


def test_propose_stores_and_audits(gk: Gatekeeper) -> None:
    assert gk.get(PID) == make_proposal()
    assert [p.id for p in gk.pending()] == [PID]
    first = next(gk.audit.entries())
    assert (first.kind, first.subject, first.data["node"]) == ("proposed", PID, NODE)
    assert first.data["evidence"].startswith("GPU 3")
    with pytest.raises(GateError, match="already exists"):
        gk.propose(make_proposal())


def test_approve_happy_path(gk: Gatekeeper, admins: Admins) -> None:
    env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0)
    applied = gk.submit(env, admins.keys, T0 + 5)
    assert isinstance(applied, AppliedDecision)
    p = gk.get(PID)
    assert p == applied.proposal
    assert (p.status, p.settled_at, p.settled_by) == (ProposalStatus.APPROVED, T0 + 5, "alice")
    assert gk.nonce_used(applied.decision.nonce)
    assert _kinds(gk) == ["proposed", "approved"]
    entry = list(gk.audit.entries())[-1]
    assert entry.seq == applied.audit_seq and entry.actor == "admin:alice"
    assert gk.verify_audit().ok


def test_deny_happy_path(gk: Gatekeeper, admins: Admins) -> None:
    env = sign_statement(admins.bob, gk.get(PID), "deny", now=T0, note="sensor is flaky")
    applied = gk.submit(env, admins.keys, T0 + 5)
    assert applied.proposal.status is ProposalStatus.DENIED and applied.proposal.settled_by == "bob"
    assert _kinds(gk)[-1] == "denied" and list(gk.audit.entries())[-1].data["note"] == "sensor is flaky"


def test_audit_keeps_the_signed_envelope_for_later_reverification(gk: Gatekeeper, admins: Admins) -> None:
    proposal = gk.get(PID)
    env = sign_statement(admins.alice, proposal, "approve", now=T0)
    gk.submit(env, admins.keys, T0 + 5)
    kept = list(gk.audit.entries())[-1].data["envelope"]
    assert kept == env
    assert verify_statement(kept, admins.keys, proposal, T0 + 5, set()).admin == "alice"


def test_same_envelope_twice_is_applied_once(gk: Gatekeeper, admins: Admins) -> None:
    env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0)
    gk.submit(env, admins.keys, T0 + 5)
    assert _rejected(gk, env, admins, T0 + 6) == "replayed"
    assert _kinds(gk) == ["proposed", "approved", "rejected"]
    assert gk.get(PID).settled_at == T0 + 5


def test_nonce_survives_a_restart(tmp_path: Path, admins: Admins) -> None:
    with Gatekeeper.open(tmp_path) as g:
        g.propose(make_proposal())
        env = sign_statement(admins.alice, g.get(PID), "approve", now=T0)
        nonce = g.submit(env, admins.keys, T0 + 5).decision.nonce
    with Gatekeeper.open(tmp_path) as g:
        assert g.nonce_used(nonce) and g.get(PID).status is ProposalStatus.APPROVED
        assert _rejected(g, env, admins, T0 + 6) == "replayed"
        assert g.verify_audit().ok


def test_second_admin_on_a_settled_proposal(gk: Gatekeeper, admins: Admins) -> None:
    gk.submit(sign_statement(admins.alice, gk.get(PID), "approve", now=T0), admins.keys, T0 + 5)
    late = sign_statement(admins.bob, make_proposal(), "deny", now=T0 + 1)
    assert _rejected(gk, late, admins, T0 + 6) == "already_settled"
    assert gk.get(PID).status is ProposalStatus.APPROVED


def test_unknown_proposal(gk: Gatekeeper, admins: Admins) -> None:
    other = make_proposal(id="p-ffffffffffff")
    env = sign_statement(admins.alice, other, "approve", now=T0)
    assert _rejected(gk, env, admins) == "unknown_proposal"


def test_expect_proposal_id_binds_the_envelope(gk: Gatekeeper, admins: Admins) -> None:
    env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0)
    assert _rejected(gk, env, admins, expect_proposal_id="p-eeeeeeeeeeee") == "wrong_proposal"
    assert (
        gk.submit(env, admins.keys, T0 + 5, expect_proposal_id=PID).proposal.status is ProposalStatus.APPROVED
    )


def _envelope(gk: Gatekeeper, admins: Admins, case: str) -> str | bytes:
    p = gk.get(PID)
    return {
        "garbage": lambda: b"\x00not an envelope",
        "mallory": lambda: sign_statement(admins.mallory, p, "approve", now=T0),
        "tampered": lambda: sign_statement(admins.alice, p, "approve", now=T0).replace('"approve"', '"deny"'),
        "expired": lambda: sign_statement(admins.alice, p, "approve", now=T0 - 1000, ttl_s=900),
        "future": lambda: sign_statement(admins.alice, p, "approve", now=T0 + 3000),
        "other node": lambda: sign_statement(admins.alice, make_proposal(node="gpu-099"), "approve", now=T0),
    }[case]()


@pytest.mark.parametrize(
    ("case", "reason"),
    [("expired", "expired"), ("future", "issued_in_future"), ("other node", "wrong_node")],
)
def test_every_authenticated_rejection_is_audited_with_its_reason(
    gk: Gatekeeper, admins: Admins, case: str, reason: str
) -> None:
    assert _rejected(gk, _envelope(gk, admins, case), admins) == reason
    last = list(gk.audit.entries())[-1]
    assert last.actor == "admin:alice" and last.subject == PID
    assert len(last.data["envelope_sha256"]) == 64 and "envelope" not in last.data
    assert gk.get(PID).status is ProposalStatus.PENDING  # nothing applied
    assert gk.verify_audit().ok


@pytest.mark.parametrize(
    ("case", "reason"),
    [("garbage", "malformed"), ("mallory", "unknown_key"), ("tampered", "bad_signature")],
)
def test_an_unauthenticated_envelope_writes_nothing(
    gk: Gatekeeper, admins: Admins, case: str, reason: str
) -> None:
    # issue #27 item 4: 2,303 unsigned POSTs appended 2,303 audit rows (an fsync each, under the gate lock)
    db = gk.db_path
    before = ([e.seq for e in gk.audit.entries()], db.read_bytes(), Path(f"{db}-wal").read_bytes())
    for _ in range(20):
        with pytest.raises(ApprovalRejected) as e:
            gk.submit(_envelope(gk, admins, case), admins.keys, T0 + 5)
        assert e.value.reason.value == reason and not e.value.authenticated
    after = ([e.seq for e in gk.audit.entries()], db.read_bytes(), Path(f"{db}-wal").read_bytes())
    assert after == before  # not a row, not a page: the refusal is the caller's to count
    assert gk.get(PID).status is ProposalStatus.PENDING and gk.verify_audit().ok


def test_failure_mid_apply_leaves_nothing(
    gk: Gatekeeper, admins: Admins, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0)
    nonce = parse_envelope(env).statement.nonce
    real_append = AuditLog.append

    def failing_append(self: AuditLog, **kw: object):  # type: ignore[no-untyped-def]
        if kw["kind"] == "approved":
            raise OSError("disk full")
        return real_append(self, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(AuditLog, "append", failing_append)
    with pytest.raises(OSError, match="disk full"):
        gk.submit(env, admins.keys, T0 + 5)
    assert gk.get(PID).status is ProposalStatus.PENDING and not gk.nonce_used(nonce)
    assert _kinds(gk) == ["proposed"]
    monkeypatch.undo()
    assert gk.submit(env, admins.keys, T0 + 6).proposal.status is ProposalStatus.APPROVED  # retry works


_CRASHING_CHILD = """
import os, sys
from slurm_fleetyield.gate.audit import AuditLog
from slurm_fleetyield.gate.gatekeeper import Gatekeeper
from slurm_fleetyield.gate.keys import load_authorized_keys
state, auth, env_path, now = sys.argv[1:5]
real = AuditLog.append
def dying_append(self, **kw):
    entry = real(self, **kw)  # the audit row is written inside the open transaction...
    if kw["kind"] == "approved":
        os._exit(17)  # ...and the process dies before COMMIT
    return entry
AuditLog.append = dying_append
Gatekeeper.open(state).submit(open(env_path).read(), load_authorized_keys(auth), float(now))
"""


def test_process_killed_before_commit_applies_nothing(tmp_path: Path, admins: Admins) -> None:
    state = tmp_path / "state"
    with Gatekeeper.open(state) as g:
        g.propose(make_proposal())
        env = sign_statement(admins.alice, g.get(PID), "approve", now=T0)
    env_path = tmp_path / "env.json"
    env_path.write_text(env)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _CRASHING_CHILD,
            str(state),
            str(admins.authorized_file),
            str(env_path),
            str(T0 + 5),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 17, child.stderr
    with Gatekeeper.open(state) as g:
        assert g.get(PID).status is ProposalStatus.PENDING
        assert not g.nonce_used(parse_envelope(env).statement.nonce)
        assert _kinds(g) == ["proposed"] and g.verify_audit().ok
        assert g.submit(env, admins.keys, T0 + 6).proposal.status is ProposalStatus.APPROVED


def test_concurrent_submissions_of_one_envelope_apply_once(tmp_path: Path, admins: Admins) -> None:
    with Gatekeeper.open(tmp_path) as g:
        g.propose(make_proposal())
        env = sign_statement(admins.alice, g.get(PID), "approve", now=T0)
    barrier = threading.Barrier(4)
    results: list[str] = []

    def submit() -> None:
        with Gatekeeper.open(tmp_path) as mine:
            barrier.wait()
            try:
                mine.submit(env, admins.keys, T0 + 5)
                results.append("applied")
            except ApprovalRejected as e:
                results.append(e.reason.value)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["applied", "replayed", "replayed", "replayed"]
    with Gatekeeper.open(tmp_path) as g:
        assert _kinds(g).count("approved") == 1 and g.verify_audit().ok


def test_new_proposal_supersedes_the_pending_one_for_the_node(gk: Gatekeeper, admins: Admins) -> None:
    old_env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0)
    newer = make_proposal(id="p-111111111111", now=T0 + 60, risk=0.95)
    gk.propose(newer)
    old = gk.get(PID)
    assert (old.status, old.settled_by) == (ProposalStatus.SUPERSEDED, "fleetyield")
    assert [p.id for p in gk.pending()] == ["p-111111111111"]
    assert _kinds(gk) == ["proposed", "superseded", "proposed"]
    assert _rejected(gk, old_env, admins, T0 + 61) == "already_settled"
    gk.propose(make_proposal(id="p-222222222222", node="gpu-018", now=T0 + 61))  # other node: both pending
    assert len(gk.pending()) == 2


def test_settle_by_admin(gk: Gatekeeper) -> None:
    p = gk.settle_by_admin(PID, f"drained by hand, see #{PID}", T0 + 30, actor="root")
    assert (p.status, p.settled_at, p.settled_by) == (ProposalStatus.SETTLED_BY_ADMIN, T0 + 30, "root")
    last = list(gk.audit.entries())[-1]
    assert (last.kind, last.actor, last.subject) == ("settled_by_admin", "root", PID)
    assert PID in last.data["reason"]
    with pytest.raises(ProposalNotPending):
        gk.settle_by_admin(PID, f"#{PID}", T0 + 31)


def test_settle_by_admin_needs_the_reason_to_name_the_proposal(gk: Gatekeeper) -> None:
    with pytest.raises(ReasonMismatch):
        gk.settle_by_admin(PID, "drained for maintenance", T0 + 30)
    with pytest.raises(ReasonMismatch):
        gk.settle_by_admin(PID, "#p-ffffffffffff", T0 + 30)
    with pytest.raises(UnknownProposal):
        gk.settle_by_admin("p-ffffffffffff", "#p-ffffffffffff", T0 + 30)
    assert gk.get(PID).status is ProposalStatus.PENDING and _kinds(gk) == ["proposed"]


def test_approval_after_manual_settlement_is_already_settled(gk: Gatekeeper, admins: Admins) -> None:
    env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0)
    gk.settle_by_admin(PID, f"#{PID}", T0 + 1)
    assert _rejected(gk, env, admins) == "already_settled"


def test_expire(gk: Gatekeeper, admins: Admins) -> None:
    env = sign_statement(admins.alice, gk.get(PID), "approve", now=T0 + 3500)
    assert gk.expire(T0 + 3599) == []
    assert _rejected(gk, env, admins, T0 + 3600) == "proposal_expired"  # deadline passed, not yet swept
    (expired,) = gk.expire(T0 + 3600)
    assert (expired.id, expired.status, expired.settled_at) == (PID, ProposalStatus.EXPIRED, T0 + 3600)
    assert gk.get(PID) == expired and gk.expire(T0 + 9999) == []
    assert _rejected(gk, env, admins, T0 + 3601) == "already_settled"
    assert "expired" in _kinds(gk)


def test_truncated_audit_log_blocks_the_gate(gk: Gatekeeper, admins: Admins) -> None:
    import sqlite3

    gk.submit(sign_statement(admins.alice, gk.get(PID), "deny", now=T0), admins.keys, T0 + 1)  # seq 2
    gk.propose(make_proposal(id="p-333333333333", node="gpu-018", now=T0 + 2))  # seq 3
    attacker = sqlite3.connect(str(gk.db_path), isolation_level=None)
    attacker.execute("DROP TRIGGER audit_no_delete")
    attacker.execute("DELETE FROM audit WHERE seq = 3")
    attacker.close()
    env = sign_statement(admins.alice, gk.get("p-333333333333"), "approve", now=T0)
    with pytest.raises(AuditIntegrityError):
        gk.submit(env, admins.keys, T0 + 5)
    assert gk.get("p-333333333333").status is ProposalStatus.PENDING  # fails closed
    r = gk.verify_audit()
    assert (r.ok, r.code, r.first_bad_seq) == (False, "truncated", 3)


def test_mixed_workflow_audit_verifies_and_exports(tmp_path: Path, admins: Admins) -> None:
    import io

    from slurm_fleetyield.gate.audit import read_head, verify_jsonl

    with Gatekeeper.open(tmp_path) as g:
        for i, node in enumerate(["n1", "n2", "n3", "n4"]):
            g.propose(make_proposal(id=f"p-{i:012x}", node=node, now=T0 + i))
        g.submit(
            sign_statement(admins.alice, g.get("p-000000000000"), "approve", now=T0), admins.keys, T0 + 10
        )
        g.submit(sign_statement(admins.bob, g.get("p-000000000001"), "deny", now=T0), admins.keys, T0 + 11)
        with pytest.raises(ApprovalRejected):
            g.submit("{}", admins.keys, T0 + 12)  # unauthenticated: not audited
        with pytest.raises(ApprovalRejected):  # authentic but too late: audited
            g.submit(
                sign_statement(admins.alice, g.get("p-000000000001"), "approve", now=T0), admins.keys, T0 + 12
            )
        g.settle_by_admin("p-000000000002", "manual #p-000000000002", T0 + 13)
        g.expire(T0 + 3603.5)
        out = io.StringIO()
        n = g.audit.export_jsonl(out)
        assert n == 9 and g.verify_audit().ok
        assert verify_jsonl(out.getvalue().splitlines(), read_head(tmp_path / "audit.head")).ok
        statuses = {p.id: p.status.value for p in g.proposals()}
        assert statuses == {
            "p-000000000000": "approved",
            "p-000000000001": "denied",
            "p-000000000002": "settled_by_admin",
            "p-000000000003": "expired",
        }
        assert [p.id for p in g.proposals(ProposalStatus.DENIED)] == ["p-000000000001"]
        assert [p.id for p in g.proposals(node="n4")] == ["p-000000000003"]
        data = json.loads(out.getvalue().splitlines()[4])
        assert data["kind"] == "approved"


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    with Gatekeeper.open(tmp_path) as g:
        g.conn.execute("PRAGMA user_version = 99")
    with pytest.raises(GateError, match="schema version 99"):
        Gatekeeper.open(tmp_path)


def test_withdraw_closes_a_pending_proposal_once_and_is_audited(tmp_path):
    from slurm_fleetyield.gate import Gatekeeper, Proposal, ProposalStatus

    with Gatekeeper.open(tmp_path) as gk:
        p = gk.propose(Proposal.new(node="n1", gpus=(3,), risk=0.7, evidence="e", now=1000.0))
        closed = gk.withdraw(p.id, "risk fell below yellow", 1100.0)
        assert closed is not None and closed.status is ProposalStatus.WITHDRAWN
        assert gk.get(p.id).status is ProposalStatus.WITHDRAWN
        assert gk.withdraw(p.id, "again", 1200.0) is None  # final: nothing changes
        kinds = [e.kind for e in gk.audit.entries()]
        assert kinds.count("withdrawn") == 1
        assert gk.verify_audit().ok


def test_an_empty_gate_db_is_refused_not_started_over(tmp_path: Path) -> None:
    # issue #27 item 8: SQLite takes a 0-byte file for a new database; the gate's nonces and audit chain
    # would silently restart from nothing
    state = tmp_path / "state"
    state.mkdir()
    (state / "gate.db").write_bytes(b"")
    with pytest.raises(GateError, match="empty"):
        Gatekeeper.open(state)
    assert (state / "gate.db").read_bytes() == b""
