"""``fleetyield attest`` and ``fleetyield-agent attest``: enrol, baseline, offline verify, quote by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attest_rig import NODE, Clock, make_attestor
from click.testing import CliRunner
from rig import damage_btree_page

from node_agent.attest.cli import attest as agent_attest
from node_agent.attest.cli import quote as agent_quote
from slurm_fleetyield.attest.cli import attest


def _ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.output


def test_admin_flow_enroll_baseline_check_verify(tmp_path: Path, clock: Clock) -> None:
    runner = CliRunner()
    att = make_attestor(tmp_path, clock)
    db = str(tmp_path / "attest.db")
    keys = tmp_path / "keys"
    _ok(runner.invoke(attest, ["keygen", "--out", str(keys)]))
    pub_line = tmp_path / "node.pub"
    pub_line.write_text(_ok(runner.invoke(agent_attest, ["pubkey", "--state-dir", str(att.state_dir)])))
    assert pub_line.read_text().startswith("fleetyield-ed25519 ") and NODE in pub_line.read_text()
    out = json.loads(_ok(runner.invoke(attest, ["enroll", NODE, "--pubkey", str(pub_line), "--class", "h100",
                                                "--db", db])))  # fmt: skip
    assert out["class"] == "h100"

    def fresh_quote(name: str) -> Path:
        nonce = json.loads(_ok(runner.invoke(attest, ["nonce", NODE, "--db", db])))["nonce"]
        path = tmp_path / name
        path.write_text(json.dumps(att.quote(nonce)))
        return path

    golden = fresh_quote("golden.json")
    policy = tmp_path / "policy.json"
    policy.write_text(_ok(runner.invoke(attest, ["baseline", "--quote", str(golden), "--class", "h100"])))
    assert json.loads(policy.read_text())["classes"]["h100"]["records"]["meta/time"] == ["*"]

    check = ["check-quote", "--policy", str(policy), "--key", str(keys / "fy-attest.key"), "--db", db]
    verdict = tmp_path / "verdict.json"
    verdict.write_text(_ok(runner.invoke(attest, [*check, str(fresh_quote("q1.json"))])))
    msg = _ok(runner.invoke(attest, ["verify", str(verdict), "--key", str(keys / "fy-attest.pub")]))
    assert msg.startswith(f"authentic verdict: {NODE} pass")
    doc = json.loads(_ok(runner.invoke(attest, ["verify", str(verdict), "--key", str(keys / "fy-attest.pub"),
                                                "--json"])))  # fmt: skip
    assert doc["authentic"] is True and doc["node"] == NODE and doc["status"] == "pass"
    listed = json.loads(_ok(runner.invoke(attest, ["nodes", "--db", db, "--json"])))
    assert [(r["node"], r["verdict"]) for r in listed] == [(NODE, "pass")]

    # Edited after signing: offline verify exits 1.
    doc = json.loads(verdict.read_text())
    doc["status"] = "fail"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    result = runner.invoke(attest, ["verify", str(edited), "--key", str(keys / "fy-attest.pub")])
    assert result.exit_code == 1 and "REJECTED: bad signature" in result.output
    result = runner.invoke(attest, ["verify", str(edited), "--key", str(keys / "fy-attest.pub"), "--json"])
    assert result.exit_code == 1 and result.stdout == ""
    err = json.loads(result.stderr)
    assert err["authentic"] is False and err["error"].startswith(f"{edited}: REJECTED: bad signature")

    # Wrong controller key: exit 1.
    _ok(runner.invoke(attest, ["keygen", "--out", str(keys), "--name", "other"]))
    result = runner.invoke(attest, ["verify", str(verdict), "--key", str(keys / "other.pub")])
    assert result.exit_code == 1 and "REJECTED: signed by key" in result.output

    # An implant: the signed verdict is a fail, authentic; --require-pass exits 3.
    _ok(runner.invoke(agent_attest, ["implant", "--state-dir", str(att.state_dir), "--module", "rootkit_x"]))
    result = runner.invoke(attest, [*check, str(fresh_quote("q2.json"))])
    assert result.exit_code == 1
    verdict.write_text(result.output)
    result = runner.invoke(
        attest, ["verify", str(verdict), "--key", str(keys / "fy-attest.pub"), "--require-pass"]
    )
    assert result.exit_code == 3 and "differing: kernel/modules" in result.output


def test_agent_quote_command(tmp_path: Path, clock: Clock) -> None:
    att = make_attestor(tmp_path, clock)
    result = CliRunner().invoke(agent_quote, ["--state-dir", str(att.state_dir), "--nonce", "cd" * 32])
    doc = json.loads(_ok(result))
    assert doc["node"] == NODE and doc["nonce"] == "cd" * 32 and len(doc["pcr"]) == 64
    bad = CliRunner().invoke(agent_quote, ["--state-dir", str(att.state_dir), "--nonce", "nope"])
    assert bad.exit_code != 0 and "64 lowercase hex" in bad.output


def test_unknown_node_enrolment_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text("ssh-ed25519 AAAA x\n")
    result = CliRunner().invoke(attest, ["enroll", NODE, "--pubkey", str(bad), "--class", "h100",
                                         "--db", str(tmp_path / "a.db")])  # fmt: skip
    assert result.exit_code != 0 and "unknown key type" in result.output


def test_agent_quote_on_nvml_without_a_driver_is_a_clear_error(tmp_path: Path) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        pass
    else:  # pragma: no cover - GPU machines
        pytest.skip("an NVIDIA driver is present")
    result = CliRunner().invoke(agent_quote, ["--state-dir", str(tmp_path), "--backend", "nvml",
                                              "--nonce", "cd" * 32])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "Error: no NVIDIA driver / libnvidia-ml found" in result.output


def test_nodes_reads_only_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default path ($FLEETYIELD_ATTEST_DB) pointed into an empty tmp tree: nothing is created there
    db = tmp_path / "var" / "lib" / "fleetyield" / "attest.db"
    monkeypatch.setenv("FLEETYIELD_ATTEST_DB", str(db))
    result = CliRunner().invoke(attest, ["nodes"])
    assert result.exit_code == 2 and f"{db}: no attestation database" in result.output
    assert list(tmp_path.iterdir()) == []
    # a file that is not an attestation database is named, and left as it was
    db.parent.mkdir(parents=True)
    db.write_bytes(b"")
    result = CliRunner().invoke(attest, ["nodes", "--json"])
    assert result.exit_code == 2 and json.loads(result.stderr) == {
        "error": f"{db}: not an attestation database (no table enrolment, verdict)"
    }
    assert db.read_bytes() == b""


def test_a_damaged_page_in_the_attestation_db_is_refused_at_open(tmp_path: Path) -> None:
    # issue #27: the header and schema intact, one b-tree page (the nonce table) damaged: the store opened
    # and a later nonce write met the damage; now the open refuses, naming the file
    from slurm_fleetyield.attest.store import AttestStore, AttestStoreError

    db = tmp_path / "attest.db"
    store = AttestStore(db)
    store.enroll(NODE, "cHVia2V5", "k1", "h100", None, 1.0)
    store.issue_nonce(NODE, 1.0)
    store.close()
    damage_btree_page(db, page=4)
    with pytest.raises(AttestStoreError, match="integrity check failed") as err:
        AttestStore(db)
    assert str(db) in str(err.value)
    result = CliRunner().invoke(attest, ["nonce", NODE, "--db", str(db), "--json"])
    assert result.exit_code == 2 and str(db) in json.loads(result.stderr)["error"], result.output


def test_the_read_only_store_refuses_writes(tmp_path: Path) -> None:
    import sqlite3

    from slurm_fleetyield.attest.store import AttestStore

    AttestStore(tmp_path / "a.db").close()
    ro = AttestStore.open_readonly(tmp_path / "a.db")
    assert ro.enrolments() == []
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        ro.enroll("n1", "AAAA", "k", "h100", None, 0.0)
