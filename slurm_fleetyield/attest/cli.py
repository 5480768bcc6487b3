"""``fleetyield attest``: enrol nodes, learn a policy, keys, and check verdicts offline.

Input: flags; the attestation database (``--db``, default ``$FLEETYIELD_ATTEST_DB`` or
/var/lib/fleetyield/attest.db; ``nodes`` only reads it and never creates one). Output: JSON on stdout
(``verify``: a sentence, JSON with ``--json``), errors on stderr (as ``{"error": ...}`` with ``--json``,
which every verb takes). Exit status: 0 done (``verify``: the verdict is authentic), 1 refused (``verify``:
bad signature or edited; ``check-quote``: the quote fails), 2 usage or unreadable input, 3
(``verify --require-pass``) authentic but failed.
Mounted lazily by ``slurm_fleetyield.cli`` (like ``simulate``), so cryptography is only imported here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from node_agent.clikit import CliError, JsonErrorGroup, emit, json_option
from slurm_fleetyield.attest.store import DEFAULT_DB

DB = click.option(
    "--db",
    "db_path",
    default=lambda: os.environ.get("FLEETYIELD_ATTEST_DB", DEFAULT_DB),
    show_default="$FLEETYIELD_ATTEST_DB or " + DEFAULT_DB,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Attestation database (enrolments, nonces, verdicts).",
)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{path}: {exc}") from None


def _open_store(db_path: Path) -> Any:
    """The attestation store for a verb that writes; an unusable or damaged file is a clear refusal
    (exit 2) naming it, not a traceback."""
    from slurm_fleetyield.attest.store import AttestStore, AttestStoreError

    try:
        return AttestStore(db_path)
    except AttestStoreError as exc:
        raise CliError(str(exc), exit_code=2) from None


_out = emit
# These verbs print JSON in any case; ``--json`` is taken by each (scripts pass it uniformly) and makes the
# errors JSON too.
JSON = json_option("JSON output (the default here), and errors as JSON on stderr.")


@click.group("attest", cls=JsonErrorGroup)
def attest() -> None:
    """Tenant-isolation attestation: enrol nodes, learn a policy, check verdicts offline."""


@attest.command("keygen")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", default="fy-attest", show_default=True)
@JSON
def keygen_cmd(out_dir: Path, name: str, as_json: bool) -> None:
    """Make the controller's verdict-signing key pair (NAME.key 0600, NAME.pub to publish)."""
    from slurm_fleetyield.gate.errors import KeyExists
    from slurm_fleetyield.gate.keys import keygen

    try:
        private, public = keygen(name, out_dir)
    except (KeyExists, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    _out({"private": str(private), "public": str(public)})


@attest.command("enroll")
@click.argument("node")
@click.option("--pubkey", "pubkey_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The node's key line (fleetyield-agent attest pubkey).")  # fmt: skip
@click.option("--class", "node_class", required=True, help="Policy class of the node (e.g. h100).")
@click.option("--ak", "ak_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="TPM attestation key (PEM): the node must then quote with its TPM.")  # fmt: skip
@DB
@JSON
def enroll_cmd(
    node: str, pubkey_file: Path, node_class: str, ak_file: Path | None, db_path: Path, as_json: bool
) -> None:
    """Enrol NODE's public key (explicit admin step; re-enrolling replaces the key)."""
    from slurm_fleetyield.attest.verify import decode_pubkey_line
    from slurm_fleetyield.gate.errors import KeyFileError

    try:
        b64, key_id = decode_pubkey_line(pubkey_file.read_text(encoding="ascii"))
        ak_pem = ak_file.read_text(encoding="ascii") if ak_file else None
    except (OSError, ValueError, KeyFileError) as exc:
        raise click.ClickException(f"{pubkey_file}: {exc}") from None
    if ak_pem is not None and "BEGIN PUBLIC KEY" not in ak_pem:
        raise click.ClickException(f"{ak_file}: not a PEM public key")
    e = _open_store(db_path).enroll(node, b64, key_id, node_class, ak_pem, time.time())
    _out({"node": e.node, "key_id": e.key_id, "class": e.node_class, "tpm": bool(e.ak_pem)})


@attest.command("revoke")
@click.argument("node")
@DB
@JSON
def revoke_cmd(node: str, db_path: Path, as_json: bool) -> None:
    """Forget NODE's enrolment (its quotes fail from now on)."""

    if not _open_store(db_path).revoke(node):
        raise click.ClickException(f"node {node!r} is not enrolled")
    _out({"revoked": node})


@attest.command("nodes")
@DB
@JSON
def nodes_cmd(db_path: Path, as_json: bool) -> None:
    """List enrolled nodes with their latest verdict."""
    from slurm_fleetyield.attest.store import AttestStore, AttestStoreError

    try:
        store = AttestStore.open_readonly(db_path)
    except AttestStoreError as exc:
        raise CliError(str(exc), exit_code=2) from None
    rows = []
    for e in store.enrolments():
        v = store.latest_verdict(e.node) or {}
        rows.append({"node": e.node, "class": e.node_class, "key_id": e.key_id, "tpm": bool(e.ak_pem),
                     "verdict": v.get("status"), "verdict_time": v.get("time")})  # fmt: skip
    _out(rows)


@attest.command("baseline")
@click.option("--quote", "quote_file", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--class", "node_class", required=True)
@click.option("--merge", "merge_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Existing policy to add the quote's values to (never removes any).")  # fmt: skip
@JSON
def baseline_cmd(quote_file: Path, node_class: str, merge_file: Path | None, as_json: bool) -> None:
    """Print a policy learnt from a golden node's quote (redirect it to the policy file)."""
    from slurm_fleetyield.attest.baseline import learn
    from slurm_fleetyield.attest.policy import PolicyError, load_policy

    try:
        existing = load_policy(merge_file) if merge_file else None
        policy = learn(_read_json(quote_file), node_class, existing)
    except (PolicyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    _out(policy.model_dump())


@attest.command("verify")
@click.argument("verdict_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "key_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The controller's public key line (NAME.pub).")  # fmt: skip
@click.option("--require-pass", is_flag=True, help="Exit 3 when the authentic verdict is a fail.")
@JSON
def verify_cmd(verdict_file: Path, key_file: Path, require_pass: bool, as_json: bool) -> None:
    """Check a verdict offline: exit 1 if the signature is bad or the verdict was edited after signing."""
    from slurm_fleetyield.attest.verdict import VerdictError, check
    from slurm_fleetyield.gate.errors import KeyFileError
    from slurm_fleetyield.gate.keys import parse_public_line

    doc = _read_json(verdict_file)
    try:
        key = parse_public_line(key_file.read_text(encoding="ascii").strip(), path=key_file)
    except (OSError, KeyFileError) as exc:
        raise click.ClickException(f"{key_file}: {exc}") from None
    try:
        check(doc, key.public_key)
    except VerdictError as exc:
        if as_json:
            raise CliError(f"{verdict_file}: REJECTED: {exc}", authentic=False) from None
        click.echo(f"REJECTED: {exc}", err=True)
        sys.exit(1)
    names = [d.get("name") for d in doc.get("differences") or []]
    if as_json:
        _out({"authentic": True, "node": doc.get("node"), "status": doc.get("status"),
              "time": doc.get("time"), "differing": names})  # fmt: skip
    else:
        click.echo(f"authentic verdict: {doc.get('node')} {doc.get('status')} at {doc.get('time')}"
                   + (f" differing: {', '.join(map(str, names))}" if names else ""))  # fmt: skip
    if require_pass and doc.get("status") != "pass":
        sys.exit(3)


@attest.command("nonce")
@click.argument("node")
@click.option("--ttl", type=float, default=60.0, show_default=True)
@DB
@JSON
def nonce_cmd(node: str, ttl: float, db_path: Path, as_json: bool) -> None:
    """Issue a nonce for NODE (manual hand-over: fleetyield-agent quote --nonce ...)."""

    nonce, expires = _open_store(db_path).issue_nonce(node, time.time(), ttl)
    _out({"node": node, "nonce": nonce, "expires_at": expires})


@attest.command("check-quote")
@click.argument("quote_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--policy", "policy_file", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "key_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The controller's private key (signs the verdict).")  # fmt: skip
@DB
@JSON
def check_quote_cmd(
    quote_file: Path, policy_file: Path, key_file: Path, db_path: Path, as_json: bool
) -> None:
    """Verify a quote as the listener would and print the signed verdict (exit 1 on fail)."""
    from slurm_fleetyield.attest.policy import PolicyError, load_policy
    from slurm_fleetyield.attest.verify import attest_node
    from slurm_fleetyield.gate.errors import KeyFileError
    from slurm_fleetyield.gate.keys import load_private_key

    quote = _read_json(quote_file)
    try:
        policy = load_policy(policy_file)
        key = load_private_key(key_file)
    except (PolicyError, KeyFileError) as exc:
        raise click.ClickException(str(exc)) from None
    doc = attest_node(
        str(quote.get("node")), quote, time.time(), store=_open_store(db_path), policy=policy, key=key
    )
    _out(doc)
    sys.exit(0 if doc["status"] == "pass" else 1)
