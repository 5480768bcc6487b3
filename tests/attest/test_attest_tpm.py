"""node_agent/attest/tpm with a software TPM (swtpm + tpm2-tools): chain in PCR 16, quote, checkquote.

Runs wherever swtpm and tpm2-tools are installed; skipped otherwise, except under CI (``CI=true``), where a
missing swtpm is a failure: the real-TPM path must be exercised in CI (.ci/run installs the packages).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from attest_rig import NODE, Clock, Controller, make_attestor

from node_agent.attest.chain import Record, replay
from node_agent.attest.tpm import Tpm, TpmError, check_tpm_quote, tools_available


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def swtpm(tmp_path: Path) -> Iterator[str]:
    if not (shutil.which("swtpm") and tools_available()):
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but swtpm/tpm2-tools are missing: .ci/run must install swtpm tpm2-tools")
        pytest.skip("swtpm and tpm2-tools not installed")
    state = tmp_path / "swtpm"
    state.mkdir()
    for _attempt in range(5):
        port = _free_port()
        ctrl = port + 1  # the swtpm TCTI expects the control channel on the next port
        proc = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--tpmstate", f"dir={state}",
             "--server", f"type=tcp,port={port},bindaddr=127.0.0.1",
             "--ctrl", f"type=tcp,port={ctrl},bindaddr=127.0.0.1", "--flags", "startup-clear,not-need-init"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        if proc.poll() is None:
            break
    else:
        pytest.fail(f"swtpm did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
    try:
        yield f"swtpm:host=127.0.0.1,port={port}"
    finally:
        proc.terminate()
        proc.wait(5)


def test_tpm_pcr_equals_the_software_chain_and_checkquote_accepts(swtpm: str, tmp_path: Path) -> None:
    tpm = Tpm(swtpm, tmp_path / "tpm")
    records = [Record(0, "k", "a", "00" * 32), Record(1, "k", "b", "11" * 32)]
    nonce = "ab" * 32
    section = tpm.quote(records, nonce)
    assert section["pcr"] == replay(records)
    assert check_tpm_quote(section, tpm.ak_pem(), nonce) == replay(records)
    with pytest.raises(TpmError, match="tpm2_checkquote"):
        check_tpm_quote(section, tpm.ak_pem(), "cd" * 32)  # another nonce


def test_handover_with_tpm_enrolment(swtpm: str, tmp_path: Path, clock: Clock, ctl: Controller) -> None:
    att = make_attestor(tmp_path, clock, tpm_tcti=swtpm)
    assert att.tpm is not None
    ctl.enroll(att, ak_pem=att.tpm.ak_pem())
    v = ctl.handover(att, clock.now)
    assert v["status"] == "pass" and v["tpm"] == "verified", v["reasons"]
    # A quote without the TPM section from a TPM-enrolled node fails.
    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    att.tpm = None
    v = ctl.service.attest(NODE, att.quote(nonce, clock.now), clock.now)
    assert v["status"] == "fail" and "no TPM section" in v["reasons"][0]


def test_tpm_pcr_not_matching_the_records_fails(
    swtpm: str, tmp_path: Path, clock: Clock, ctl: Controller
) -> None:
    """The node key signs records that differ from what the TPM measured: the PCR comparison catches it."""
    att = make_attestor(tmp_path, clock, tpm_tcti=swtpm)
    assert att.tpm is not None
    ctl.enroll(att, ak_pem=att.tpm.ak_pem())
    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    from node_agent.attest.measure import measure
    from node_agent.attest.quote import build_quote

    honest = measure(att.spec, [], clock.now)
    tpm_section = att.tpm.quote(honest[:-1], nonce)  # TPM saw other records
    quote = build_quote(NODE, nonce, honest, att.key(), clock.now, tpm_section)
    v = ctl.service.attest(NODE, quote, clock.now)
    assert v["status"] == "fail" and any(r.startswith("tpm: PCR 16") for r in v["reasons"])
