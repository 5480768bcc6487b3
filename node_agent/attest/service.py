"""What the agent does for attestation: quote, scrub GPU memory, and the Epilog hand-over.

Input: the running ``Agent`` (its backend, state dir, node name, clock and lock) and an ``AttestConfig``.
Output: ``Attestor.quote(nonce)`` (a signed quote dict), ``Attestor.scrub(gpus)`` (what was done, per GPU),
``Attestor.handover(job_id)`` (the whole exchange with the controller, ending in a verified verdict file),
plus ``control_op`` / ``http_quote`` -- the two small entry points the control socket and the HTTP
exporter call (see the wiring notes in the report; no existing module is edited here).

The hand-over exchange (agent -> controller, stdlib HTTP):

1. ``POST {controller_url}/v1/attest/nonce`` body ``{"node": N, "job_id": J, "request_id": R}`` (R random:
   the controller answers a replay or retry of this request with the same nonce and no new row), signed
   with the agent's push secret exactly like event pushes (``protocol.signed_headers``) -> ``{"node",
   "nonce", "expires_at"}``;
2. measure, quote (Ed25519 node key; plus the TPM section when ``tpm_tcti`` is set);
3. ``POST {controller_url}/v1/attest/quote`` body = the quote (self-authenticating: the controller checks
   it against the *enrolled* node key) -> the verdict signed by the controller key;
4. verify the verdict's signature with ``controller_pubkey``, check it names this node and this nonce,
   and write it atomically (mode 0644) to the verdict file the next Prolog reads.

GPU memory scrub. NVML has no "clear framebuffer" call. What a real node can do: (a) run a tiny CUDA job
per GPU that allocates all free memory and ``cudaMemset``s it (``scrub_command``, e.g. this package's
``fleetyield-agent attest scrub-gpu --pci-bus-id {pci}``, ``cuda_scrub.py``; ``{gpu}``, ``{pci}`` and
``{uuid}`` are filled in, and the job sees only that GPU), or (b) rely on the driver: CUDA zeroes memory
before handing it to a new context (clear-on-alloc; not a documented guarantee for every allocation path,
and MIG/confidential-computing modes scrub on instance teardown). Without ``scrub_command`` the nvml
backend reports ``method: "driver-clear-on-alloc"``, ``scrubbed: false`` -- said, not assumed. The fake
backend records each request in ``STATE_DIR/scrub.jsonl`` (what tests and the demos assert on).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from node_agent.attest import keys as node_keys
from node_agent.attest.config import VERDICT_FILE, AttestConfig
from node_agent.attest.gpu import gpu_reports
from node_agent.attest.measure import FAKE_MODULES_FILE, MeasureSpec, live_co_residents, measure
from node_agent.attest.probes import CoResident
from node_agent.attest.quote import NONCE_PATH, QUOTE_PATH, build_quote, check_nonce
from node_agent.attest.tpm import Tpm
from node_agent.httpclient import urlopen

SCRUB_LOG = "scrub.jsonl"
SCRUB_TIMEOUT_S = 60


class AttestError(RuntimeError):
    """A step of the attestation failed; the message says which and why."""


class Attestor:
    def __init__(self, agent: Any, cfg: AttestConfig | None = None, secret: bytes | None = None) -> None:
        self.agent = agent
        self.cfg = cfg or AttestConfig()
        self.secret = secret  # the agent's push secret: signs the nonce request
        self.client: Any = None  # node_agent.httpclient.HttpClient: the listener's basic auth and TLS
        self.state_dir = Path(agent.state_dir)
        self._lock = threading.Lock()
        self._key = None
        fake = agent.backend.name == "fake"
        self.spec = MeasureSpec(
            root=self.cfg.root,
            persistence=tuple(self.cfg.persistence),
            agent_config_file=self.cfg.agent_config_file,
            extra_modules_file=self.state_dir / FAKE_MODULES_FILE if fake else None,
            python_env=tuple(self.cfg.python_env),
            homes=tuple(self.cfg.homes) if self.cfg.homes is not None else None,
            areas=tuple(self.cfg.areas),
            tenant_uid_min=self.cfg.tenant_uid_min,
        )
        self.tpm = (
            Tpm(self.cfg.tpm_tcti, self.state_dir / "tpm", self.cfg.tpm_pcr) if self.cfg.tpm_tcti else None
        )

    @property
    def verdict_path(self) -> Path:
        return self.cfg.verdict_file or self.state_dir / VERDICT_FILE

    def key(self) -> Any:
        if self._key is None:
            self._key = node_keys.load_or_create(self.state_dir)
        return self._key

    # ------------------------------------------------------------------ quote
    def quote(
        self, nonce: str, now: float | None = None, present: Sequence[CoResident] = ()
    ) -> dict[str, Any]:
        check_nonce(nonce)
        now = self.agent.clock() if now is None else now
        with self.agent.lock:
            reports = gpu_reports(self.agent.backend)
        present = live_co_residents(self.spec, present)
        records = measure(self.spec, reports, now, present)
        tpm = self.tpm.quote(records, nonce) if self.tpm is not None else None
        lines = sorted({c.line() for c in present})
        return build_quote(self.agent.node, nonce, records, self.key(), now, tpm, lines)

    # ------------------------------------------------------------------ scrub
    def scrub(self, gpus: list[int] | None) -> dict[str, Any]:
        backend = self.agent.backend
        indices = sorted(set(gpus)) if gpus else list(range(backend.expected_gpus()))
        now = self.agent.clock()
        if backend.name == "fake":
            entry = {"time": now, "gpus": indices, "method": "fake", "scrubbed": True}
            line = (json.dumps(entry, sort_keys=True) + "\n").encode()
            fd = os.open(self.state_dir / SCRUB_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
            return entry
        if not self.cfg.scrub_command:
            return {
                "time": now,
                "gpus": indices,
                "method": "driver-clear-on-alloc",
                "scrubbed": False,
                "note": "NVML has no memory-scrub call; set attest.scrub_command to run a CUDA memset job",
            }
        failed = {}
        infos = {i.index: i for i in backend.infos()}
        for gpu in indices:
            info = infos.get(gpu)
            pci, uuid = (info.pci_bus_id, info.uuid) if info else ("", "")
            cmd = [
                part.replace("{gpu}", str(gpu)).replace("{pci}", pci).replace("{uuid}", uuid)
                for part in self.cfg.scrub_command
            ]
            # CUDA numbers devices fastest-first unless told otherwise, NVML by PCI bus: the UUID is the
            # one name both agree on, so the job sees exactly the GPU being handed over.
            visible = uuid or str(gpu)
            try:
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=SCRUB_TIMEOUT_S, check=False,
                    env={**os.environ, "CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                )  # fmt: skip
                if proc.returncode != 0:
                    failed[gpu] = f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}"
            except (OSError, subprocess.TimeoutExpired) as exc:
                failed[gpu] = str(exc)
        return {"time": now, "gpus": indices, "method": "command", "scrubbed": not failed, "failed": failed}

    # ------------------------------------------------------------------ hand-over
    def handover(
        self, job_id: str | None = None, secret: bytes | None = None, present: Sequence[CoResident] = ()
    ) -> dict[str, Any]:
        """Nonce -> quote -> verdict -> verified verdict file. Returns a summary; raises ``AttestError``.
        ``present``: jobs still running on this (shared) node, whose tenants' records are theirs."""
        from node_agent.protocol import signed_headers

        secret = secret or self.secret
        url = (self.cfg.controller_url or "").rstrip("/")
        if not url:
            raise AttestError("attest.controller_url is not set: no controller to attest to")
        if secret is None:
            raise AttestError("the hand-over needs the push secret (--push-secret-file)")
        if self.cfg.controller_pubkey is None:
            raise AttestError("attest.controller_pubkey is not set: a verdict could not be verified")
        with self._lock:  # one hand-over at a time per node
            started = time.monotonic()
            request_id = secrets.token_hex(16)
            body = json.dumps({"node": self.agent.node, "job_id": job_id, "request_id": request_id}).encode()
            headers = signed_headers(secret, self.agent.node, int(self.agent.clock()), body)
            issued = self._post(url + NONCE_PATH, body, headers)
            nonce = check_nonce(str(issued.get("nonce", "")))
            t_nonce = time.monotonic()
            quote = self.quote(nonce, present=present)
            qbody = json.dumps(quote).encode()
            t_quote = time.monotonic()
            verdict = self._post(url + QUOTE_PATH, qbody, {"Content-Type": "application/json"})
            write_verified_verdict(
                verdict, self.agent.node, nonce, self.cfg.controller_pubkey, self.verdict_path
            )
            done = time.monotonic()
            return {
                "status": verdict.get("status"),
                "nonce": nonce,
                "verdict_file": str(self.verdict_path),
                "differences": [d.get("name") for d in verdict.get("differences", [])],
                "elapsed_ms": round((done - started) * 1000, 1),
                # where the time went: nonce round trip, measure + sign, quote POST + verdict check + file
                "phases_ms": {
                    "nonce": round((t_nonce - started) * 1000, 1),
                    "quote": round((t_quote - t_nonce) * 1000, 1),
                    "verdict": round((done - t_quote) * 1000, 1),
                },
                **({"co_resident": quote["co_resident"]} if "co_resident" in quote else {}),
            }

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urlopen(req, self.cfg.timeout_s, self.client) as resp:
                doc = json.loads(resp.read(1 << 22))
        except urllib.error.HTTPError as err:
            raise AttestError(f"{url}: HTTP {err.code}: {err.read(2000).decode(errors='replace')}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise AttestError(f"{url}: {exc}") from None
        if not isinstance(doc, dict):
            raise AttestError(f"{url}: answer is not a JSON object")
        return doc


def write_verified_verdict(
    verdict: dict[str, Any], node: str, nonce: str | None, pubkey_path: Path, out: Path
) -> None:
    """Check the controller's signature, that the verdict is for ``node`` (and ``nonce``); write it."""
    from prolog_epilog.attest_gate import load_public_key, verdict_signature_ok

    try:
        public = load_public_key(str(pubkey_path))
    except (OSError, ValueError) as exc:
        raise AttestError(f"controller public key {pubkey_path}: {exc}") from None
    if not verdict_signature_ok(verdict, public):
        raise AttestError("the verdict's signature does not verify with the controller key")
    if verdict.get("node") != node:
        raise AttestError(f"the verdict is for {verdict.get('node')!r}, not {node!r}")
    if nonce is not None and verdict.get("nonce") != nonce:
        raise AttestError("the verdict answers another nonce")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(json.dumps(verdict, sort_keys=True).encode() + b"\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


# ---------------------------------------------------------------------- entry points for existing modules
def control_op(attestor: Attestor, op: str, request: dict[str, Any]) -> Any:
    """The control-socket ops ``quote`` (nonce), ``scrub`` (gpus), ``handover`` (job_id), ``pubkey``.

    Every failure is raised as ``ValueError`` (what ``node_agent.control`` already turns into an
    ``{"ok": false, "error": ...}`` reply), with the step's message.
    """
    from node_agent.attest.tpm import TpmError

    try:
        return _control_op(attestor, op, request)
    except (AttestError, TpmError, node_keys.NodeKeyError, OSError) as exc:
        raise ValueError(f"{op}: {exc}") from None


def _control_op(attestor: Attestor, op: str, request: dict[str, Any]) -> Any:
    if op == "quote":
        return attestor.quote(str(request.get("nonce") or ""))
    if op == "scrub":
        gpus = request.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, int) for g in gpus):
            raise ValueError("scrub: gpus must be a list of GPU indices")
        return attestor.scrub(gpus)
    if op == "handover":
        job_id = request.get("job_id")
        present = _co_resident(request.get("co_resident") or [])
        return attestor.handover(str(job_id) if job_id is not None else None, present=present)
    if op == "pubkey":
        return {"line": node_keys.export_public(attestor.state_dir, attestor.agent.node)}
    raise ValueError(f"unknown attest op {op!r}")


