"""The gate's state: proposals, consumed nonces and the audit log, in one database.

SQLite (``<state_dir>/gate.db``, the default: one controller), or the PostgreSQL database of ``[store] url``
(two controllers: a proposal raised by one can be approved on, and executed by, the other after a
takeover). On PostgreSQL every write transaction holds the gate's advisory lock (``audit.GATE_LOCK``), the
counterpart of SQLite's ``BEGIN IMMEDIATE`` below, so everything said here holds on both.

Fencing (two controllers): with ``lease`` (a callable giving this controller's (holder, token), None when
it does not lead) the writes the core drives (``propose``, ``withdraw``, ``expire``) first check the lease
row under its lock in the same transaction, as ``Store.commit_tick`` does: a deposed leader records
nothing. An admin's decision (``submit``) is not fenced: it is the admin's act, recorded wherever it
arrives, and only the leader's executor (fenced itself) turns an approval into a drain.

Input: proposals from the core, envelopes from admins, manual drain reasons seen in Slurm, the clock. Output:
proposals moved to their final status exactly once, each move (and each authentic envelope refused) recorded
in the hash-chained audit log in the same transaction. An envelope that fails authentication writes nothing.

Atomicity: ``submit`` takes SQLite's write lock (``BEGIN IMMEDIATE``), re-reads the proposal and the nonce
table under it, and commits the nonce, the status change and the audit entry together. A crash before
COMMIT leaves none of them; after COMMIT, all of them (WAL, ``synchronous=FULL``). Two processes submitting
the same envelope serialize on the lock: the second sees the nonce and is rejected as ``replayed``.
The audit head file is rewritten after the commit; a crash in between leaves it one step behind, which
verification accepts (the head proves "at least up to here").

Layout of a state directory (``Gatekeeper.open``): ``gate.db`` (+ ``-wal``/``-shm``) and ``audit.head``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from slurm_fleetyield.adapters import store_pg
from slurm_fleetyield.adapters.sqlite_check import quick_check
from slurm_fleetyield.gate.approvals import (
    DEFAULT_CLOCK_SKEW_S,
    MAX_TTL_S,
    Action,
    AdminKey,
    ApprovalRejected,
    VerifiedDecision,
    authenticate,
    check_decision,
    envelope_digest,
    parse_envelope,
)
from slurm_fleetyield.gate.audit import (
    PG_SCHEMA,
    AuditLog,
    AuditReport,
    connect,
    head_filename,
    immediate_transaction,
)
from slurm_fleetyield.gate.errors import (
    GateError,
    ProposalNotPending,
    ReasonMismatch,
    RejectReason,
    UnknownProposal,
)
from slurm_fleetyield.gate.proposal import Proposal, ProposalStatus, proposal_ids_in_reason

DB_FILENAME = "gate.db"
SCHEMA_VERSION = 2
"""SQLite ``user_version``. 1 -> 2: the head checkpoint row ``audit_head`` (seeded from the chain's tail)."""
SYSTEM_ACTOR = "fleetyield"

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS proposals (
        id            TEXT PRIMARY KEY,
        node          TEXT NOT NULL,
        gpus          TEXT NOT NULL,
        risk          REAL NOT NULL,
        evidence      TEXT NOT NULL,
        affected_jobs TEXT NOT NULL,
        created_at    REAL NOT NULL,
        expires_at    REAL NOT NULL,
        status        TEXT NOT NULL,
        settled_at    REAL,
        settled_by    TEXT
    )""",
    "CREATE INDEX IF NOT EXISTS proposals_status ON proposals (status, node)",
    """CREATE TABLE IF NOT EXISTS nonces (
        nonce       TEXT PRIMARY KEY,
        key_id      TEXT NOT NULL,
        proposal_id TEXT NOT NULL,
        used_at     REAL NOT NULL
    )""",
)
PG_VERSION_TABLE = "gate_schema_version"
PG_SCHEMA_VERSION = 1
PG_MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, tuple(store_pg.ddl(stmt) for stmt in _SCHEMA) + PG_SCHEMA),
)
"""The gate's tables in the PostgreSQL store database, versioned in their own ``gate_schema_version`` row
(``store_pg.migrate``). 1: proposals, nonces, the audit chain with its triggers, the head row."""
Lease = Callable[[], "tuple[str, int] | None"]
_COLUMNS = (
    "id, node, gpus, risk, evidence, affected_jobs, created_at, expires_at, status, settled_at, settled_by"
)


@dataclass(frozen=True, slots=True)
class AppliedDecision:
    """A decision that took effect: the verified statement, the proposal as it is now, and its audit seq."""

    decision: VerifiedDecision
    proposal: Proposal
    audit_seq: int


class _NonceView:
    """``nonce in view`` asks the database, inside the caller's transaction."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __contains__(self, nonce: object) -> bool:
        return self._conn.execute("SELECT 1 FROM nonces WHERE nonce = ?", (nonce,)).fetchone() is not None


def _unique_violation(conn: Any) -> tuple[type[BaseException], ...]:
    return store_pg.unique_violation() if store_pg.is_pg(conn) else ()


def _row_to_proposal(row: tuple[Any, ...]) -> Proposal:
    pid, node, gpus, risk, evidence, jobs, created, expires, status, settled_at, settled_by = row
    return Proposal(
        id=pid,
        node=node,
        gpus=tuple(json.loads(gpus)),
        risk=risk,
        evidence=evidence,
        affected_jobs=tuple(json.loads(jobs)),
        created_at=created,
        expires_at=expires,
        status=ProposalStatus(status),
        settled_at=settled_at,
        settled_by=settled_by,
    )


class Gatekeeper:
    """Proposals, nonces and audit log over one database (an SQLite path or a PostgreSQL URL). Not
    thread-safe: one per thread/process."""

    def __init__(
        self,
        db_path: str | Path,
        head_path: str | Path | None = None,
        *,
        clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
        max_ttl_s: float = MAX_TTL_S,
        lease: Lease | None = None,
    ) -> None:
        self.clock_skew_s = clock_skew_s
        self.max_ttl_s = max_ttl_s
        self.lease = lease
        if store_pg.is_url(str(db_path)):
            self._open_pg(str(db_path), head_path)
            return
        self.db_path = Path(db_path)
        if (
            self.db_path.exists()
            and self.db_path.stat().st_size == 0
            and not Path(f"{self.db_path}-wal").exists()
        ):
            raise GateError(
                f"{self.db_path}: the gate database is an empty file (0 bytes); refusing to start over its "
                "proposals, nonces and audit chain. Restore it from backup, or move it away to start fresh"
            )
        try:
            self.conn = connect(self.db_path)
        except sqlite3.DatabaseError as exc:
            raise GateError(f"{self.db_path}: not a usable gate database ({exc})") from None
        try:
            quick_check(self.conn)  # a damaged page anywhere, before anything is read from or chained on it
            self.audit = AuditLog(self.conn, head_path)
            self._init_schema()
        except sqlite3.DatabaseError as exc:  # not a database, a damaged header, schema or data page
            self.conn.close()
            raise GateError(
                f"{self.db_path}: not a usable gate database ({exc}); restore it from backup, never "
                "delete it (its nonces and audit chain are the record of every decision)"
            ) from None
        except BaseException:
            self.conn.close()
            raise

    def _open_pg(self, url: str, head_path: str | Path | None) -> None:
        self.db_path = Path(store_pg.redact(url))  # for messages only
        try:
            self.conn = connect(url)
        except store_pg.connection_errors() as exc:
            raise GateError(f"{self.db_path}: cannot open the gate's PostgreSQL database: {exc}") from None
        try:
            store_pg.migrate(self.conn, PG_MIGRATIONS, PG_SCHEMA_VERSION, table=PG_VERSION_TABLE)
            self.audit = AuditLog(self.conn, head_path)
        except ValueError as exc:
            self.conn.close()
            raise GateError(f"{store_pg.redact(url)}: gate {exc}") from None
        except BaseException:
            self.conn.close()
            raise

    def _init_schema(self) -> None:
        """SQLite: the tables, then the migrations from ``user_version`` (the audit tables exist already)."""
        with immediate_transaction(self.conn):
            for stmt in _SCHEMA:
                self.conn.execute(stmt)
            (version,) = self.conn.execute("PRAGMA user_version").fetchone()
            if version > SCHEMA_VERSION:
                raise GateError(
                    f"{self.db_path}: schema version {version}, this FleetYield knows {SCHEMA_VERSION}"
                )
            if version < 2:  # 0 (new) or 1: the head row, seeded from the tail (AuditLog made the table)
                self.conn.execute(
                    "INSERT OR IGNORE INTO audit_head (id, seq, hash)"
                    " SELECT 1, seq, hash FROM audit ORDER BY seq DESC LIMIT 1"
                )
            self.conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _fence(self) -> None:
        """Inside a write transaction: refuse (``GateError``, nothing written) unless ``lease`` still
        holds, checked under the lease row's lock."""
        if self.lease is None:
            return
        held = self.lease()
        if held is None:
            raise GateError("fenced: this controller does not hold the leader lease; nothing recorded")
        row = self.conn.execute(
            "SELECT 1 FROM leader_lease WHERE id = 1 AND holder = ? AND token = ? FOR UPDATE", held
        ).fetchone()
        if row is None:
            raise GateError(f"fenced: lease token {held[1]} of {held[0]} is stale; nothing recorded")

    @classmethod
    def open(cls, state_dir: str | Path, *, url: str | None = None, **kwargs: Any) -> Gatekeeper:
        """``<state_dir>/gate.db`` with its head checkpoint ``<state_dir>/audit.head``; with ``url`` (a
        PostgreSQL store) the database is that one and ``state_dir`` holds only this host's head file for
        that database (``head_filename``)."""
        d = Path(state_dir)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return cls(url or d / DB_FILENAME, d / head_filename(url), **kwargs)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Gatekeeper:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- reads -------------------------------------------------------------------------------------------

    def get(self, proposal_id: str) -> Proposal | None:
        row = self.conn.execute(f"SELECT {_COLUMNS} FROM proposals WHERE id = ?", (proposal_id,)).fetchone()
        return _row_to_proposal(row) if row else None

    def proposals(self, status: ProposalStatus | None = None, node: str | None = None) -> list[Proposal]:
        """Proposals, oldest first, optionally filtered by status and node."""
        where, args = [], []
        if status is not None:
            where.append("status = ?")
            args.append(ProposalStatus(status).value)
        if node is not None:
            where.append("node = ?")
            args.append(node)
        sql = f"SELECT {_COLUMNS} FROM proposals"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [_row_to_proposal(r) for r in self.conn.execute(sql + " ORDER BY created_at, id", args)]

    def pending(self) -> list[Proposal]:
        return self.proposals(ProposalStatus.PENDING)

    def nonce_used(self, nonce: str) -> bool:
        return nonce in _NonceView(self.conn)

    def verify_audit(self) -> AuditReport:
        """Verify the audit chain against the head checkpoint file (``fleetyield audit verify``)."""
        return self.audit.verify()

    # ---- writes ------------------------------------------------------------------------------------------

    def _set_status(self, p: Proposal, status: ProposalStatus, now: float, by: str) -> Proposal:
        cur = self.conn.execute(
            "UPDATE proposals SET status = ?, settled_at = ?, settled_by = ? WHERE id = ? AND status = ?",
            (status.value, now, by, p.id, ProposalStatus.PENDING.value),
        )
        if cur.rowcount != 1:  # guarded by the write lock; this is a bug, not a race
            raise ProposalNotPending(p.id, p.status.value)
        return p.settled(status, now, by)

    def propose(self, proposal: Proposal, *, actor: str = SYSTEM_ACTOR) -> Proposal:
        """Store a new pending proposal (its ``created_at`` is the time). Older pending proposals for the
        same node become ``superseded``: an admin must decide on the current evidence."""
        if proposal.status is not ProposalStatus.PENDING:
            raise ValueError("only a pending proposal can be proposed")
        now = proposal.created_at
        duplicate: tuple[type[BaseException], ...] = (sqlite3.IntegrityError, *_unique_violation(self.conn))
        with immediate_transaction(self.conn):
            self._fence()
            for old in self.proposals(ProposalStatus.PENDING, proposal.node):
                self._set_status(old, ProposalStatus.SUPERSEDED, now, actor)
                self.audit.append(
                    time=now, actor=actor, kind="superseded", subject=old.id, data={"by": proposal.id}
                )
            try:
                self.conn.execute(
                    f"INSERT INTO proposals ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        proposal.id,
                        proposal.node,
                        json.dumps(list(proposal.gpus)),
                        proposal.risk,
                        proposal.evidence,
                        json.dumps(list(proposal.affected_jobs)),
                        proposal.created_at,
                        proposal.expires_at,
                        proposal.status.value,
                        None,
                        None,
                    ),
                )
            except duplicate as e:
                raise GateError(f"proposal id {proposal.id} already exists") from e
            self.audit.append(
                time=now,
                actor=actor,
                kind="proposed",
                subject=proposal.id,
                data={
                    "node": proposal.node,
                    "gpus": list(proposal.gpus),
                    "risk": proposal.risk,
                    "affected_jobs": list(proposal.affected_jobs),
                    "expires_at": proposal.expires_at,
                    "evidence": proposal.evidence,
                },
            )
        self.audit.publish_head()
        return proposal

    def submit(
        self,
        envelope_text: str | bytes,
        authorized_keys: Mapping[str, AdminKey],
        now: float,
        *,
        expect_proposal_id: str | None = None,
    ) -> AppliedDecision:
        """Verify an admin's envelope and apply it exactly once (gate side of ``fleetyield approve/deny``).

        On success the proposal becomes approved/denied, the nonce is consumed and an ``approved``/``denied``
        audit entry (holding the envelope, so the signature can be re-checked later) is appended, all in one
        transaction. An authentic envelope that is refused commits a ``rejected`` audit entry with the reason
        code; one that is not authentic (malformed, unknown key, bad signature: anyone can send those) writes
        nothing and takes no lock, so a flood of forgeries cannot grow the log or stall the gate. Either way
        ``ApprovalRejected`` is raised (``.authenticated`` tells which). ``expect_proposal_id`` binds the
        envelope to the id the caller meant.
        """
        digest = envelope_digest(envelope_text)
        env = parse_envelope(envelope_text)  # ApprovalRejected(malformed): nothing written
        st = env.statement
        admin = authenticate(env, authorized_keys)  # unknown_key / bad_signature: nothing written
        rejected: ApprovalRejected | None = None
        applied: AppliedDecision | None = None
        with immediate_transaction(self.conn):
            subject, claimed_key, action, nonce = st.proposal_id, st.key_id, st.action, st.nonce
            try:
                if expect_proposal_id is not None and st.proposal_id != expect_proposal_id:
                    raise ApprovalRejected(
                        RejectReason.WRONG_PROPOSAL, f"signed for {st.proposal_id}, not {expect_proposal_id}"
                    )
                proposal = self.get(st.proposal_id)
                if proposal is None:
                    raise ApprovalRejected(RejectReason.UNKNOWN_PROPOSAL, f"no proposal {st.proposal_id}")
                decision = check_decision(
                    st,
                    admin,
                    proposal,
                    now,
                    _NonceView(self.conn),
                    envelope_sha256=digest,
                    clock_skew_s=self.clock_skew_s,
                    max_ttl_s=self.max_ttl_s,
                )
            except ApprovalRejected as r:
                rejected = r
                self.audit.append(
                    time=now,
                    actor=f"admin:{admin.name}",
                    kind="rejected",
                    subject=subject,
                    data={
                        "reason": r.reason.value,
                        "message": r.message[:500],
                        "key_id": claimed_key,
                        "action": action,
                        "nonce": nonce,
                        "envelope_sha256": digest,
                    },
                )
            else:
                applied = self._apply(decision, proposal, envelope_text, now)
        self.audit.publish_head()
        if rejected is not None:
            raise rejected
        assert applied is not None
        return applied

    def _apply(
        self, decision: VerifiedDecision, proposal: Proposal, envelope_text: str | bytes, now: float
    ) -> AppliedDecision:
        """Consume the nonce, settle the proposal, audit it. Runs inside ``submit``'s transaction."""
        self.conn.execute(
            "INSERT INTO nonces (nonce, key_id, proposal_id, used_at) VALUES (?, ?, ?, ?)",
            (decision.nonce, decision.key_id, decision.proposal_id, now),
        )
        status = ProposalStatus.APPROVED if decision.action is Action.APPROVE else ProposalStatus.DENIED
        updated = self._set_status(proposal, status, now, decision.admin)
        text = envelope_text.decode("utf-8") if isinstance(envelope_text, bytes) else envelope_text
        entry = self.audit.append(
            time=now,
            actor=f"admin:{decision.admin}",
            kind=status.value,
            subject=decision.proposal_id,
            data={
                "node": decision.node,
                "key_id": decision.key_id,
                "nonce": decision.nonce,
                "issued_at": decision.issued_at,
                "expires_at": decision.expires_at,
                "note": decision.note,
                "envelope": text.strip(),  # kept whole so the signature can be re-verified from the log
                "envelope_sha256": decision.envelope_sha256,
            },
        )
        return AppliedDecision(decision=decision, proposal=updated, audit_seq=entry.seq)

    def settle_by_admin(
        self, proposal_id: str, reason_text: str, now: float, *, actor: str = "slurm-admin"
    ) -> Proposal:
        """An admin drained the node by hand, the Slurm reason naming ``#<proposal_id>``: close the proposal.

        Raises ``ReasonMismatch`` if the reason does not name the proposal, ``UnknownProposal``,
        ``ProposalNotPending``. ``actor`` is who drained (Slurm's reason user, if known).
        """
        if proposal_id not in proposal_ids_in_reason(reason_text):
            raise ReasonMismatch(f"drain reason {reason_text!r} does not name #{proposal_id}")
        with immediate_transaction(self.conn):
            p = self.get(proposal_id)
            if p is None:
                raise UnknownProposal(proposal_id)
            if p.status is not ProposalStatus.PENDING:
                raise ProposalNotPending(proposal_id, p.status.value)
            updated = self._set_status(p, ProposalStatus.SETTLED_BY_ADMIN, now, actor)
            self.audit.append(
                time=now,
                actor=actor,
                kind=ProposalStatus.SETTLED_BY_ADMIN.value,
                subject=proposal_id,
                data={"node": p.node, "reason": reason_text[:1000]},
            )
        self.audit.publish_head()
        return updated

    def withdraw(
        self, proposal_id: str, reason: str, now: float, *, actor: str = SYSTEM_ACTOR
    ) -> Proposal | None:
        """Close a pending proposal without a decision (the core's ``WithdrawProposal``), audited with the
        core's reason. Returns the closed proposal, or None when it is unknown or no longer pending (an
        admin decided first: that decision stands)."""
        with immediate_transaction(self.conn):
            self._fence()
            p = self.get(proposal_id)
            if p is None or p.status is not ProposalStatus.PENDING:
                return None
            updated = self._set_status(p, ProposalStatus.WITHDRAWN, now, actor)
            self.audit.append(
                time=now,
                actor=actor,
                kind=ProposalStatus.WITHDRAWN.value,
                subject=proposal_id,
                data={"node": p.node, "reason": reason[:1000]},
            )
        self.audit.publish_head()
        return updated

    def expire(self, now: float) -> list[Proposal]:
        """Close every pending proposal whose deadline has passed. Returns them, now ``expired``."""
        out: list[Proposal] = []
        with immediate_transaction(self.conn):
            self._fence()
            rows = self.conn.execute(
                f"SELECT {_COLUMNS} FROM proposals WHERE status = ? AND expires_at <= ?"
                " ORDER BY created_at, id",
                (ProposalStatus.PENDING.value, now),
            ).fetchall()
            for row in rows:
                p = _row_to_proposal(row)
                out.append(self._set_status(p, ProposalStatus.EXPIRED, now, SYSTEM_ACTOR))
                self.audit.append(
                    time=now,
                    actor=SYSTEM_ACTOR,
                    kind=ProposalStatus.EXPIRED.value,
                    subject=p.id,
                    data={"node": p.node, "expires_at": p.expires_at},
                )
        if out:
            self.audit.publish_head()
        return out
