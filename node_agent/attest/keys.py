"""The node's Ed25519 attestation key: ``STATE_DIR/node.key``, made on first use, exported for enrolment.

Input: the agent state dir and the node name. Output: the private key (PKCS#8 PEM, mode 0600, created with
``O_EXCL|O_NOFOLLOW`` so a planted file or link is never written through or silently replaced) and its
public line in the same format as the admin keys of ``slurm_fleetyield.gate.keys``::

    fleetyield-ed25519 <base64 of the raw 32-byte public key> <node name>

``key_id`` = the first 16 hex digits of sha256(raw public key), as for admin keys. A key file that group or
others can read is refused: whoever reads it can sign quotes as this node.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_FILE = "node.key"
PUBLIC_FILE = "node.pub"
KEY_TYPE = "fleetyield-ed25519"


class NodeKeyError(RuntimeError):
    """The node key cannot be made or loaded; the message names the file."""


def raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(public_key: Ed25519PublicKey | bytes) -> str:
    raw = public_key if isinstance(public_key, bytes) else raw_public(public_key)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_line(public_key: Ed25519PublicKey, name: str) -> str:
    return f"{KEY_TYPE} {base64.b64encode(raw_public(public_key)).decode('ascii')} {name}"


def load_or_create(state_dir: Path) -> Ed25519PrivateKey:
    path = Path(state_dir) / KEY_FILE
    try:
        return _load(path)
    except FileNotFoundError:
        pass
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _load(path)  # another process made it first: use theirs
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def _load(path: Path) -> Ed25519PrivateKey:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise NodeKeyError(f"{path}: cannot open the node key: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise NodeKeyError(
            f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets group/others read it; chmod 600"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise NodeKeyError(f"{path}: not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise NodeKeyError(f"{path}: expected an Ed25519 key, got {type(key).__name__}")
    return key


def export_public(state_dir: Path, name: str) -> str:
    """The enrolment line (the key is made if needed), also written to ``STATE_DIR/node.pub``."""
    line = public_line(load_or_create(state_dir).public_key(), name)
    pub = Path(state_dir) / PUBLIC_FILE
    tmp = pub.with_name(f".{PUBLIC_FILE}.{os.getpid()}")
    tmp.write_text(line + "\n", encoding="ascii")
    os.chmod(tmp, 0o644)
    os.replace(tmp, pub)
    return line