def _co_resident(items: list[Any]) -> list[CoResident]:
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"job_id", "uid"}:
            raise ValueError(f"handover: co_resident entries are {{job_id, uid}} objects, got {item!r}")
        out.append(CoResident(str(item["job_id"]), item["uid"]))
    return out


def http_quote(attestor: Attestor, query: str) -> tuple[int, dict[str, Any]]:
    """``GET /v1/attest/quote?nonce=HEX`` on the exporter (controller pull): (status, JSON doc).

    Unauthenticated on purpose: the answer is a signed statement bound to the caller's nonce and reveals
    only digests/versions already visible to anyone who can scrape /metrics; verification happens at the
    controller. Rate-limit at the network if quotes become a DoS concern (~10-60 ms of CPU each).
    """
    from urllib.parse import parse_qs

    nonce = (parse_qs(query).get("nonce") or [""])[0]
    try:
        return 200, attestor.quote(nonce)
    except ValueError as exc:
        return 400, {"error": str(exc)}
    except Exception as exc:  # a measurement/TPM failure: say so, never crash the exporter thread
        return 500, {"error": f"{type(exc).__name__}: {exc}"}


def implant_module(state_dir: Path, name: str) -> Path:
    """Fake backend demo fault: add ``name`` to ``STATE_DIR/fake-modules`` (read by the next measurement)."""
    path = Path(state_dir) / FAKE_MODULES_FILE
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(name.strip() + "\n")
    return path


