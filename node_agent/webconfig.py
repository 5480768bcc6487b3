"""The web-config file of Prometheus' exporter-toolkit (dcgm-exporter's ``--web-config-file``): TLS and
basic auth for an HTTP listener.

Input: a YAML file in the exporter-toolkit format::

    tls_server_config:
      cert_file: server.crt          # PEM; or cert: <inline PEM>
      key_file: server.key           # PEM; or key: <inline PEM>
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert (default) | VerifyClientCertIfGiven
      client_ca_file: clients-ca.crt
      client_allowed_sans: [prometheus.example]      # optional: a verified client cert must carry one
      min_version: TLS12             # TLS10 | TLS11 | TLS12 (default) | TLS13
      max_version: TLS13
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')
    http_server_config:
      headers: {X-Frame-Options: deny}   # accepted and ignored: not served (a warning says so)

Output: a ``WebConfig`` (``tls_context()``, ``basic_auth.allows(header)``, ``peer_allowed(cert)``) or a
``WebConfigError`` naming the file, the field and the value; a listener given a bad file never starts.

What differs from exporter-toolkit, refused rather than silently ignored: ``RequestClientCert`` and
``RequireAnyClientCert`` (Python's TLS verifies every client certificate it asks for), ``cipher_suites``,
``curve_preferences`` and ``prefer_server_cipher_suites`` (Go names; OpenSSL's defaults apply),
``rate_limit``.

Reload (``WebConfigWatcher``): the listener's loop checks, once a second, the mtimes of the file and of the
files it names (cert_file, key_file, client_ca_file); a change seen at one check and unchanged at the next
is loaded, so an admin rotates certificates without a restart, and a certificate written a moment before
its key is not loaded half-way. Once a second and not at every new connection: the cost stays a few
``stat`` calls a second under a flood of connections, and a rotated certificate is served within two
seconds. A new file that does not load keeps the old config; the error (file, field, value) is logged and
counted once per change. Connections already open keep the TLS session they have.

Basic auth: bcrypt (package ``bcrypt``) is ~50 ms per check at cost 10, so answers are cached by
(user, SHA-256 of the password): a scraper's repeated header costs a dict lookup, a flood of wrong
passwords at most one bcrypt per distinct password and worker. PyYAML and bcrypt are imported only when a
file is given.
"""

from __future__ import annotations

import hashlib
import logging
import os
import ssl
import tempfile
import threading
from base64 import b64decode
from collections import OrderedDict
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

log = logging.getLogger(__name__)
_STRICT = ConfigDict(extra="forbid", strict=True)
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_UNSUPPORTED_AUTH = {"RequestClientCert", "RequireAnyClientCert"}
_CACHE_MAX = 1024


