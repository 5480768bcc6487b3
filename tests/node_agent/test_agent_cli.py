from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from receiver import Receiver, wait_for

from node_agent import fatal
from node_agent.cli import main
from node_agent.config import build_config
from node_agent.exporter import Server

SECRET = b"cli-test-secret-0123456789"


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    rx = Receiver(SECRET)
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    secret_file.chmod(0o600)
    cfg = build_config(
        None,
        {
            "backend": "fake",
            "listen": "127.0.0.1",
            "port": 0,
            "state_dir": tmp_path / "state",
            "gpus": 4,
            "hostname": "node-cli",
            "push_url": rx.url,
            "push_secret_file": secret_file,
        },
    )
    srv = Server(cfg)
    srv.start()
    yield srv, rx
    srv.stop()
    rx.close()


def test_fault_cli_through_socket(server) -> None:  # type: ignore[no-untyped-def]
    srv, rx = server
    state_dir = srv.cfg.state_dir
    sock = state_dir / "agent.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    runner = CliRunner()
    res = runner.invoke(main, ["fault", "inject", "--state-dir", str(state_dir), "--gpu", "2", "--xid", "79"])
    assert res.exit_code == 0, res.output
    assert wait_for(lambda: 'gpu="2"' not in _scrape(srv.port))
    assert wait_for(lambda: {e.kind for e in rx.events()} == {"xid", "gpu_missing"})
    res = runner.invoke(main, ["fault", "list", "--state-dir", str(state_dir)])
    assert [f["spec"]["xid"] for f in json.loads(res.output)] == [79]
    res = runner.invoke(main, ["check", "--state-dir", str(state_dir), "--json"])
    assert res.exit_code == 1
    assert [r["status"] for r in json.loads(res.output)["results"]] == ["pass", "pass", "missing", "pass"]
    res = runner.invoke(main, ["reset", "--state-dir", str(state_dir), "--gpu", "2"])
    assert res.exit_code == 0, res.output
    assert wait_for(lambda: 'gpu="2"' in _scrape(srv.port))
    assert [p["kind"] for p in fatal.read_pending(state_dir)] == ["check_failed"]
    res = runner.invoke(main, ["check", "--state-dir", str(state_dir), "--gpu", "2"])
    assert res.exit_code == 0
    assert fatal.read_pending(state_dir) == []
    assert wait_for(lambda: "gpu_reset" in {e.kind for e in rx.events()})


def test_bad_spec_through_cli_changes_nothing(server) -> None:  # type: ignore[no-untyped-def]
    srv, _ = server
    before = (srv.cfg.state_dir / "fake_state.json").read_bytes()
    res = CliRunner().invoke(
        main,
        [
            "fault",
            "degrade",
            "--state-dir",
            str(srv.cfg.state_dir),
            "--gpu",
            "0",
            "--mode",
            "ecc",
            "--rate",
            "-3",
        ],
    )
    assert res.exit_code == 2
    assert "bad fault spec: degrade.rate: Input should be greater than 0" in res.output
    res = CliRunner().invoke(
        main, ["fault", "inject", "--state-dir", str(srv.cfg.state_dir), "--gpu", "7", "--xid", "48"]
    )
    assert res.exit_code == 2 and "no GPU 7" in res.output
    assert (srv.cfg.state_dir / "fake_state.json").read_bytes() == before


def test_offline_edit_is_seen_by_next_start(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    cfg = build_config(
        None, {"listen": "127.0.0.1", "port": 0, "state_dir": state_dir, "gpus": 2, "hostname": "n"}
    )
    srv = Server(cfg)
    srv.start()
    srv.stop()
    res = CliRunner().invoke(
        main, ["fault", "inject", "--state-dir", str(state_dir), "--gpu", "1", "--xid", "48"]
    )
    assert res.exit_code == 0, res.output
    assert [p["xid"] for p in fatal.read_pending(state_dir)] == [48]
    assert len(list((state_dir / "spool").iterdir())) == 1  # spooled for the next start's pusher
    srv = Server(cfg)
    srv.start()
    try:
        text = _scrape(srv.port)
        assert 'DCGM_FI_DEV_XID_ERRORS{gpu="1"' in text and 'err_code="48"' in text
    finally:
        srv.stop()


def test_bad_flags_give_clear_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["serve", "--state-dir", str(tmp_path), "--model", "v100"])
    assert res.exit_code == 2 and "unknown GPU model 'v100'" in res.output
    res = runner.invoke(main, ["serve", "--state-dir", str(tmp_path), "--push-url", "http://x"])
    assert res.exit_code == 2 and "--push-url needs --push-secret-file" in res.output
    res = runner.invoke(main, ["fault", "list", "--state-dir", str(tmp_path / "empty")])
    assert res.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = runner.invoke(
        main, ["serve", "--state-dir", str(tmp_path / "s"), "--port", "0", "--scenario", str(bad)]
    )
    assert res.exit_code == 2 and "not valid json" in res.output
    assert not (tmp_path / "s" / "fake_state.json").exists()


