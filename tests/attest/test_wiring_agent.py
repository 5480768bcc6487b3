"""The agent's wiring: the attest control ops through the real unix socket of a real ``fleetyield-agent
serve --backend fake`` process, ``GET /v1/attest/quote`` on its exporter, and the mounted CLI commands."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from wiring_rig import NODE, AgentProc

from node_agent.attest.quote import signature_ok
from node_agent.control import ControlError


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProc]:
    a = AgentProc(tmp_path_factory.mktemp("agent"))
    yield a
    a.close()


def _public(line: str) -> Ed25519PublicKey:
    kind, b64, name = line.split()
    assert kind == "fleetyield-ed25519" and name == NODE
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(b64))


def test_pubkey_and_quote_ops_over_the_control_socket(agent: AgentProc) -> None:
    line = agent.call({"op": "pubkey"})["line"]
    assert (agent.state_dir / "node.pub").read_text().strip() == line
    nonce = secrets.token_hex(32)
    quote = agent.call({"op": "quote", "nonce": nonce})
    assert quote["node"] == NODE and quote["nonce"] == nonce and signature_ok(quote, _public(line))
    names = [r["name"] for r in quote["records"]]
    assert names[:3] == ["kernel/osrelease", "kernel/cmdline", "kernel/modules"] and "agent/config" in names


def test_bad_requests_are_errors_not_crashes(agent: AgentProc) -> None:
    with pytest.raises(ControlError, match="64 lowercase hex"):
        agent.call({"op": "quote", "nonce": "nope"})
    with pytest.raises(ControlError, match="controller_url is not set"):
        agent.call({"op": "handover", "job_id": "7"})
    with pytest.raises(ControlError, match="bad request"):
        agent.call({"op": "scrub", "gpus": "all"})
    assert agent.call({"op": "ping"})["node"] == NODE  # the server is still fine


def test_scrub_op_records_the_request(agent: AgentProc) -> None:
    done = agent.call({"op": "scrub", "gpus": [1, 0, 1]})
    assert done["gpus"] == [0, 1] and done["method"] == "fake" and done["scrubbed"]
    last = (agent.state_dir / "scrub.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["gpus"] == [0, 1]
    assert agent.call({"op": "scrub"})["gpus"] == [0, 1]  # no list: every GPU of the node


def test_http_quote_route(agent: AgentProc) -> None:
    nonce = secrets.token_hex(32)
    url = f"http://127.0.0.1:{agent.port}/v1/attest/quote?nonce={nonce}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        quote = json.loads(resp.read())
    assert resp.status == 200 and quote["nonce"] == nonce
    assert signature_ok(quote, _public(agent.call({"op": "pubkey"})["line"]))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/v1/attest/quote?nonce=zz", timeout=10)
    assert err.value.code == 400 and "64 lowercase hex" in json.loads(err.value.read())["error"]


def test_agent_cli_mounts_attest_and_quote(agent: AgentProc, tmp_path: Path) -> None:
    listed = agent.cli("--help").stdout
    assert "attest " in listed and "quote " in listed
    nonce = secrets.token_hex(32)
    out = agent.cli(
        "quote", "--state-dir", str(agent.state_dir), "--config", str(agent.config), "--nonce", nonce
    )
    assert out.returncode == 0, out.stderr
    offline = json.loads(out.stdout)
    assert offline["node"] == NODE and offline["nonce"] == nonce
    served = agent.call({"op": "quote", "nonce": nonce})
    # the same measurement whether asked offline or through the server (bar the time)
    assert [r for r in offline["records"] if r["name"] != "meta/time"] == [
        r for r in served["records"] if r["name"] != "meta/time"
    ]
    out = agent.cli("attest", "pubkey", "--state-dir", str(agent.state_dir))
    assert out.returncode == 0 and out.stdout.strip() == agent.call({"op": "pubkey"})["line"]


def test_serving_without_attestation_never_imports_it(tmp_path: Path) -> None:
    """The agent's start-up cost stays where it was: no cryptography, no attest CLI until asked."""
    code = (
        "import json, sys\n"
        "import node_agent.cli\n"
        "from node_agent.config import AgentConfig\n"
        "from node_agent.exporter import Server\n"
        f"s = Server(AgentConfig(state_dir={str(tmp_path / 'st')!r}, port=0, listen='127.0.0.1', gpus=2))\n"
        "s.start()\n"
        "before = sorted(m for m in sys.modules if m.startswith(('cryptography', 'node_agent.attest')))\n"
        "s.agent.attestor\n"
        "after = 'cryptography' in sys.modules\n"
        "s.stop()\n"
        "print(json.dumps([before, after]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    before, after = json.loads(out.stdout)
    assert before == ["node_agent.attest", "node_agent.attest.chain", "node_agent.attest.config",
                      "node_agent.attest.measure", "node_agent.attest.places",
                      "node_agent.attest.probes"]  # fmt: skip
    assert after  # the first use builds the Attestor (and loads cryptography)