class WebConfigError(ValueError):
    """A web-config file that cannot be used: ``str()`` names the file, the field and the value
    (``path`` and ``problem`` apart)."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class TlsServerConfig(BaseModel):
    model_config = _STRICT

    cert_file: str | None = Field(None, description="Server certificate chain (PEM).")
    key_file: str | None = Field(None, description="Server private key (PEM).")
    cert: str | None = Field(None, description="Inline server certificate (PEM), instead of cert_file.")
    key: str | None = Field(None, description="Inline private key (PEM), instead of key_file.")
    client_auth_type: Literal[
        "NoClientCert",
        "RequestClientCert",
        "RequireAnyClientCert",
        "VerifyClientCertIfGiven",
        "RequireAndVerifyClientCert",
    ] = Field("NoClientCert", description="Client certificate policy.")
    client_ca_file: str | None = Field(None, description="CA bundle verifying client certificates.")
    client_allowed_sans: list[str] | None = Field(None, description="A client cert must carry one of these.")
    min_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS12"
    max_version: Literal["TLS10", "TLS11", "TLS12", "TLS13"] = "TLS13"
    cipher_suites: list[str] | None = None
    curve_preferences: list[str] | None = None
    prefer_server_cipher_suites: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> TlsServerConfig:
        for name in ("cipher_suites", "curve_preferences", "prefer_server_cipher_suites"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} is not supported here (OpenSSL's defaults apply): remove it")
        if self.client_auth_type in _UNSUPPORTED_AUTH:
            raise ValueError(
                f"client_auth_type {self.client_auth_type!r} is not supported (Python's TLS verifies every "
                "client certificate it asks for): use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
            )
        if (self.cert_file is None) == (self.cert is None):
            raise ValueError("exactly one of cert_file and cert is required")
        if (self.key_file is None) == (self.key is None):
            raise ValueError("exactly one of key_file and key is required")
        needs_ca = self.client_auth_type != "NoClientCert"
        if needs_ca and not self.client_ca_file:
            raise ValueError(f"client_ca_file is required with client_auth_type {self.client_auth_type!r}")
        if self.client_allowed_sans and not needs_ca:
            raise ValueError("client_allowed_sans needs a client_auth_type that verifies client certificates")
        if _VERSIONS[self.min_version] > _VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self


class HttpServerConfig(BaseModel):
    model_config = _STRICT

    http2: bool = True
    headers: dict[str, str] | None = None


class WebConfigFile(BaseModel):
    model_config = _STRICT

    tls_server_config: TlsServerConfig | None = None
    basic_auth_users: dict[str, str] | None = None
    http_server_config: HttpServerConfig | None = None

    @field_validator("basic_auth_users")
    @classmethod
    def _hashes(cls, users: dict[str, str] | None) -> dict[str, str] | None:
        for user, hashed in (users or {}).items():
            if ":" in user:
                raise ValueError(f"user name {user!r} contains ':'")
            if not (hashed.startswith(("$2a$", "$2b$", "$2y$")) and len(hashed) == 60):
                raise ValueError(f"{user}: not a bcrypt hash (got {hashed[:7]!r}...)")
        return users


class BasicAuth:
    """Checks an ``Authorization: Basic`` header against bcrypt hashes, caching answers (module doc)."""

    def __init__(self, users: dict[str, str]) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self._users = {u: h.encode() for u, h in users.items()}
        self._dummy = bcrypt.hashpw(b"fleetyield", bcrypt.gensalt(4))  # unknown user: same code path
        self._cache: OrderedDict[tuple[str, bytes], bool] = OrderedDict()
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, sep, password = b64decode(header[6:].strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        key = (user, hashlib.sha256(password.encode()).digest())
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        hashed = self._users.get(user)
        ok = self._bcrypt.checkpw(password.encode(), hashed if hashed is not None else self._dummy)
        ok = ok and hashed is not None
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > _CACHE_MAX:
                self._cache.popitem(last=False)
        return ok


class WebConfig:
    """A loaded web-config file: the TLS context to serve with and the basic-auth users, if any."""

    def __init__(self, path: Path, spec: WebConfigFile, context: ssl.SSLContext | None) -> None:
        self.path = path
        self.spec = spec
        self._context = context
        users = spec.basic_auth_users
        self.basic_auth = BasicAuth(users) if users else None
        tls = spec.tls_server_config
        self._sans = set(tls.client_allowed_sans) if tls and tls.client_allowed_sans else None

    def tls_context(self) -> ssl.SSLContext | None:
        return self._context

    def peer_allowed(self, cert: dict[str, Any] | None) -> bool:
        """A verified client certificate carries one of ``client_allowed_sans`` (when that is set)."""
        if self._sans is None:
            return True
        if not cert:  # VerifyClientCertIfGiven and none given: no SAN to allow
            return False
        values = {str(v) for _, v in cert.get("subjectAltName", ())}
        return bool(values & self._sans)

    @property
    def scheme(self) -> str:
        return "https" if self._context is not None else "http"


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def load_web_config(path: str | Path) -> WebConfig:
    """Read, validate and build: every failure is a ``WebConfigError`` naming file, field and value."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WebConfigError(path, f"cannot read web config: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise WebConfigError(path, f"not UTF-8 text at offset {exc.start}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(path, f"not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise WebConfigError(path, f"(top level): must be a mapping (got {type(data).__name__})")
    if "rate_limit" in data:
        raise WebConfigError(path, f"rate_limit: not supported here (got {data['rate_limit']!r})")
    try:
        spec = WebConfigFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            value = err.get("input")
            shown = "" if isinstance(value, dict) else f" (got {value!r})"
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{_where(err['loc'])}: {msg}{shown}")
        raise WebConfigError(path, "; ".join(problems)) from None
    if spec.http_server_config and spec.http_server_config.headers:
        log.warning("%s: http_server_config.headers are not served by this listener", path)
    return WebConfig(path, spec, _context(path, spec.tls_server_config))


def _file(path: Path, field: str, name: str) -> str:
    """A file named in the config, relative to the config's directory as exporter-toolkit resolves it."""
    p = Path(name)
    if not p.is_absolute():
        p = path.parent / p
    if not p.is_file():
        raise WebConfigError(path, f"tls_server_config.{field}: no such file (got {name!r})")
    return str(p)


def _context(path: Path, tls: TlsServerConfig | None) -> ssl.SSLContext | None:
    if tls is None:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = _VERSIONS[tls.min_version]
        ctx.maximum_version = _VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError) as exc:
        raise WebConfigError(
            path, f"tls_server_config.min_version: {exc} (got {tls.min_version!r})"
        ) from None
    with tempfile.TemporaryDirectory() as tmp:
        cert = _file(path, "cert_file", tls.cert_file) if tls.cert_file else _inline(tmp, "cert", tls.cert)
        key = _file(path, "key_file", tls.key_file) if tls.key_file else _inline(tmp, "key", tls.key)
        try:
            ctx.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            field = "cert_file" if tls.cert_file else "cert"
            raise WebConfigError(
                path,
                f"tls_server_config.{field}/key: cannot load certificate and key: {exc} "
                f"(got {tls.cert_file or '<inline>'!r}, {tls.key_file or '<inline>'!r})",
            ) from None
    if tls.client_auth_type != "NoClientCert":
        assert tls.client_ca_file is not None
        ca = _file(path, "client_ca_file", tls.client_ca_file)
        try:
            ctx.load_verify_locations(ca)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(
                path, f"tls_server_config.client_ca_file: cannot load: {exc} (got {tls.client_ca_file!r})"
            ) from None
        ctx.verify_mode = (
            ssl.CERT_REQUIRED if tls.client_auth_type == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        )
    return ctx


