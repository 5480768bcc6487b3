"""The client side of a web-config listener: basic auth and TLS for the requests FleetYield sends, set the
way a Prometheus scrape config sets them.

Input: an ``HttpClientConfig`` (pydantic; a TOML table) in the shape of Prometheus' ``basic_auth`` and
``tls_config``::

    basic_auth = {username = "agent", password_file = "/etc/fleetyield/push.password"}
    [tls_config]
    ca_file = "/etc/fleetyield/ca.crt"        # trust this CA (unset: the system's trust store)
    cert_file = "/etc/fleetyield/node.crt"    # client certificate, for RequireAndVerifyClientCert
    key_file = "/etc/fleetyield/node.key"
    insecure_skip_verify = false              # true: no server certificate check (tests only)

Output: ``HttpClient.open(request, timeout_s)``, ``urllib.request.urlopen`` with the Authorization header
and the TLS context added; or, when the config is built (``HttpClient(cfg, where)``), a ``ValueError``
naming the field and the value (``sense.tls_config.ca_file: cannot load ... (got '...')``): a client
that could not authenticate never starts.

Used by the agent's senders (fatal-event push, outcomes; ``node_agent/spool.py``) and by the controller's
scraper and reset client, which speak to listeners served with ``node_agent/webconfig.py``. Like
Prometheus, the password file is read at every request and the TLS files are reloaded when their mtime
changes, so a rotated password or client certificate is picked up without a restart; a rotated file that
does not load keeps the last good context and logs why. Only ``password_file`` is accepted (no inline
``password``): secrets stay out of config files that are world-readable by habit. ``server_name`` is
refused: urllib's HTTPS connection verifies the URL's host name and cannot be told another one.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import threading
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)
_STRICT = ConfigDict(extra="forbid", strict=True)


class BasicAuthConfig(BaseModel):
    """Prometheus' ``basic_auth``: a user name and the file holding its password."""

    model_config = _STRICT

    username: str = Field(min_length=1, description="User name sent in the Authorization header.")
    password_file: str = Field(min_length=1, description="File holding the password (read per request).")


class TlsClientConfig(BaseModel):
    """Prometheus' ``tls_config`` (client side)."""

    model_config = _STRICT

    ca_file: str | None = Field(None, description="CA bundle the server certificate must chain to.")
    cert_file: str | None = Field(None, description="Client certificate (PEM), sent when asked.")
    key_file: str | None = Field(None, description="Client private key (PEM).")
    insecure_skip_verify: bool = Field(False, description="Skip the server certificate check (tests only).")


class HttpClientConfig(BaseModel):
    """How to authenticate to a listener served with a web-config file."""

    model_config = _STRICT

    basic_auth: BasicAuthConfig | None = None
    tls_config: TlsClientConfig | None = None


class ClientConfigError(ValueError):
    """A client config that cannot be used: ``file`` is the file that failed, ``str()`` names the field and
    the value."""

    def __init__(self, file: str, problem: str) -> None:
        super().__init__(problem)
        self.file = file
        self.problem = problem


def _mtime(path: str | None) -> float | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class HttpClient:
    """Sends requests authenticated per ``cfg``. ``where`` prefixes the field in error messages, with its
    separator: ``"sense."`` gives ``sense.tls_config.ca_file``, ``"push_"`` ``push_tls_config.ca_file``."""

    def __init__(self, cfg: HttpClientConfig, where: str) -> None:
        self.cfg = cfg
        self.where = where
        self._lock = threading.Lock()
        self._stamp: tuple[float | None, ...] = ()
        self._context: ssl.SSLContext | None = None
        self.reload_errors = 0
        if cfg.basic_auth is not None:
            self._password()  # unreadable now: refuse to start
        if cfg.tls_config is not None:
            self._context = self._build()
            self._stamp = self._stamps()

    # ------------------------------------------------------------------ parts
    def _password(self) -> str:
        auth = self.cfg.basic_auth
        assert auth is not None
        try:
            text = Path(auth.password_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ClientConfigError(
                auth.password_file,
                f"{self.where}basic_auth.password_file: cannot read: {getattr(exc, 'strerror', None) or exc} "
                f"(got {auth.password_file!r})",
            ) from None
        password = text.rstrip("\r\n")
        if not password:
            problem = f"{self.where}basic_auth.password_file: empty (got {auth.password_file!r})"
            raise ClientConfigError(auth.password_file, problem)
        return password

    def _stamps(self) -> tuple[float | None, ...]:
        tls = self.cfg.tls_config
        assert tls is not None
        return (_mtime(tls.ca_file), _mtime(tls.cert_file), _mtime(tls.key_file))

    def _build(self) -> ssl.SSLContext:
        tls = self.cfg.tls_config
        assert tls is not None
        field = f"{self.where}tls_config"
        if (tls.cert_file is None) != (tls.key_file is None):
            raise ClientConfigError(
                str(tls.cert_file or tls.key_file),
                f"{field}: cert_file and key_file go together (got {tls.cert_file!r}, {tls.key_file!r})",
            )
        try:
            ctx = ssl.create_default_context(cafile=tls.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ClientConfigError(
                str(tls.ca_file), f"{field}.ca_file: cannot load: {exc} (got {tls.ca_file!r})"
            ) from None
        if tls.cert_file is not None:
            try:
                ctx.load_cert_chain(tls.cert_file, tls.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ClientConfigError(
                    str(tls.cert_file),
                    f"{field}.cert_file/key_file: cannot load certificate and key: {exc} "
                    f"(got {tls.cert_file!r}, {tls.key_file!r})",
                ) from None
        if tls.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def context(self) -> ssl.SSLContext | None:
        """The TLS context, rebuilt when a TLS file changed; a change that fails keeps the old one."""
        if self.cfg.tls_config is None:
            return None
        stamp = self._stamps()
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._context = self._build()
                    log.info("%stls_config: files changed: reloaded", self.where)
                except ClientConfigError as exc:
                    self.reload_errors += 1
                    log.error("%s (keeping the previous TLS files)", exc)
            return self._context

    def headers(self) -> dict[str, str]:
        if self.cfg.basic_auth is None:
            return {}
        token = f"{self.cfg.basic_auth.username}:{self._password()}".encode()
        return {"Authorization": "Basic " + base64.b64encode(token).decode()}

    # ------------------------------------------------------------------ the request
    def open(self, request: urllib.request.Request, timeout_s: float) -> Any:
        """``urlopen`` with this client's credentials; raises as urlopen does (ValueError: password file
        unreadable now)."""
        for name, value in self.headers().items():
            request.add_unredirected_header(name, value)
        return urllib.request.urlopen(request, timeout=timeout_s, context=self.context())


def urlopen(request: urllib.request.Request, timeout_s: float, client: HttpClient | None) -> Any:
    """``client.open`` when a client is configured, plain ``urlopen`` otherwise."""
    if client is None:
        return urllib.request.urlopen(request, timeout=timeout_s)
    return client.open(request, timeout_s)
