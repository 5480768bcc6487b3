"""Issue 27 item 1: the clients speak the web-config. The agent's pusher reaches a push listener served with
TLS, client certificates and basic auth (a web-config file), the controller's scraper reaches an agent served
the same way, each configured as a Prometheus scrape config is (basic_auth: username + password_file,
tls_config: ca_file, cert_file, key_file). Real servers on localhost, a real CA (tests/pki.py). Before this,
basic auth on the push listener locked every agent out. A refused request is counted and writes nothing.
(node_agent/httpclient.py, node_agent/spool.py, slurm_fleetyield/adapters/scrape.py)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
from pki import make_pki
from rig import FakeCommands, write_secret

from node_agent.config import build_config
from node_agent.exporter import Server
from node_agent.httpclient import BasicAuthConfig, HttpClient, HttpClientConfig, TlsClientConfig
from node_agent.protocol import EVENTS_PATH, AgentEvent
from node_agent.push import Pusher, spooled
from slurm_fleetyield.adapters.scrape import AgentScraper
from slurm_fleetyield.adapters.slurm import SlurmCli
from slurm_fleetyield.config import ConfigError, from_mapping
from slurm_fleetyield.daemon import Runtime, build, build_agent_client

SECRET = b"client-test-secret-0123456"
HASH = bcrypt.hashpw(b"push-pass", bcrypt.gensalt(4)).decode()


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    return make_pki(tmp_path / "pki")


def _web(tmp_path: Path, pki: dict[str, Path], user: str) -> Path:
    """TLS with required, verified client certificates and one basic-auth user (password "push-pass")."""
    web = tmp_path / f"web-{user}.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {pki['server_cert']}\n  key_file: {pki['server_key']}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki['ca']}\n"
        f"basic_auth_users:\n  {user}: '{HASH}'\n"
    )
    return web


def _password(tmp_path: Path, text: str) -> str:
    path = tmp_path / f"pw-{uuid.uuid4().hex[:6]}"
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def controller(tmp_path: Path, pki: dict[str, Path]) -> Iterator[Runtime]:
    cfg = from_mapping(
        {
            "store": {"path": str(tmp_path / "fy.db")},
            "push": {
                "secret_file": str(write_secret(tmp_path / "secret", SECRET)),
                "port": 0,
                "web_config_file": str(_web(tmp_path, pki, "agent")),
            },
            "api": {"enabled": False},
        }
    )
    rt = build(cfg, slurm=SlurmCli(runner=FakeCommands()))
    for server in rt.servers:
        server.start()
    try:
        yield rt
    finally:
        rt.close()


def _fatal(node: str) -> AgentEvent:
    return AgentEvent.model_validate(
        {
            "event_id": str(uuid.uuid4()),
            "time": time.time(),
            "node": node,
            "gpu": 1,
            "uuid": "GPU-1",
            "kind": "xid",
            "xid": 79,
            "fatal": True,
            "message": "XID 79: GPU has fallen off the bus",
        }
    )


def _rows(rt: Runtime) -> tuple[list[str], dict]:
    """What a push could have written durably: agent event rows and the inbox."""
    kinds = [str(e.get("kind", "")) for e in rt.store.events(limit=10_000)]
    return [k for k in kinds if k.startswith("agent_")], rt.store.inbox_counts()


def test_the_pusher_authenticates_and_the_unauthenticated_are_refused_counted_and_write_nothing(
    tmp_path: Path, pki: dict[str, Path], controller: Runtime
) -> None:
    (ingest,) = controller.servers
    url = f"https://localhost:{ingest.port}{EVENTS_PATH}"
    ca, cert, key = str(pki["ca"]), str(pki["client_cert"]), str(pki["client_key"])
    mtls = TlsClientConfig(ca_file=ca, cert_file=cert, key_file=key)
    clients = {
        "no basic auth": HttpClientConfig(tls_config=mtls),
        "wrong password": HttpClientConfig(
            basic_auth=BasicAuthConfig(username="agent", password_file=_password(tmp_path, "guess")),
            tls_config=mtls,
        ),
        "no client certificate": HttpClientConfig(
            basic_auth=BasicAuthConfig(username="agent", password_file=_password(tmp_path, "push-pass")),
            tls_config=TlsClientConfig(ca_file=ca),
        ),
        "ok": HttpClientConfig(
            basic_auth=BasicAuthConfig(username="agent", password_file=_password(tmp_path, "push-pass")),
            tls_config=mtls,
        ),
    }
    rows0 = _rows(controller)
    results = {}
    for name, client_cfg in clients.items():
        pusher = Pusher(
            tmp_path / name.replace(" ", "-"), "gpu-01", url, SECRET, client=HttpClient(client_cfg, "push_")
        )
        pusher.enqueue([_fatal("gpu-01")])
        results[name] = (pusher.flush_once(), len(spooled(pusher.state_dir)))
        if name != "ok":
            assert _rows(controller) == rows0, name  # refused: nothing durable
    assert results == {
        "no basic auth": (False, 1),  # refused: the event stays spooled
        "wrong password": (False, 1),
        "no client certificate": (False, 1),  # refused at the TLS handshake
        "ok": (True, 0),
    }
    assert controller.daemon.stats.read_unauthenticated() == {("listener", "basic_auth"): 2}
    assert [e.node for e in controller.store.pending()] == ["gpu-01"]  # the authenticated push, once
    assert controller.store.inbox_counts()["pending"] == rows0[1]["pending"] + 1


def test_the_agent_config_carries_the_push_client_and_a_bad_password_file_stops_the_start(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'[agent]\nbackend = "fake"\nlisten = "127.0.0.1"\nport = 0\nstate_dir = "{tmp_path / "st"}"\n'
        f'push_url = "https://localhost:1/v1/agent/events"\npush_secret_file = "{tmp_path / "secret"}"\n'
        f'push_basic_auth = {{username = "agent", password_file = "{tmp_path / "missing"}"}}\n'
        f'[agent.push_tls_config]\nca_file = "{pki["ca"]}"\n'
    )
    write_secret(tmp_path / "secret", SECRET)
    cfg = build_config(toml, {})
    client = cfg.push_client()
    assert client is not None and client.tls_config is not None
    assert client.tls_config.ca_file == str(pki["ca"]) and not client.tls_config.insecure_skip_verify
    with pytest.raises(
        ValueError, match=rf"push_basic_auth.password_file: cannot read: .*'{tmp_path}/missing'"
    ):
        Server(cfg).start()
    assert not (tmp_path / "st").exists()  # nothing started
    plain = toml.read_text().replace("https://localhost:1", "http://localhost:1")
    toml.write_text(plain)
    with pytest.raises(
        ValueError, match=r"push_tls_config is set but 'http://localhost:1/v1/agent/events' is not"
    ):
        build_config(toml, {})
    toml.write_text(plain.replace("http://localhost:1", "https://localhost:1") + "insecure = true\n")
    with pytest.raises(ValueError, match=r"push_tls_config.insecure.*(Extra inputs|extra)"):
        build_config(toml, {})


@pytest.fixture
def agent(tmp_path: Path, pki: dict[str, Path]) -> Iterator[Server]:
    cfg = build_config(
        None,
        {
            "backend": "fake",
            "listen": "127.0.0.1",
            "port": 0,
            "state_dir": tmp_path / "agent",
            "gpus": 2,
            "web_config_file": _web(tmp_path, pki, "prometheus"),
        },
    )
    srv = Server(cfg)
    srv.start()
    yield srv
    srv.stop()


def test_the_scraper_reads_an_agent_served_with_tls_client_certs_and_basic_auth(
    tmp_path: Path, pki: dict[str, Path], agent: Server
) -> None:
    template = f"https://localhost:{agent.port}/metrics?node={{node}}"

    def scrape(sense_extra: dict) -> str | None:
        cfg = from_mapping(
            {"store": {"path": str(tmp_path / "fy.db")}, "sense": {"url_template": template, **sense_extra}}
        )
        sample = AgentScraper(template, 5.0, 1, client=build_agent_client(cfg)).sample_one("gpu-01", 0.0)
        assert sample.error is not None or len(sample.gpus) == 2, sample
        return sample.error

    tls = {
        "ca_file": str(pki["ca"]),
        "cert_file": str(pki["client_cert"]),
        "key_file": str(pki["client_key"]),
    }
    auth = {"username": "prometheus", "password_file": _password(tmp_path, "push-pass")}
    assert scrape({"basic_auth": auth, "tls_config": tls}) is None
    assert scrape({"tls_config": tls}) == "HTTP 401 Unauthorized"
    assert "certificate" in str(scrape({"basic_auth": auth}))  # the system CAs do not know ours
    no_cert = scrape({"basic_auth": auth, "tls_config": {"ca_file": str(pki["ca"])}})
    # refused in the TLS layer (TLS 1.3: the alert comes at the handshake or at the first read)
    assert no_cert is not None and not no_cert.startswith("HTTP"), no_cert
    with pytest.raises(ConfigError, match=r"sense: .*tls_config is set but url_template is not https://"):
        from_mapping({"sense": {"url_template": "http://{node}:9400/metrics", "tls_config": tls}})
    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("not PEM\n")
    with pytest.raises(ConfigError) as err:
        scrape({"tls_config": {"ca_file": str(bad)}})
    assert str(err.value).startswith(f"{bad}: sense.tls_config.ca_file: cannot load"), err.value
    assert f"(got {str(bad)!r})" in str(err.value)
    assert scrape({"basic_auth": auth, "tls_config": tls}) is None  # and the agent still serves
