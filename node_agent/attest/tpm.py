"""The measurement chain in a real TPM 2.0 PCR, quoted by a TPM attestation key (tpm2-tools).

Input: a TCTI string (``device:/dev/tpmrm0`` on a node, ``swtpm:host=127.0.0.1,port=N`` in tests), a work
dir for the AK's files, the records of a quote and the controller's nonce. Output: a ``tpm`` section for the
quote: ``{"pcr_index", "pcr", "message", "signature", "pcrs"}`` (the TPMS_ATTEST, its signature and the
PCR values file of ``tpm2_quote``, base64), and on the controller ``check_tpm_quote`` -> the quoted PCR
value after ``tpm2_checkquote`` accepted signature and nonce.

Why PCR 16: a TPM PCR can only be reset at boot, except the debug PCR 16 and the application PCR 23
(resettable from locality 0). Each quote resets PCR 16 and extends it with ``sha256(record_bytes(r))`` for
every record, so ``PCR16 == chain.replay(records)``: the same value the software chain gives, now held by
hardware and signed by a key that never leaves the TPM. This is a *hand-over* quote (what the node says now,
bound to the controller's nonce), not measured boot: PCR 16 is written by the agent, so a root attacker can
extend it with lies -- measured boot (PCRs 0-9 via the firmware/IMA event log) is the next step, listed in
the report. The AK is an ECDSA P-256 restricted signing key made under the endorsement hierarchy
(``tpm2_createek`` + ``tpm2_createak``); its public PEM is enrolled with the node (``--ak``). The AK's saved
context is valid until the TPM resets; a production agent would persist it with ``tpm2_evictcontrol``.
Without a kernel resource manager (swtpm over TCP) transient objects are flushed after each command.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from node_agent.attest.chain import Record, record_hash

DEFAULT_PCR = 16
RESETTABLE_PCRS = (16, 23)
EXTENDS_PER_CALL = 32
_PCR_LINE = re.compile(r"^\s*(\d+)\s*:\s*0x([0-9A-Fa-f]{64})\s*$", re.MULTILINE)


class TpmError(RuntimeError):
    """A tpm2-tools command failed; the message carries the command and its stderr."""


def tools_available() -> bool:
    return all(shutil.which(t) for t in ("tpm2_pcrreset", "tpm2_pcrextend", "tpm2_quote", "tpm2_checkquote"))


def _run(args: Sequence[str], env: dict[str, str], timeout_s: float, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(
            list(args), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TpmError(f"{' '.join(args)}: {exc}") from None
    if proc.returncode != 0:
        raise TpmError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return proc.stdout


class Tpm:
    def __init__(self, tcti: str, workdir: Path, pcr: int = DEFAULT_PCR, timeout_s: float = 10.0) -> None:
        if pcr not in RESETTABLE_PCRS:
            raise TpmError(f"PCR {pcr} cannot be reset from locality 0; use one of {RESETTABLE_PCRS}")
        self.tcti = tcti
        self.workdir = Path(workdir)
        self.pcr = pcr
        self.timeout_s = timeout_s
        self.flush = not tcti.startswith("device:/dev/tpmrm")
        self.env = {**os.environ, "TPM2TOOLS_TCTI": tcti}

    def _tool(self, *args: str) -> str:
        return _run(args, self.env, self.timeout_s, self.workdir)

    def _flush(self) -> None:
        if self.flush:
            with contextlib.suppress(TpmError):
                self._tool("tpm2_flushcontext", "-t")
            with contextlib.suppress(TpmError):
                self._tool("tpm2_flushcontext", "-s")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.workdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.workdir / "tpm.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def ak_pem(self) -> str:
        """The AK's public key (PEM), creating EK and AK on first use."""
        with self._locked():
            pem = self.workdir / "ak.pem"
            if not (self.workdir / "ak.ctx").exists() or not pem.exists():
                self._flush()
                self._tool("tpm2_createek", "-c", "ek.ctx", "-G", "ecc", "-u", "ek.pub")
                self._flush()
                self._tool(
                    "tpm2_createak", "-C", "ek.ctx", "-c", "ak.ctx", "-G", "ecc", "-g", "sha256",
                    "-s", "ecdsa", "-u", "ak.pem", "-f", "pem", "-n", "ak.name",
                )  # fmt: skip
                self._flush()
            return pem.read_text(encoding="ascii")

    def quote(self, records: Sequence[Record], nonce_hex: str) -> dict[str, object]:
        self.ak_pem()
        with self._locked():
            self._tool("tpm2_pcrreset", str(self.pcr))
            hashes = [f"{self.pcr}:sha256={record_hash(r).hex()}" for r in records]
            for i in range(0, len(hashes), EXTENDS_PER_CALL):
                self._tool("tpm2_pcrextend", *hashes[i : i + EXTENDS_PER_CALL])
            out = self._tool(
                "tpm2_quote", "-c", "ak.ctx", "-l", f"sha256:{self.pcr}", "-q", nonce_hex,
                "-m", "quote.msg", "-s", "quote.sig", "-o", "quote.pcrs", "-g", "sha256",
            )  # fmt: skip
            self._flush()
            doc: dict[str, object] = {"pcr_index": self.pcr, "pcr": _pcr_from(out, self.pcr)}
            for key, name in (("message", "quote.msg"), ("signature", "quote.sig"), ("pcrs", "quote.pcrs")):
                doc[key] = base64.b64encode((self.workdir / name).read_bytes()).decode("ascii")
            return doc


def _pcr_from(tool_output: str, pcr: int) -> str:
    for m in _PCR_LINE.finditer(tool_output):
        if int(m.group(1)) == pcr:
            return m.group(2).lower()
    raise TpmError(f"no sha256 PCR {pcr} value in the tool output")


def check_tpm_quote(section: dict, ak_pem: str, nonce_hex: str, timeout_s: float = 10.0) -> str:
    """Run ``tpm2_checkquote`` on a quote's ``tpm`` section; return the quoted PCR value (hex).

    Raises ``TpmError`` when the signature, the nonce (qualifying data) or the PCR digest do not verify.
    Needs no TPM, only tpm2-tools (the controller's host).
    """
    pcr = int(section.get("pcr_index", DEFAULT_PCR))
    with tempfile.TemporaryDirectory(prefix="fy-tpmcheck-") as tmp:
        d = Path(tmp)
        try:
            for key, name in (("message", "q.msg"), ("signature", "q.sig"), ("pcrs", "q.pcrs")):
                (d / name).write_bytes(base64.b64decode(str(section[key]), validate=True))
        except (KeyError, ValueError) as exc:
            raise TpmError(f"malformed tpm section: {exc}") from None
        (d / "ak.pem").write_text(ak_pem, encoding="ascii")
        out = _run(
            ["tpm2_checkquote", "-u", "ak.pem", "-m", "q.msg", "-s", "q.sig", "-f", "q.pcrs",
             "-g", "sha256", "-q", nonce_hex],
            dict(os.environ), timeout_s, d,
        )  # fmt: skip
    return _pcr_from(out, pcr)