def test_config_file_and_metrics_command(tmp_path: Path) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_text(
        f'[agent]\nstate-dir = "{tmp_path / "s"}"\ngpus = 2\nmodel = "a100"\nhostname = "cfg-node"\n'
        "lowercase-hostname = true\n"
    )
    res = CliRunner().invoke(main, ["metrics", "--config", str(conf)])
    assert res.exit_code == 0, res.output
    assert 'modelName="NVIDIA A100-SXM4-80GB",hostname="cfg-node"' in res.output
    res = CliRunner().invoke(main, ["metrics", "--config", str(conf), "--json"])
    assert res.exit_code == 0, res.output
    families = {f["name"]: f for f in json.loads(res.stdout)}
    temps = families["DCGM_FI_DEV_GPU_TEMP"]
    assert temps["type"] == "gauge" and len(temps["samples"]) == 2
    assert {s["labels"]["hostname"] for s in temps["samples"]} == {"cfg-node"}


def test_serve_process_starts_and_stops_on_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "s"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from node_agent.cli import main; main()",
            "serve",
            "--listen",
            "127.0.0.1",
            "--port",
            "0",
            "--state-dir",
            str(port_file),
            "--gpus",
            "2",
            "--hostname",
            "p",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: (port_file / "agent.sock").exists(), timeout=10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert not (port_file / "agent.sock").exists()
        assert "shutting down" in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("line", "field", "value"),
    [
        ('port = "9400"', "port", "'9400'"),
        ("gpus = 2.0", "gpus", "2.0"),
        ('lowercase-hostname = "yes"', "lowercase_hostname", "'yes'"),
        ("nvml-slow-interval-s = inf", "nvml_slow_interval_s", "inf"),
        ("outcomes-interval-s = nan", "outcomes_interval_s", "nan"),
    ],
)
def test_config_file_values_are_strict(tmp_path: Path, line: str, field: str, value: str) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_text(f'[agent]\nstate-dir = "{tmp_path / "s"}"\n{line}\n')
    with pytest.raises(ValueError) as err:
        build_config(conf, {})
    message = str(err.value)
    assert str(conf) in message and f"{field}: " in message and f"(got {value})" in message


def test_non_utf8_config_file_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "agent.toml"
    conf.write_bytes(b'[agent]\nhostname = "\xff"\n')
    with pytest.raises(ValueError) as err:
        build_config(conf, {})
    assert str(conf) in str(err.value) and "UTF-8" in str(err.value)


def test_attest_table_is_strict(tmp_path: Path) -> None:
    from node_agent.attest.config import load_attest_config

    conf = tmp_path / "agent.toml"
    conf.write_text('[attest]\ntpm-pcr = "16"\n')
    with pytest.raises(ValueError, match=r"attest.tpm_pcr: .*\(got '16'\)"):
        load_attest_config(conf)
    conf.write_text("[attest]\ntimeout-s = nan\n")
    with pytest.raises(ValueError, match=r"attest.timeout_s: .*\(got nan\)"):
        load_attest_config(conf)
    conf.write_text('[attest]\nroot = "/"\ntpm-pcr = 23\n')
    assert load_attest_config(conf).tpm_pcr == 23


def test_agent_http_405_and_no_broken_pipe_traceback(server, capsys) -> None:  # type: ignore[no-untyped-def]
    import http.client

    srv, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request("OPTIONS", "/metrics")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 405 and resp.getheader("Allow") == "GET, POST"
    finally:
        conn.close()
    from rig import reset_mid_request

    reset_mid_request(srv.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthz", timeout=5) as resp:
        assert resp.status == 200
    assert "Traceback" not in capsys.readouterr().err


def test_health_and_healthz_both_answer(server) -> None:  # type: ignore[no-untyped-def]
    """dcgm-exporter's liveness path is /health; ours was /healthz only: probes written for either work."""
    srv, _ = server
    for path in ("/health", "/healthz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}{path}", timeout=5) as resp:
            assert (resp.status, resp.read()) == (200, b"ok\n"), path
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/healthx", timeout=5)
    assert err.value.code == 404
