"""The hooks' HTTP client for the controller (stdlib only, cheap to import): one GET with one overall
deadline, authenticated with hooks.conf's ``controller_basic_auth_*`` and ``controller_tls_config_*``.

Input: a ``HookConfig`` and a URL. Output: ``get(config, url, timeout_s) -> (status, body)``, or
``ControllerAuthError`` when our credentials did not get us in: the controller answered HTTP 401 or 403,
the TLS handshake failed on a certificate (theirs not trusted, ours missing or refused), or hooks.conf's
client settings cannot be used (an unreadable or empty password file, a certificate without its key, TLS
settings for an http:// URL). That is a configuration error, never an outage, and the callers say so
loudly (prolog.py, healthcheck.py). Any other exception means the controller did not answer.

The rules are those of ``node_agent/httpclient.py`` (what the agent's pushes use): the password comes from
its file, read at every request, never from the config itself; cert_file and key_file go together. Re-done
on the stdlib because the Prolog runs before every job, must work where node_agent is not installed, and
must not pay for pydantic or ``urllib.request`` imports: an http:// URL is fetched over a bare socket
(HTTP/1.0, ~1 ms), an https:// one through ``http.client``.
"""

from __future__ import annotations

import time

from prolog_epilog._hooklib import HookConfig

TYPE_CHECKING = False  # typing costs ms of import before every job
if TYPE_CHECKING:
    import ssl

MAX_ANSWER = 1 << 20


class ControllerAuthError(Exception):
    """Our credentials or TLS settings did not get us in (``str()`` says which, and what to set)."""


def _tls_settings(config: HookConfig) -> tuple[str, str, str]:
    return (
        config.controller_tls_config_ca_file,
        config.controller_tls_config_cert_file,
        config.controller_tls_config_key_file,
    )


def auth_headers(config: HookConfig) -> dict[str, str]:
    """The Authorization header of ``controller_basic_auth_*`` ({} when unset); the password file is read
    now, so a rotated password is sent at the next request."""
    user = config.controller_basic_auth_username
    path = config.controller_basic_auth_password_file
    if not user and not path:
        return {}
    if not user or not path:
        raise ControllerAuthError(
            "hooks.conf: controller_basic_auth_username and controller_basic_auth_password_file go together "
            f"(got {user!r}, {path!r})"
        )
    try:
        with open(path, encoding="utf-8") as fh:
            password = fh.read().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ControllerAuthError(
            f"hooks.conf: controller_basic_auth_password_file: cannot read: {reason} (got {path!r})"
        ) from None
    if not password:
        raise ControllerAuthError(f"hooks.conf: controller_basic_auth_password_file: empty (got {path!r})")
    import base64

    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _tls_context(config: HookConfig) -> ssl.SSLContext | None:
    ca, cert, key = _tls_settings(config)
    if not (ca or cert or key):
        return None
    import ssl

    if bool(cert) != bool(key):
        raise ControllerAuthError(
            "hooks.conf: controller_tls_config_cert_file and controller_tls_config_key_file go together "
            f"(got {cert!r}, {key!r})"
        )
    try:
        ctx = ssl.create_default_context(cafile=ca or None)
    except (OSError, ssl.SSLError) as exc:
        raise ControllerAuthError(
            f"hooks.conf: controller_tls_config_ca_file: cannot load: {exc} (got {ca!r})"
        ) from None
    if cert:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ControllerAuthError(
                "hooks.conf: controller_tls_config_cert_file/key_file: cannot load certificate and key: "
                f"{exc} (got {cert!r}, {key!r})"
            ) from None
    return ctx


def get(config: HookConfig, url: str, timeout_s: float) -> tuple[int, bytes]:
    """GET ``url`` with ``config``'s credentials within ``timeout_s`` (connect + send + read)."""
    headers = auth_headers(config)
    scheme, _, rest = url.partition("://")
    hostport, _, path = rest.partition("/")
    path = "/" + path
    if scheme == "https":
        status, body = _https_get(hostport, path, timeout_s, headers, _tls_context(config))
    elif scheme == "http":
        if any(_tls_settings(config)):
            raise ControllerAuthError(
                f"hooks.conf: controller_tls_config_* is set but {url!r} is not an https:// URL"
            )
        status, body = _http_get(hostport, path, timeout_s, headers)
    else:
        raise ValueError(f"unsupported controller_url scheme {scheme!r}")
    if status in (401, 403):
        sent = (
            f"user {config.controller_basic_auth_username!r} (controller_basic_auth_password_file "
            f"{config.controller_basic_auth_password_file})"
            if headers
            else "no credentials (controller_basic_auth_username/password_file unset)"
        )
        raise ControllerAuthError(
            f"{url} refused our credentials: HTTP {status}; we sent {sent}: make hooks.conf match the "
            "controller's [api] web_config_file"
        )
    return status, body


def _http_get(hostport: str, path: str, timeout_s: float, headers: dict[str, str]) -> tuple[int, bytes]:
    """Minimal HTTP/1.0 GET with one overall deadline (connect + send + read).

    Hand-rolled on ``socket`` because ``urllib.request`` costs ~20 ms of imports (ssl, email, http.client)
    on every job start."""
    deadline = time.monotonic() + timeout_s
    host, port = hostport, 80
    if hostport.startswith("["):  # [v6]:port
        host, _, tail = hostport[1:].partition("]")
        if tail.startswith(":"):
            port = int(tail[1:])
    elif ":" in hostport:
        host, _, port_s = hostport.rpartition(":")
        port = int(port_s)
    import socket

    def remaining() -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {timeout_s * 1000:.0f} ms")
        return left

    extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    with socket.create_connection((host, port), timeout=remaining()) as sock:
        request = (
            f"GET {path} HTTP/1.0\r\nHost: {hostport}\r\n{extra}"
            "Accept: application/json\r\nConnection: close\r\n\r\n"
        )
        sock.settimeout(remaining())
        sock.sendall(request.encode("ascii"))
        chunks = []
        size = 0
        while True:
            sock.settimeout(remaining())
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size > MAX_ANSWER:
                raise ValueError("answer larger than 1 MiB")
    raw = b"".join(chunks)
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError("malformed HTTP answer")
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/"):
        raise ValueError("malformed HTTP status line")
    return int(status_line[1]), body


def _https_get(
    hostport: str,
    path: str,
    timeout_s: float,
    headers: dict[str, str],
    context: ssl.SSLContext | None,
) -> tuple[int, bytes]:
    import http.client
    import ssl

    conn = http.client.HTTPSConnection(hostport, timeout=timeout_s, context=context)
    try:
        conn.request("GET", path, headers={"Accept": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_ANSWER)
    except ssl.SSLCertVerificationError as exc:
        raise ControllerAuthError(
            f"https://{hostport}: the controller's certificate does not verify ({exc.verify_message}): set "
            "hooks.conf's controller_tls_config_ca_file to the CA that signed it"
        ) from None
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError):
        raise  # the connection went away: no answer, not a refusal
    except ssl.SSLError as exc:
        raise ControllerAuthError(
            f"https://{hostport}: TLS handshake refused ({exc.reason or exc}): does the controller's "
            "web-config want a client certificate (controller_tls_config_cert_file/key_file)?"
        ) from None
    finally:
        conn.close()
