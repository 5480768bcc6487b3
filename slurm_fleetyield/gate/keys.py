"""Admin signing keys: generation, the authorized-keys file, and safe loading of private keys.

Input: a key name and a directory (``keygen``), an authorized-keys file, a private key file. Output: key files
on disk, ``AdminKey`` values indexed by ``key_id``, an ``Ed25519PrivateKey``.

File formats
------------
* Private key: PEM, PKCS#8, unencrypted, mode 0600, written with ``O_EXCL`` (never overwritten). Protect it
  like an SSH key; a passphrase is left to the filesystem (home directory, smartcard-backed home, ...).
* Public key / authorized keys, one key per line, like OpenSSH's ``authorized_keys``::

      fleetyield-ed25519 <base64 of the raw 32-byte Ed25519 public key> <name>

  Blank lines and lines starting with ``#`` are ignored.
  ``name`` matches ``[A-Za-z0-9][A-Za-z0-9._@-]{0,63}``. Names and keys must be unique.
  Revoking an admin = deleting the line.
* ``key_id`` = first 16 hex digits of sha256(raw 32-byte public key). It travels in every signed statement.

Permissions: a private key readable or writable by group/others is refused (as OpenSSH does) unless the
caller explicitly allows it, in which case a ``UserWarning`` is emitted. An authorized-keys file writable by
group/others is refused: whoever can write it can add themselves as an admin.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from slurm_fleetyield.gate.errors import KeyExists, KeyFileError, UnsafeKeyPermissions

KEY_TYPE = "fleetyield-ed25519"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
PRIVATE_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"


@dataclass(frozen=True, slots=True)
class AdminKey:
    """One authorized admin: the name shown in the audit log, the public key, and its short id."""

    name: str
    public_key: Ed25519PublicKey
    key_id: str

    @property
    def raw(self) -> bytes:
        return raw_public_bytes(self.public_key)


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(public_key: Ed25519PublicKey | bytes) -> str:
    """First 16 hex digits of sha256 over the raw 32-byte public key."""
    raw = public_key if isinstance(public_key, bytes) else raw_public_bytes(public_key)
    return hashlib.sha256(raw).hexdigest()[:16]


def format_public_line(name: str, public_key: Ed25519PublicKey) -> str:
    """The authorized-keys line for ``public_key`` (no trailing newline)."""
    _check_name(name)
    b64 = base64.b64encode(raw_public_bytes(public_key)).decode("ascii")
    return f"{KEY_TYPE} {b64} {name}"


def _check_name(name: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise ValueError(f"key name {name!r} must match {NAME_RE.pattern}")


def keygen(name: str, out_dir: str | Path) -> tuple[Path, Path]:
    """Create ``<out_dir>/<name>.key`` (PKCS#8 PEM, 0600) and ``<out_dir>/<name>.pub`` (authorized-keys line).

    Refuses (``KeyExists``) if either file exists; nothing is written then. Returns (private, public) paths.
    The admin keeps the ``.key``; the cluster operator appends the ``.pub`` line to the authorized-keys file.
    """
    _check_name(name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_path = out / f"{name}{PRIVATE_SUFFIX}"
    public_path = out / f"{name}{PUBLIC_SUFFIX}"
    for p in (private_path, public_path):
        if p.exists() or p.is_symlink():
            raise KeyExists(p, "refusing to overwrite an existing key file")

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_exclusive(private_path, pem, 0o600)
    try:
        line = format_public_line(name, key.public_key()) + "\n"
        _write_exclusive(public_path, line.encode("ascii"), 0o644)
    except BaseException:
        private_path.unlink(missing_ok=True)  # no half-made key pair left behind
        raise
    return private_path, public_path


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL closes the race between the exists() check and the write; O_NOFOLLOW refuses a planted symlink.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError as e:
        raise KeyExists(path, "refusing to overwrite an existing key file") from e
    try:
        os.fchmod(fd, mode)  # the umask may have removed bits; make the mode exact
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def load_private_key(path: str | Path, *, allow_unsafe_permissions: bool = False) -> Ed25519PrivateKey:
    """Load an admin's private key, refusing group/other-accessible files (``UnsafeKeyPermissions``).

    With ``allow_unsafe_permissions=True`` such a file is loaded with a ``UserWarning`` instead.
    """
    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes()
    except OSError as e:
        raise KeyFileError(p, f"cannot read private key: {e.strerror or e}") from e
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        msg = f"private key permissions {mode:04o} are too open (group/others have access); chmod 600 it"
        if not allow_unsafe_permissions:
            raise UnsafeKeyPermissions(p, msg)
        warnings.warn(f"{p}: {msg}", UserWarning, stacklevel=2)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise KeyFileError(p, f"not an unencrypted PEM private key: {e}") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(p, f"expected an Ed25519 key, got {type(key).__name__}")
    return key


def parse_public_line(line: str, *, path: str | Path = "<string>", lineno: int | None = None) -> AdminKey:
    """Parse one ``fleetyield-ed25519 <base64> <name>`` line. Errors name ``path`` and ``lineno``."""
    fields = line.split()
    if len(fields) != 3:
        raise KeyFileError(
            path, f"expected '{KEY_TYPE} <base64-key> <name>', got {len(fields)} fields", lineno
        )
    kind, b64, name = fields
    if kind != KEY_TYPE:
        raise KeyFileError(path, f"unknown key type {kind!r} (expected {KEY_TYPE!r})", lineno)
    if not NAME_RE.fullmatch(name):
        raise KeyFileError(path, f"invalid key name {name!r} (must match {NAME_RE.pattern})", lineno)
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise KeyFileError(path, f"key is not valid base64: {e}", lineno) from e
    if len(raw) != 32:
        raise KeyFileError(path, f"an Ed25519 public key is 32 bytes, got {len(raw)}", lineno)
    if base64.b64encode(raw).decode("ascii") != b64:
        raise KeyFileError(path, "key is not canonical base64", lineno)
    try:
        public_key = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as e:
        raise KeyFileError(path, f"not a valid Ed25519 public key: {e}", lineno) from e
    return AdminKey(name=name, public_key=public_key, key_id=key_id_of(raw))


def load_authorized_keys(path: str | Path) -> dict[str, AdminKey]:
    """Read an authorized-keys file into ``{key_id: AdminKey}``.

    Raises ``KeyFileError`` naming the file and line for a malformed line, a duplicate name or a duplicate
    key, and ``UnsafeKeyPermissions`` if group/others may write the file. An empty file is valid (no admins:
    every envelope is then rejected as ``unknown_key``).
    """
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise KeyFileError(p, f"cannot read authorized keys: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise KeyFileError(p, f"not UTF-8: {e}") from e
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise UnsafeKeyPermissions(
            p, f"permissions {mode:04o} let group/others write the file (and add an admin); chmod go-w it"
        )

    keys: dict[str, AdminKey] = {}
    names: dict[str, int] = {}
    lines_of: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key = parse_public_line(stripped, path=p, lineno=lineno)
        if key.name in names:
            raise KeyFileError(p, f"duplicate name {key.name!r} (first on line {names[key.name]})", lineno)
        if key.key_id in keys:
            raise KeyFileError(
                p,
                f"duplicate key (already on line {lines_of[key.key_id]} as {keys[key.key_id].name!r})",
                lineno,
            )
        names[key.name] = lineno
        lines_of[key.key_id] = lineno
        keys[key.key_id] = key
    return keys