class HandoverLoop:
    """Re-attest at agent start and every ``interval_s`` (keeps an idle node's verdict from going stale).

    A failed exchange (controller down or restarting, node not enrolled yet) is logged and retried after
    ``retry_initial_s``, doubling up to ``retry_max_s`` (never beyond ``interval_s``), until one succeeds:
    a node that boots while its controller is away gets its first verdict within a minute of the
    controller's return, not 15 minutes later (the Prolog denies a node without one). A verdict that
    *fails* is an answer, not an error: it is not retried early. The Epilog's hand-over stays the one that
    matters between tenants. ``stop()`` joins the thread.
    """

    def __init__(
        self,
        attestor: Attestor,
        secret: bytes,
        interval_s: float = 900.0,
        retry_initial_s: float = 1.0,
        retry_max_s: float = 60.0,
    ) -> None:
        self.attestor = attestor
        self.secret = secret
        self.interval_s = interval_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.last: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> bool:
        """One exchange; True when the controller answered with a verdict (pass or fail)."""
        import logging

        try:
            self.last = self.attestor.handover(None, self.secret)
            return True
        except (AttestError, OSError, ValueError) as exc:
            self.last = {"status": "error", "error": str(exc)}
            logging.getLogger(__name__).warning("attestation hand-over failed: %s", exc)
            return False

    def next_delay(self, ok: bool, failures: int) -> float:
        """Seconds to the next exchange after ``failures`` consecutive failed ones (0 after a success)."""
        if ok:
            return self.interval_s
        return min(self.retry_initial_s * 2 ** max(failures - 1, 0), self.retry_max_s, self.interval_s)

    def start(self) -> None:
        def loop() -> None:
            failures = 0
            while not self._stop.is_set():
                ok = self.run_once()
                failures = 0 if ok else failures + 1
                self._stop.wait(self.next_delay(ok, failures))

        self._thread = threading.Thread(target=loop, name="fleetyield-attest", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
