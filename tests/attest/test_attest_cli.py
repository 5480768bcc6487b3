"""``fleetyield attest`` and ``fleetyield-agent attest``: enrol, baseline, offline verify, quote by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attest_rig import NODE, Clock, make_attestor
from click.testing import CliRunner

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

    # Edited after signing: offline verify exits 1.
    doc = json.loads(verdict.read_text())
    doc["status"] = "fail"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    result = runner.invoke(attest, ["verify", str(edited), "--key", str(keys / "fy-attest.pub")])
    assert result.exit_code == 1 and "REJECTED: bad signature" in result.output

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