def _inline(tmp: str, name: str, pem: str | None) -> str:
    assert pem is not None
    p = Path(tmp) / name
    p.write_text(pem)
    p.chmod(0o600)
    return str(p)


def _referenced(web: WebConfig) -> list[Path]:
    """The files a loaded config names (what a rotation changes besides the config itself)."""
    tls = web.spec.tls_server_config
    names = [tls.cert_file, tls.key_file, tls.client_ca_file] if tls is not None else []
    out = [web.path]
    for name in names:
        if name:
            p = Path(name)
            out.append(p if p.is_absolute() else web.path.parent / p)
    return out


def _stamp(paths: list[Path]) -> tuple[tuple[int, int] | None, ...]:
    out: list[tuple[int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


class WebConfigWatcher:
    """Re-reads a web-config file when it or a file it names changes (module doc, "Reload"). ``check()``
    is called by the listener's loop thread about once a second; it returns the new ``WebConfig`` when one
    was loaded, else None. ``reloads`` and ``errors`` count what happened; ``last_error`` says why."""

    def __init__(self, web: WebConfig) -> None:
        self.current = web
        self._paths = _referenced(web)
        self._loaded = _stamp(self._paths)  # what ``current`` was read from
        self._seen = self._loaded  # the stamp at the previous check
        self._failed: tuple[tuple[int, int] | None, ...] | None = None
        self.reloads = 0
        self.errors = 0
        self.last_error: str | None = None

    def check(self) -> WebConfig | None:
        stamp = _stamp(self._paths)
        settled = stamp == self._seen
        self._seen = stamp
        if stamp == self._loaded or stamp == self._failed or not settled:
            return None
        try:
            web = load_web_config(self.current.path)
        except WebConfigError as exc:
            self._failed = stamp
            self.errors += 1
            self.last_error = str(exc)
            log.error("%s (web config not reloaded: the previous one stays in force)", exc)
            return None
        self.current = web
        self._paths = _referenced(web)
        self._loaded = self._seen = _stamp(self._paths)
        self._failed = None
        self.reloads += 1
        self.last_error = None
        log.info("%s: web config reloaded (%s)", web.path, web.scheme)
        return web
