"""keygen, authorized-keys parsing and private-key permission checks (slurm_fleetyield/gate/keys.py)."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from slurm_fleetyield.gate.errors import KeyExists, KeyFileError, UnsafeKeyPermissions
from slurm_fleetyield.gate.keys import (
    KEY_TYPE,
    format_public_line,
    key_id_of,
    keygen,
    load_authorized_keys,
    load_private_key,
    raw_public_bytes,
)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_keygen_writes_0600_pkcs8_and_a_public_line(tmp_path: Path) -> None:
    priv, pub = keygen("alice", tmp_path / "k")
    assert priv.name == "alice.key" and pub.name == "alice.pub"
    assert _mode(priv) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    kind, b64, name = pub.read_text().split()
    assert (kind, name) == (KEY_TYPE, "alice")
    key = load_private_key(priv)
    assert base64.b64decode(b64) == raw_public_bytes(key.public_key())


def test_keygen_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    import os

    old = os.umask(0o000)
    try:
        priv, _ = keygen("alice", tmp_path)
    finally:
        os.umask(old)
    assert _mode(priv) == 0o600


@pytest.mark.parametrize("existing", ["alice.key", "alice.pub"])
def test_keygen_refuses_to_overwrite(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_text("precious")
    with pytest.raises(KeyExists) as e:
        keygen("alice", tmp_path)
    assert existing in str(e.value)
    assert (tmp_path / existing).read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]  # nothing half-written


def test_keygen_refuses_a_planted_symlink(tmp_path: Path) -> None:
    (tmp_path / "alice.key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(KeyExists):
        keygen("alice", tmp_path)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("name", ["", "has space", "-dash-first", "a/b", "x" * 65])
def test_keygen_rejects_bad_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        keygen(name, tmp_path)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o610])
def test_private_key_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    priv, _ = keygen("alice", tmp_path)
    priv.chmod(mode)
    with pytest.raises(UnsafeKeyPermissions) as e:
        load_private_key(priv)
    assert str(priv) in str(e.value) and f"{mode:04o}" in str(e.value)


def test_unsafe_private_key_can_be_loaded_explicitly_with_a_warning(tmp_path: Path) -> None:
    priv, _ = keygen("alice", tmp_path)
    priv.chmod(0o644)
    with pytest.warns(UserWarning, match="too open"):
        key = load_private_key(priv, allow_unsafe_permissions=True)
    assert isinstance(key, Ed25519PrivateKey)


def test_private_key_that_is_not_ed25519_or_not_pem(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    p = tmp_path / "ec.key"
    p.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    p.chmod(0o600)
    with pytest.raises(KeyFileError, match="expected an Ed25519 key"):
        load_private_key(p)
    p.write_text("garbage")
    with pytest.raises(KeyFileError, match="not an unencrypted PEM"):
        load_private_key(p)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_private_key(tmp_path / "missing.key")


def _line(name: str) -> str:
    return format_public_line(name, Ed25519PrivateKey.generate().public_key())


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "authorized_keys"
    p.write_text(text)
    p.chmod(0o644)
    return p


def test_authorized_keys_round_trip(tmp_path: Path) -> None:
    a, b = _line("alice"), _line("bob@site")
    keys = load_authorized_keys(_write(tmp_path, f"# admins\n\n  {a}  \n{b}\n"))
    assert sorted(k.name for k in keys.values()) == ["alice", "bob@site"]
    for key_id, k in keys.items():
        assert key_id == k.key_id == key_id_of(k.raw) and len(key_id) == 16
        assert int(key_id, 16) >= 0


def test_empty_authorized_keys_is_valid(tmp_path: Path) -> None:
    assert load_authorized_keys(_write(tmp_path, "# nobody yet\n")) == {}


_GOOD_B64 = base64.b64encode(bytes(range(32))).decode()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("ssh-ed25519 AAAA alice", "unknown key type"),
        (f"{KEY_TYPE} {_GOOD_B64}", "got 2 fields"),
        (f"{KEY_TYPE} {_GOOD_B64} alice extra", "got 4 fields"),
        (f"{KEY_TYPE} not*base64 alice", "not valid base64"),
        (f"{KEY_TYPE} {base64.b64encode(b'short').decode()} alice", "32 bytes"),
        (f"{KEY_TYPE} {_GOOD_B64} bad/name", "invalid key name"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad: str, message: str) -> None:
    p = _write(tmp_path, f"# admins\n{_line('alice')}\n{bad}\n")
    with pytest.raises(KeyFileError, match=message) as e:
        load_authorized_keys(p)
    assert e.value.line == 3 and e.value.path == p
    assert str(e.value).startswith(f"{p}:3: ")


def test_non_canonical_base64_is_refused(tmp_path: Path) -> None:
    raw = bytes(range(32))
    b64 = base64.b64encode(raw).decode()  # 43 chars + '=': the 43rd carries 2 spare bits
    last = b64[42]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    twin = b64[:42] + alphabet[alphabet.index(last) | 1] + "="
    assert twin != b64 and base64.b64decode(twin) == raw
    with pytest.raises(KeyFileError, match="canonical"):
        load_authorized_keys(_write(tmp_path, f"{KEY_TYPE} {twin} alice\n"))


def test_duplicate_name_is_refused(tmp_path: Path) -> None:
    p = _write(tmp_path, f"{_line('alice')}\n{_line('bob')}\n{_line('alice')}\n")
    with pytest.raises(KeyFileError, match=r"duplicate name 'alice' \(first on line 1\)") as e:
        load_authorized_keys(p)
    assert e.value.line == 3


def test_duplicate_key_is_refused(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate().public_key()
    p = _write(tmp_path, f"{format_public_line('alice', key)}\n{format_public_line('alias', key)}\n")
    with pytest.raises(KeyFileError, match=r"duplicate key .*line 1.*'alice'") as e:
        load_authorized_keys(p)
    assert e.value.line == 2


def test_group_writable_authorized_keys_is_refused(tmp_path: Path) -> None:
    p = _write(tmp_path, _line("alice") + "\n")
    p.chmod(0o664)
    with pytest.raises(UnsafeKeyPermissions, match="write"):
        load_authorized_keys(p)


def test_missing_authorized_keys(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        load_authorized_keys(tmp_path / "nope")
