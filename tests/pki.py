"""A throw-away PKI for TLS tests: a CA, and certificates it signs, written as PEM files (``cryptography``).

``make_pki(directory)`` returns the paths: ``ca``, ``server_cert``/``server_key`` (SAN ``localhost``) and
``client_cert``/``client_key`` (SAN ``node-client``); ``issue(directory, name, ca, san)`` signs one more.
Importable as ``pki`` from every test directory (tests/conftest.py)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def issue(directory: Path, name: str, ca: tuple[Any, x509.Name] | None = None, san: str = "localhost"):  # type: ignore[no-untyped-def]
    """(cert path, key path, (key, subject)) of a new certificate; self-signed CA when ``ca`` is None."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    signer_key, signer_name = ca if ca else (key, subject)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=ca is None, path_length=None), critical=True)
        .sign(signer_key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path, (key, subject)


def make_pki(directory: Path, client_san: str = "node-client") -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, _, ca = issue(directory, "ca")
    server_cert, server_key, _ = issue(directory, "server", ca, "localhost")
    client_cert, client_key, _ = issue(directory, "client", ca, client_san)
    return {
        "ca": ca_cert,
        "server_cert": server_cert,
        "server_key": server_key,
        "client_cert": client_cert,
        "client_key": client_key,
    }


def web_config_with_user(
    directory: Path, user: str = "admin", password: str = "admin-pass", tls: bool = True
) -> tuple[dict[str, Path] | None, Path, Path]:
    """A listener's web-config under ``directory`` (exporter-toolkit format: basic auth for ``user``, and
    with ``tls`` a server certificate from a fresh PKI) and ``user``'s password file (0600):
    ``(pki or None, web.yml, password file)``."""
    import bcrypt

    pki = make_pki(directory / "pki") if tls else None
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    web = directory / "web.yml"
    server = ""
    if pki:
        server = f"tls_server_config:\n  cert_file: {pki['server_cert']}\n  key_file: {pki['server_key']}\n"
    web.write_text(f"{server}basic_auth_users:\n  {user}: '{hashed}'\n")
    secret = directory / f"{user}.password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    return pki, web, secret
