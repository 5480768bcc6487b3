"""``fleetyield-agent attest ...`` and ``fleetyield-agent quote``: the node side by hand.

Input: the agent state dir (and ``--config`` for the ``[attest]`` table). Output: a quote (JSON), the
node's public key line for enrolment, the fake "implant" fault, a scrub, or a hand-over summary. These
measure directly (no running server needed: measuring only reads files and the backend's state).
``--json`` on every verb: JSON out (``pubkey`` and ``ak`` otherwise print the bare line / PEM), errors as
``{"error": ...}`` on stderr. Exit status: 0 done, 2 usage / measurement / key error, 1 hand-over failed.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from node_agent.clikit import CliError, JsonErrorGroup, emit, json_option

STATE_DIR = click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Agent state directory.",
)
CONFIG = click.option(
    "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Agent TOML config; its [attest] table configures measurement, TPM and hand-over.",
)  # fmt: skip


@dataclass
class _OfflineAgent:
    """The four things ``Attestor`` needs from an ``Agent``, without serving anything."""

    backend: Any
    state_dir: Path
    node: str
    clock: Any = time.time
    lock: Any = field(default_factory=threading.RLock)


def _agent(state_dir: Path, backend: str | None) -> _OfflineAgent:
    from node_agent import state as st

    if backend == "nvml" or (backend is None and not (state_dir / st.STATE_FILE).exists()):
        from node_agent.backends.nvml import NvmlBackend

        b: Any = NvmlBackend(socket.gethostname())
        b.start()
        return _OfflineAgent(b, state_dir, socket.gethostname())
    from node_agent.backends.fake import FakeBackend

    s = st.load(state_dir)
    if s is None:
        raise click.ClickException(f"no fake GPU state in {state_dir}")
    fb = FakeBackend(state_dir, s.hostname, gpus=len(s.gpus), model=s.model, seed=s.seed)
    fb.state = s
    return _OfflineAgent(fb, state_dir, s.hostname)


def _attestor(state_dir: Path, config_file: Path | None, backend: str | None) -> Any:
    from node_agent.attest.config import load_attest_config
    from node_agent.attest.service import Attestor
    from node_agent.backends.base import BackendError

    try:
        return Attestor(_agent(state_dir, backend), load_attest_config(config_file))
    except (ValueError, BackendError) as exc:
        raise click.ClickException(str(exc)) from None


# quote, implant, scrub-gpu and handover print JSON in any case; --json is taken for uniformity
JSON = json_option()

BACKEND = click.option("--backend", type=click.Choice(["fake", "nvml"]), default=None,
                       help="Default: fake when fake state exists in the state dir.")  # fmt: skip


@click.command("quote")
@STATE_DIR
@CONFIG
@BACKEND
@click.option("--nonce", required=True, help="The controller's nonce (64 hex digits).")
@JSON
def quote(state_dir: Path, config_file: Path | None, backend: str | None, nonce: str, as_json: bool) -> None:
    """Measure this node and print a quote bound to NONCE, signed with the node key."""
    from node_agent.attest.keys import NodeKeyError
    from node_agent.attest.tpm import TpmError

    try:
        doc = _attestor(state_dir, config_file, backend).quote(nonce)
    except (ValueError, NodeKeyError, TpmError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(doc, indent=1, sort_keys=True))


@click.group("attest", cls=JsonErrorGroup)
def attest() -> None:
    """Node attestation: quote, public key for enrolment, fake implant, scrub, hand-over."""


attest.add_command(quote)


@attest.command("pubkey")
@STATE_DIR
@click.option("--hostname", default=None, help="Node name in the key line (default: fake state / host).")
@json_option('{"line": KEY_LINE, "file": STATE_DIR/node.pub} instead of the bare line.')
def pubkey(state_dir: Path, hostname: str | None, as_json: bool) -> None:
    """Print (and write STATE_DIR/node.pub) the node's enrolment line; makes node.key on first use."""
    from node_agent import state as st
    from node_agent.attest.keys import NodeKeyError, export_public

    s = st.load(state_dir) if (state_dir / st.STATE_FILE).exists() else None
    name = hostname or (s.hostname if s else socket.gethostname().split(".", 1)[0])
    try:
        line = export_public(state_dir, name)
    except (NodeKeyError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit({"line": line.strip(), "file": str(state_dir / "node.pub")})
    else:
        click.echo(line)


@attest.command("ak")
@STATE_DIR
@CONFIG
@json_option('{"ak_pem": PEM} instead of the bare PEM.')
def ak(state_dir: Path, config_file: Path | None, as_json: bool) -> None:
    """Print the TPM attestation key (PEM) for ``fleetyield attest enroll --ak`` (needs [attest] tpm_tcti)."""
    from node_agent.attest.tpm import TpmError

    att = _attestor(state_dir, config_file, None)
    if att.tpm is None:
        raise click.ClickException("no [attest] tpm_tcti configured")
    try:
        pem = att.tpm.ak_pem()
    except TpmError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit({"ak_pem": pem})
    else:
        click.echo(pem, nl=False)


@attest.command("implant")
@STATE_DIR
@click.option("--module", "module", required=True, help="Kernel-module name the fake measurement will show.")
@JSON
def implant(state_dir: Path, module: str, as_json: bool) -> None:
    """Fake backend demo fault: an extra kernel module in the next measurement (STATE_DIR/fake-modules)."""
    from node_agent.attest.service import implant_module

    if not module.replace("_", "").replace("-", "").isalnum():
        raise click.ClickException(f"module name {module!r} must be alphanumeric with - or _")
    click.echo(json.dumps({"implanted": module, "file": str(implant_module(state_dir, module))}))


@attest.command("scrub-gpu")
@click.option("--pci-bus-id", default=None, help="The GPU by PCI bus id (as NVML and the exposition say).")
@click.option(
    "--device",
    "ordinal",
    type=int,
    default=0,
    show_default=True,
    help="Else the CUDA ordinal among CUDA_VISIBLE_DEVICES (the hand-over sets the GPU's UUID).",
)
@click.option(
    "--reserve-mib",
    type=click.IntRange(0, 1 << 20),
    default=256,
    show_default=True,
    help="Left unallocated (the context's own needs).",
)
@click.option("--chunk-mib", type=click.IntRange(1, 1 << 20), default=1024, show_default=True)
@JSON
def scrub_gpu(pci_bus_id: str | None, ordinal: int, reserve_mib: int, chunk_mib: int, as_json: bool) -> None:
    """Zero a GPU's free memory with the CUDA driver (libcuda) and read samples back: a real
    ``attest.scrub_command``. Exit 0 scrubbed and read back zero, 1 a sample was not zero, 2 error."""
    from node_agent.attest.cuda_scrub import ScrubError, scrub

    try:
        result = scrub(pci_bus_id, ordinal, reserve_mib, chunk_mib)
    except ScrubError as exc:
        raise CliError(str(exc), exit_code=2) from None
    click.echo(json.dumps(result.to_dict(), sort_keys=True))
    sys.exit(0 if result.ok else 1)


@attest.command("handover")
@STATE_DIR
@CONFIG
@BACKEND
@click.option("--job-id", default=None)
@click.option("--push-secret-file", type=click.Path(dir_okay=False, path_type=Path), required=True)
@JSON
def handover(state_dir: Path, config_file: Path | None, backend: str | None, job_id: str | None,
             push_secret_file: Path, as_json: bool) -> None:  # fmt: skip
    """Run the hand-over now (nonce -> quote -> verdict file); exit 1 when it fails or the node fails."""
    from node_agent.attest.service import AttestError

    secret = push_secret_file.read_bytes().strip()
    try:
        summary = _attestor(state_dir, config_file, backend).handover(job_id, secret)
    except AttestError as exc:
        raise CliError(str(exc), exit_code=1) from None
    click.echo(json.dumps(summary, sort_keys=True))
    sys.exit(0 if summary["status"] == "pass" else 1)
