"""How the admin's commands authenticate to the controller's listeners when those are served with a
web-config file (TLS, basic auth): ``fleetyield status/nodes/explain/events/ledger/pending --api``,
``approve``/``deny``/``submit-approval`` (the push listener) and ``doctor``.

Input: five options on each of those commands, each with an environment default, set once in an admin's
shell like ``$FLEETYIELD_API``::

    --ca-file          $FLEETYIELD_CA_FILE           CA the listener's certificate chains to (https URLs)
    --cert-file        $FLEETYIELD_CERT_FILE         client certificate, when the web-config asks for one
    --key-file         $FLEETYIELD_KEY_FILE          its key (both or neither)
    --basic-auth-user  $FLEETYIELD_BASIC_AUTH_USER   a user of the web-config's basic_auth_users
    --password-file    $FLEETYIELD_PASSWORD_FILE     its password (a file: never on a command line)

Output: ``client()``, a ``node_agent.httpclient.HttpClient`` (the client the agents and the scraper use, so
the same rules: the password file read per request, cert and key together) or None when no option is set;
a ``click.UsageError`` naming the option and the value when they cannot be used. ``refusal_hint(code)``: what
to say when a listener answers 401/403; ``scheme(web_config_file)``: ``https`` when a listener's web-config
serves TLS (what ``--config`` users reach without giving a URL).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from node_agent.httpclient import (
    BasicAuthConfig,
    ClientConfigError,
    HttpClient,
    HttpClientConfig,
    TlsClientConfig,
)

_META = "fleetyield.client"
OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "--ca-file",
        "ca_file",
        "FLEETYIELD_CA_FILE",
        "CA bundle the listener's TLS certificate must chain to (https URLs; default: the system's).",
    ),
    (
        "--cert-file",
        "cert_file",
        "FLEETYIELD_CERT_FILE",
        "Client certificate (PEM), for a listener whose web-config requires one.",
    ),
    ("--key-file", "key_file", "FLEETYIELD_KEY_FILE", "The client certificate's private key (PEM)."),
    (
        "--basic-auth-user",
        "basic_auth_user",
        "FLEETYIELD_BASIC_AUTH_USER",
        "User of the listener's web-config basic_auth_users.",
    ),
    (
        "--password-file",
        "password_file",
        "FLEETYIELD_PASSWORD_FILE",
        "File holding that user's password (read at each request; never given on the command line).",
    ),
)
_FIELDS = {  # HttpClient's field names -> the options that set them
    "basic_auth.password_file": "--password-file",
    "tls_config.ca_file": "--ca-file",
    "tls_config.cert_file/key_file": "--cert-file/--key-file",
    "tls_config:": "--cert-file/--key-file:",
}


def client_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The five options on a command; their values go to the context, read by ``client()``."""

    def remember(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        ctx.meta.setdefault(_META, {})[param.name] = value
        return value

    for flag, name, env, text in reversed(OPTIONS):
        kind = click.STRING if name == "basic_auth_user" else click.Path(dir_okay=False)
        f = click.option(
            flag,
            name,
            envvar=env,
            show_envvar=True,
            expose_value=False,
            callback=remember,
            type=kind,
            help=text,
        )(f)
    return f


def client() -> HttpClient | None:
    """The client the current command's options describe, or None (plain HTTP, no credentials)."""
    ctx = click.get_current_context(silent=True)
    values: dict[str, str | None] = ctx.meta.get(_META, {}) if ctx is not None else {}
    user, password = values.get("basic_auth_user"), values.get("password_file")
    ca, cert, key = values.get("ca_file"), values.get("cert_file"), values.get("key_file")
    if bool(user) != bool(password):
        raise click.UsageError(
            f"--basic-auth-user and --password-file go together (got {user!r}, {password!r}; "
            "$FLEETYIELD_BASIC_AUTH_USER, $FLEETYIELD_PASSWORD_FILE)"
        )
    auth = BasicAuthConfig(username=user, password_file=password) if user and password else None
    tls = TlsClientConfig(ca_file=ca, cert_file=cert, key_file=key) if ca or cert or key else None
    if auth is None and tls is None:
        return None
    try:
        return HttpClient(HttpClientConfig(basic_auth=auth, tls_config=tls), "")
    except ClientConfigError as exc:
        raise click.UsageError(_options_named(str(exc))) from None


def _options_named(problem: str) -> str:
    for field, option in _FIELDS.items():
        problem = problem.replace(field, option)
    return problem


def refusal_hint(code: int, sent: HttpClient | None) -> str:
    """What an admin does about a listener's 401/403 ('' for other codes)."""
    if code not in (401, 403):
        return ""
    if sent is None or sent.cfg.basic_auth is None:
        return (
            " (the listener's web-config wants credentials: --basic-auth-user and --password-file, or "
            "$FLEETYIELD_BASIC_AUTH_USER and $FLEETYIELD_PASSWORD_FILE)"
        )
    user = sent.cfg.basic_auth.username
    return f" (user {user!r} and its --password-file are not what the listener's web-config accepts)"


def describe_failure(reason: object) -> str:
    """A connection failure in words, with the option that fixes a TLS certificate the client refused."""
    import ssl

    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"{reason} (give the CA that signed the listener's certificate: --ca-file or $FLEETYIELD_CA_FILE)"
        )
    return str(reason)


def scheme(web_config_file: str | None) -> str:
    """``https`` when the listener's web-config file serves TLS (has ``tls_server_config``), else ``http``;
    only the YAML is read (not the key it names, which the admin may not be allowed to read)."""
    if not web_config_file:
        return "http"
    import yaml

    try:
        doc = yaml.safe_load(Path(web_config_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise click.ClickException(
            f"{web_config_file}: cannot tell whether the listener serves TLS ({why}); give its URL instead"
        ) from None
    return "https" if isinstance(doc, dict) and doc.get("tls_server_config") else "http"
