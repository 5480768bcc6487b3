"""Web-config files (exporter-toolkit format) on the agent's /metrics and the controller's listeners: TLS,
client certificates, basic auth with bcrypt hashes; a bad file names file, field and value and nothing
starts (node_agent/webconfig.py, node_agent/httpd.py)."""

from __future__ import annotations

import http.client
import socket
import ssl
from base64 import b64encode
from pathlib import Path

import bcrypt
import pytest
from pki import make_pki

from node_agent.config import build_config
from node_agent.exporter import Server
from node_agent.webconfig import WebConfigError, load_web_config


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    return make_pki(tmp_path, client_san="prometheus")


HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def _agent(tmp_path: Path, web: Path) -> Server:
    cfg = build_config(
        None,
        {
            "backend": "fake",
            "listen": "127.0.0.1",
            "port": 0,
            "state_dir": tmp_path / "state",
            "gpus": 1,
            "web_config_file": web,
        },
    )
    srv = Server(cfg)
    srv.start()
    return srv


def _get(port: int, ctx: ssl.SSLContext | None, auth: str | None = None) -> int:
    conn = (
        http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
        if ctx
        else http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    )
    headers = {"Authorization": "Basic " + b64encode(auth.encode()).decode()} if auth else {}
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_tls_and_basic_auth_on_the_agent(tmp_path: Path, pki: dict[str, Path]) -> None:
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki['server_cert']}\n  key_file: {pki['server_key']}\n"
        f"basic_auth_users:\n  prometheus: '{HASH}'\n"
    )
    srv = _agent(tmp_path, web)
    try:
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        assert _get(srv.port, ctx, "prometheus:s3cret") == 200
        assert _get(srv.port, ctx, "prometheus:s3cret") == 200  # cached answer
        assert _get(srv.port, ctx) == 401
        assert _get(srv.port, ctx, "prometheus:wrong") == 401
        assert _get(srv.port, ctx, "nobody:s3cret") == 401
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            _get(srv.port, None, "prometheus:s3cret")  # plain HTTP on the TLS port: no answer
        assert _get(srv.port, ctx, "prometheus:s3cret") == 200  # and the server is still fine
    finally:
        srv.stop()


def test_client_certificates_are_required_and_their_sans_checked(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    web = tmp_path / "web.yml"
    body = (
        f"tls_server_config:\n  cert_file: {pki['server_cert']}\n  key_file: {pki['server_key']}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki['ca']}\n"
    )
    web.write_text(body + "  client_allowed_sans: [prometheus]\n")
    srv = _agent(tmp_path, web)
    try:
        anonymous = ssl.create_default_context(cafile=str(pki["ca"]))
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
            _get(srv.port, anonymous)
        mtls = ssl.create_default_context(cafile=str(pki["ca"]))
        mtls.load_cert_chain(pki["client_cert"], pki["client_key"])
        assert _get(srv.port, mtls) == 200
    finally:
        srv.stop()
    web.write_text(body + "  client_allowed_sans: [someone-else]\n")
    srv = _agent(tmp_path, web)
    try:
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
            _get(srv.port, mtls)  # verified, but not a SAN this listener allows
    finally:
        srv.stop()


@pytest.mark.parametrize(
    ("text", "where", "value"),
    [
        ("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  client_auth_type: Sometimes\n",
         "tls_server_config.client_auth_type", "'Sometimes'"),
        ("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  client_auth_type: RequireAnyClientCert\n"
         "  client_ca_file: {c}\n", "tls_server_config", "RequireAnyClientCert"),
        ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: {k}\n",
         "tls_server_config.cert_file", "'/nonexistent.crt'"),
        ("tls_server_config:\n  cert_file: {k}\n  key_file: {k}\n", "tls_server_config.cert_file", "{k}"),
        ("basic_auth_users:\n  alice: plaintext-password\n", "basic_auth_users: alice", "'plainte'"),
        ("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  min_version: TLS14\n",
         "tls_server_config.min_version", "'TLS14'"),
        ("tls_server_config:\n  cert_file: {c}\n  key_file: {k}\n  cipher_suites: [X]\n",
         "tls_server_config", "cipher_suites"),
        ("basic_auth_users: [alice]\n", "basic_auth_users", "['alice']"),
        ("rate_limit:\n  burst: 20\n", "rate_limit", "burst"),
        ("tls_server_config: [\n", "not valid YAML", ""),
    ],
)  # fmt: skip
def test_a_bad_web_config_names_file_field_and_value_and_nothing_starts(
    tmp_path: Path, pki: dict[str, Path], text: str, where: str, value: str
) -> None:
    web = tmp_path / "web.yml"
    c, k = pki["server_cert"], pki["server_key"]
    web.write_text(text.format(c=c, k=k))
    with pytest.raises(WebConfigError) as err:
        load_web_config(web)
    message = str(err.value)
    assert message.startswith(f"{web}: ") and where in message and value.format(k=k) in message, message
    with pytest.raises(ValueError, match=r"web\.yml"):
        _agent(tmp_path, web)
    assert not (tmp_path / "state").exists() or not list((tmp_path / "state").glob("*.sock"))


def test_a_bad_web_config_stops_the_controller_before_it_listens(tmp_path: Path) -> None:
    from slurm_fleetyield.config import ConfigError, from_mapping
    from slurm_fleetyield.daemon import build

    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: not-a-hash\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = from_mapping(
        {"store": {"path": str(tmp_path / "fy.db")}, "api": {"port": port, "web_config_file": str(web)}}
    )
    with pytest.raises(ConfigError, match=r"api\.web_config_file: basic_auth_users: alice: not a bcrypt"):
        build(cfg)
    assert not (tmp_path / "fy.db").exists()  # nothing opened
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # and nothing listens


def test_the_controller_api_serves_tls_with_basic_auth(tmp_path: Path, pki: dict[str, Path]) -> None:
    from slurm_fleetyield.adapters.api import ApiServer
    from slurm_fleetyield.adapters.metrics import ControllerStats

    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki['server_cert']}\n  key_file: {pki['server_key']}\n"
        f"basic_auth_users:\n  admin: '{HASH}'\n"
    )

    class Model:
        def result(self):  # type: ignore[no-untyped-def]
            return None

    stats = ControllerStats()
    api = ApiServer(
        "127.0.0.1", 0, Model(), web=load_web_config(web), on_unauthenticated=stats.unauthenticated
    )  # type: ignore[arg-type]
    api.start()
    try:
        ctx = ssl.create_default_context(cafile=str(pki["ca"]))
        conn = http.client.HTTPSConnection("localhost", api.port, context=ctx, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 401
        conn.close()
        conn = http.client.HTTPSConnection("localhost", api.port, context=ctx, timeout=10)
        conn.request(
            "GET", "/healthz", headers={"Authorization": "Basic " + b64encode(b"admin:s3cret").decode()}
        )
        assert conn.getresponse().status == 503  # authenticated: the API's own answer (no tick yet)
        conn.close()
    finally:
        api.stop()
    assert stats.read_unauthenticated() == {("api", "basic_auth"): 1}
