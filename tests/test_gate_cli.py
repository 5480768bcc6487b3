"""The human gate end to end: ``fleetyield keygen/pending/approve/deny/submit-approval/audit verify`` through
click's CliRunner against the REAL approval listener (``IngestServer`` ``POST /v1/approvals``) and a real
``Gatekeeper``. Every rejection must change nothing but the audit log, which records it with its code when
the envelope is authentic (an unauthenticated one writes nothing and is counted).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from rig import approval_listener, damage_btree_page

from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.cli import main
from slurm_fleetyield.gate import Gatekeeper, Proposal, ProposalStatus, keygen, sign_statement
from slurm_fleetyield.gate.approvals import make_statement, seal
from slurm_fleetyield.gate.keys import load_private_key

PID = "p-0123456789ab"
PID2 = "p-ba9876543210"


@pytest.fixture
def rig(tmp_path: Path):
    with _rig(tmp_path) as r:
        yield r


@contextlib.contextmanager
def _rig(tmp_path: Path, web_config: Path | None = None):
    """Two pending proposals, alice's key authorized, the real approval listener (served with
    ``web_config`` when given) and the fy.toml the CLI reads."""
    keys = tmp_path / "keys"
    alice, alice_pub = keygen("alice", keys)
    mallory, _ = keygen("mallory", keys)
    auth = tmp_path / "authorized_keys"
    auth.write_text(alice_pub.read_text())
    auth.chmod(0o644)
    gate_dir = tmp_path / "gate"
    now = time.time()
    with Gatekeeper.open(gate_dir) as gk:
        for pid, node in ((PID, "gpu-01"), (PID2, "gpu-02")):
            gk.propose(
                Proposal.new(
                    id=pid,
                    node=node,
                    gpus=(3,),
                    risk=0.8,
                    evidence=f"{node} GPU 3: row remap pending; risk 0.80",
                    affected_jobs=(101,),
                    now=now,
                    ttl_s=3600,
                )
            )
    store = Store(tmp_path / "fy.db")
    wake = threading.Event()
    unauthenticated: list[tuple[str, str]] = []
    server, cfg = approval_listener(
        tmp_path,
        store,
        gate_dir,
        auth,
        b"secret-0123456789abcdef",
        wake,
        on_unauthenticated=lambda endpoint, reason: unauthenticated.append((endpoint, reason)),
        web_config=web_config,
    )

    class Rig:
        pass

    r = Rig()
    r.tmp, r.alice, r.mallory, r.auth, r.gate_dir, r.cfg = tmp_path, alice, mallory, auth, gate_dir, cfg
    r.server, r.wake, r.store, r.unauthenticated = server, wake, store, unauthenticated
    scheme, host = ("http", "127.0.0.1") if web_config is None else ("https", "localhost")
    r.url = f"{scheme}://{host}:{server.port}/v1/approvals"
    try:
        yield r
    finally:
        server.stop()
        store.close()


def gate_state(gate_dir: Path) -> tuple[dict[str, str], list[tuple[str, str, dict]]]:
    with Gatekeeper.open(gate_dir) as gk:
        statuses = {p.id: p.status.value for p in gk.proposals()}
        entries = [(e.kind, e.subject, e.data) for e in gk.audit.entries()]
    return statuses, entries


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


class _Ref:
    def __init__(self, pid: str, node: str) -> None:
        self.id, self.node = pid, node


def test_keygen_pending_approve_and_audit(rig) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["keygen", "carol", "--dir", str(rig.tmp / "carol"), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert Path(doc["private_key"]).stat().st_mode & 0o777 == 0o600
    assert doc["authorized_keys_line"].startswith("fleetyield-ed25519 ")
    again = runner.invoke(main, ["keygen", "carol", "--dir", str(rig.tmp / "carol")])
    assert again.exit_code != 0 and "refusing to overwrite" in again.output

    out = runner.invoke(main, ["pending", "--config", str(rig.cfg), "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [p["id"] for p in rows] == [PID, PID2] and rows[0]["affected_jobs"] == [101]
    text = runner.invoke(main, ["pending", "--config", str(rig.cfg)]).output
    assert "row remap pending" in text and f"fleetyield approve {PID}" in text

    out = runner.invoke(
        main,
        ["approve", PID, "--key", str(rig.alice), "--note", "ticket 42", "--config", str(rig.cfg), "--json"],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["http_status"] == 200 and doc["status"] == "approved" and doc["admin"] == "alice"
    assert rig.wake.is_set()  # the daemon ticks at once: the drain follows within a second
    statuses, entries = gate_state(rig.gate_dir)
    assert statuses[PID] == "approved" and statuses[PID2] == "pending"
    assert entries[-1][0] == "approved" and entries[-1][2]["note"] == "ticket 42"

    out = runner.invoke(main, ["audit", "verify", "--config", str(rig.cfg), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["ok"] is True

    # deny through a file in transit: --out, then submit-approval
    env_file = rig.tmp / "deny.json"
    out = runner.invoke(
        main, ["deny", PID2, "--key", str(rig.alice), "--config", str(rig.cfg), "--out", str(env_file)]
    )
    assert out.exit_code == 0 and env_file.stat().st_mode & 0o777 == 0o600
    assert gate_state(rig.gate_dir)[0][PID2] == "pending"  # nothing submitted yet
    out = runner.invoke(main, ["submit-approval", str(env_file), "--submit", rig.url])
    assert out.exit_code == 0, out.output
    assert gate_state(rig.gate_dir)[0][PID2] == "denied"
    # the same envelope again: replayed, exit 1, nothing changes
    out = runner.invoke(main, ["submit-approval", str(env_file), "--submit", rig.url, "--json"])
    assert out.exit_code == 1 and json.loads(out.output)["error"] == "replayed"


def _envelope(rig, key: Path, pid: str, node: str, **kw) -> str:
    return sign_statement(key, _Ref(pid, node), kw.pop("action", "approve"), **kw)


def _tamper(envelope: str, **fields) -> str:
    doc = json.loads(envelope)
    doc["statement"].update(fields)
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@pytest.mark.parametrize(
    ("case", "code", "status"),
    [
        ("unknown_key", "unknown_key", 403),
        ("bad_signature", "bad_signature", 403),
        ("tampered_note", "bad_signature", 403),
        ("expired", "expired", 409),
        ("other_node", "wrong_node", 409),
        ("unknown_proposal", "unknown_proposal", 404),
        ("malformed", "malformed", 400),
    ],
)
def test_every_rejection_changes_nothing_and_is_audited(rig, case: str, code: str, status: int) -> None:
    before, audit_before = gate_state(rig.gate_dir)
    if case == "unknown_key":
        body = _envelope(rig, rig.mallory, PID, "gpu-01")
    elif case == "bad_signature":
        good = json.loads(_envelope(rig, rig.alice, PID, "gpu-01"))
        other = json.loads(_envelope(rig, rig.alice, PID2, "gpu-02"))
        good["signature"] = other["signature"]
        body = json.dumps(good, sort_keys=True, separators=(",", ":"))
    elif case == "tampered_note":
        body = _tamper(_envelope(rig, rig.alice, PID, "gpu-01"), note="approved by the CTO")
    elif case == "expired":
        key = load_private_key(rig.alice)
        from slurm_fleetyield.gate.keys import key_id_of

        st = make_statement(
            _Ref(PID, "gpu-01"), "approve", key_id_of(key.public_key()), time.time() - 7200, 600
        )
        body = seal(st, key)
    elif case == "other_node":
        body = _envelope(rig, rig.alice, PID, "gpu-02")
    elif case == "unknown_proposal":
        body = _envelope(rig, rig.alice, "p-ffffffffffff", "gpu-01")
    else:
        body = "{not json"
    got_status, doc = post(rig.url, body.encode())
    assert (got_status, doc["error"]) == (status, code), doc
    after, audit_after = gate_state(rig.gate_dir)
    assert after == before  # nothing changed ...
    if code in ("unknown_key", "bad_signature", "malformed"):
        # ... not even the audit log: a request that fails authentication writes no durable row, it is
        # counted (fleetyield_unauthenticated_requests) instead
        assert audit_after == audit_before
        assert rig.unauthenticated == [("approvals", code)]
    else:
        assert len(audit_after) == len(audit_before) + 1  # ... except the audit log, naming the reason
        kind, _subject, data = audit_after[-1]
        assert kind == "rejected" and data["reason"] == code
        assert rig.unauthenticated == []
    assert not rig.wake.is_set()


def test_a_flood_of_unsigned_approvals_writes_no_row(rig) -> None:
    # issue #27 item 4: unsigned POST /v1/approvals appended 2,303 audit rows in 20 s
    db = rig.gate_dir / "gate.db"
    before = (gate_state(rig.gate_dir), db.stat().st_size, (rig.gate_dir / "audit.head").read_bytes())
    wal = Path(f"{db}-wal")
    wal_before = wal.read_bytes() if wal.exists() else b""
    forged = _tamper(_envelope(rig, rig.alice, PID, "gpu-01"), note="forged")
    unknown = _envelope(rig, rig.mallory, PID, "gpu-01").encode()
    for body in [b"{}", b"\xff\xfe", forged.encode(), unknown] * 25:
        assert post(rig.url, body)[0] in (400, 403)
    assert (gate_state(rig.gate_dir), db.stat().st_size, (rig.gate_dir / "audit.head").read_bytes()) == before
    assert (wal.read_bytes() if wal.exists() else b"") == wal_before
    assert len(rig.unauthenticated) == 100
    assert {reason for _, reason in rig.unauthenticated} == {"malformed", "bad_signature", "unknown_key"}


def test_replayed_and_already_settled_are_rejected(rig) -> None:
    env = _envelope(rig, rig.alice, PID, "gpu-01")
    assert post(rig.url, env.encode())[0] == 200
    statuses, audit = gate_state(rig.gate_dir)
    status, doc = post(rig.url, env.encode())
    assert (status, doc["error"]) == (409, "replayed")
    second = _envelope(rig, rig.alice, PID, "gpu-01", action="deny")
    status, doc = post(rig.url, second.encode())
    assert (status, doc["error"]) == (409, "already_settled")
    after, audit_after = gate_state(rig.gate_dir)
    assert after == statuses and [e[2]["reason"] for e in audit_after[len(audit) :]] == [
        "replayed",
        "already_settled",
    ]


def test_expired_proposal_and_revoked_key(rig) -> None:
    with Gatekeeper.open(rig.gate_dir) as gk:
        gk.expire(time.time() + 7200)
    status, doc = post(rig.url, _envelope(rig, rig.alice, PID, "gpu-01").encode())
    assert (status, doc["error"]) == (409, "already_settled")
    # removing alice's line revokes her key at once (the file is re-read per request)
    rig.auth.write_text("")
    status, doc = post(rig.url, _envelope(rig, rig.alice, PID2, "gpu-02").encode())
    assert (status, doc["error"]) == (403, "unknown_key")


def test_audit_verify_reports_the_first_bad_seq(rig, tmp_path: Path) -> None:
    assert post(rig.url, _envelope(rig, rig.alice, PID, "gpu-01").encode())[0] == 200
    export = tmp_path / "audit.jsonl"
    with Gatekeeper.open(rig.gate_dir) as gk, export.open("w") as fh:
        gk.audit.export_jsonl(fh)
    runner = CliRunner()
    ok = runner.invoke(
        main, ["audit", "verify", "--jsonl", str(export), "--head", str(rig.gate_dir / "audit.head")]
    )
    assert ok.exit_code == 0, ok.output
    lines = export.read_text().splitlines()
    doc = json.loads(lines[1])
    doc["data"]["node"] = "gpu-99"  # edit seq 2
    lines[1] = json.dumps(doc)
    export.write_text("\n".join(lines) + "\n")
    bad = runner.invoke(main, ["audit", "verify", "--jsonl", str(export)])
    assert bad.exit_code == 1 and "seq 2" in bad.output
    truncated = tmp_path / "short.jsonl"
    truncated.write_text(lines[0] + "\n")
    bad = runner.invoke(
        main,
        ["audit", "verify", "--jsonl", str(truncated), "--head", str(rig.gate_dir / "audit.head"), "--json"],
    )
    assert bad.exit_code == 1 and json.loads(bad.output)["code"] == "truncated"


def test_approve_refuses_a_settled_proposal_without_signing(rig) -> None:
    assert post(rig.url, _envelope(rig, rig.alice, PID, "gpu-01").encode())[0] == 200
    out = CliRunner().invoke(main, ["approve", PID, "--key", str(rig.alice), "--config", str(rig.cfg)])
    assert out.exit_code != 0 and "already approved" in out.output
    assert ProposalStatus.APPROVED.value == gate_state(rig.gate_dir)[0][PID]


# --- issue #27 item 12: clear errors, not tracebacks; help that says what the command does ---------------


def _clean_failure(out) -> None:  # type: ignore[no-untyped-def]
    """A refusal through click (exit 1, a message), not an exception escaping the command."""
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), repr(out.exception)


def test_keygen_help_says_what_it_does(tmp_path: Path) -> None:
    # it promised to append NAME.pub to the authorized-keys file, and never touched that file
    text = CliRunner().invoke(main, ["keygen", "--help"]).output
    assert "append NAME.pub to the controller" not in text and "print" in text
    auth = tmp_path / "authorized_keys"
    auth.write_text("")
    out = CliRunner().invoke(main, ["keygen", "dave", "--dir", str(tmp_path / "k")])
    assert out.exit_code == 0 and auth.read_text() == ""
    assert (tmp_path / "k" / "dave.pub").read_text().strip() in out.output


def test_submit_approval_of_a_non_utf8_file_names_it(rig) -> None:
    bad = rig.tmp / "envelope.json"
    bad.write_bytes(b'{"statement": "\xff\xfe"}')
    out = CliRunner().invoke(main, ["submit-approval", str(bad), "--submit", rig.url])
    _clean_failure(out)
    assert str(bad) in out.output and "UTF-8" in out.output
    assert gate_state(rig.gate_dir)[0] == {PID: "pending", PID2: "pending"}


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed_pages"])
def test_audit_verify_on_a_corrupt_gate_db_is_a_clear_error(rig, damage: str) -> None:
    db = rig.gate_dir / "gate.db"
    with Gatekeeper.open(rig.gate_dir):  # checkpoint the WAL into the file so the damage hits real pages
        pass
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    if damage == "garbage":
        db.write_bytes(b"this is not a database" * 100)
    elif damage == "truncated":
        db.write_bytes(data[: len(data) // 2 + 100])
    else:
        db.write_bytes(data[:4096] + b"\x00" * (len(data) - 4096))
    out = CliRunner().invoke(main, ["audit", "verify", "--config", str(rig.cfg)])
    _clean_failure(out)
    assert str(db) in out.output, out.output


def test_audit_verify_on_a_gate_db_with_a_damaged_page_fails_clearly(rig) -> None:
    # issue #27: a damaged b-tree page behind an intact header and schema: `audit verify` said ok
    db = rig.gate_dir / "gate.db"
    damage_btree_page(db, page=4)
    out = CliRunner().invoke(main, ["audit", "verify", "--config", str(rig.cfg)])
    _clean_failure(out)
    assert str(db) in out.output and "integrity check failed" in out.output, out.output
    assert "ok:" not in out.output


def test_audit_verify_of_a_non_utf8_export_names_it(tmp_path: Path) -> None:
    bad = tmp_path / "audit.jsonl"
    bad.write_bytes(b'{"seq": 1, "actor": "\xff"}\n')
    out = CliRunner().invoke(main, ["audit", "verify", "--jsonl", str(bad)])
    _clean_failure(out)
    assert str(bad) in out.output and "UTF-8" in out.output


def test_approve_and_submit_approval_through_a_listener_behind_tls_and_basic_auth(tmp_path: Path) -> None:
    """The push listener served with a web-config (TLS + basic auth): approve --config reaches it over https
    (the scheme from [push] web_config_file) with --ca-file, --basic-auth-user and --password-file;
    without credentials the listener's 401 is reported with the options to give, and nothing changes."""
    from pki import web_config_with_user

    pki, web, password = web_config_with_user(tmp_path)
    assert pki is not None
    auth = ["--basic-auth-user", "admin", "--password-file", str(password)]
    runner = CliRunner()
    with _rig(tmp_path, web) as r:
        env_file = r.tmp / "deny.json"
        out = runner.invoke(
            main, ["deny", PID2, "--key", str(r.alice), "--config", str(r.cfg), "--out", str(env_file)]
        )
        assert out.exit_code == 0, out.output
        # no credentials: refused by the listener, said with what to give; nothing changes
        out = runner.invoke(
            main, ["submit-approval", str(env_file), "--submit", r.url, "--ca-file", str(pki["ca"])]
        )
        assert out.exit_code == 1 and "refused (401)" in out.output and "--basic-auth-user" in out.output
        assert r.unauthenticated == [("listener", "basic_auth")]
        # no CA: the listener's certificate is not trusted, and the option that fixes it is named
        out = runner.invoke(main, ["submit-approval", str(env_file), "--submit", r.url, *auth])
        assert out.exit_code == 1 and "CERTIFICATE_VERIFY_FAILED" in out.output and "--ca-file" in out.output
        assert gate_state(r.gate_dir)[0][PID2] == "pending"
        # both: submitted
        out = runner.invoke(
            main, ["submit-approval", str(env_file), "--submit", r.url, "--ca-file", str(pki["ca"]), *auth]
        )
        assert out.exit_code == 0, out.output
        assert gate_state(r.gate_dir)[0][PID2] == "denied"
        # approve --config: https from [push] web_config_file; the credentials from the environment, as an
        # admin's shell sets them once
        env = {
            "FLEETYIELD_CA_FILE": str(pki["ca"]),
            "FLEETYIELD_BASIC_AUTH_USER": "admin",
            "FLEETYIELD_PASSWORD_FILE": str(password),
        }
        out = runner.invoke(
            main, ["approve", PID, "--key", str(r.alice), "--config", str(r.cfg), "--json"], env=env
        )
        assert out.exit_code == 0, out.output
        assert json.loads(out.output)["status"] == "approved" and gate_state(r.gate_dir)[0][PID] == "approved"
        # a password file that cannot be read names the option, before anything is sent
        out = runner.invoke(
            main,
            ["submit-approval", str(env_file), "--submit", r.url, "--password-file", str(tmp_path / "nope")],
            env={**env, "FLEETYIELD_PASSWORD_FILE": None},
        )
        assert out.exit_code == 2 and "--password-file: cannot read" in out.output, out.output
        assert len(r.unauthenticated) == 1
