"""The CLI through click's CliRunner: read commands against a committed store (daemon down) and the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rig import TICK_TIME as NOW
from rig import commit_one_tick

from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel
from slurm_fleetyield.adapters.store import LogRow, Store
from slurm_fleetyield.adapters.views import render_result
from slurm_fleetyield.cli import main
from slurm_fleetyield.ports import ApplyReport


@pytest.fixture
def cfg(tmp_path) -> Path:
    """A config whose store holds one committed tick (as left by a daemon that is now down)."""
    commit_one_tick(tmp_path / "fy.db")
    path = tmp_path / "fy.toml"
    path.write_text(f'[store]\npath = "{tmp_path / "fy.db"}"\n')
    return path


def invoke(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_status_table_from_the_store(cfg):
    code, out = invoke("status", "--config", str(cfg))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("tick 5 (") and "DRY-RUN" in lines[0] and "4 nodes" in lines[0]
    assert any(line.startswith("HOLD gpu-01 drain (drain_cap)") for line in lines)
    header = next(line for line in lines if line.startswith("NODE"))
    assert header.split() == ["NODE", "TIER", "RISK", "FEATURES", "WEIGHT", "SLURM", "REASON"]
    gpu02 = next(line for line in lines if line.startswith("gpu-02"))
    assert "quarantined" in gpu02 and "fy_tier_quarantined" in gpu02 and "fleetyield: fatal XID 79" in gpu02


def test_status_and_nodes_json(cfg):
    code, out = invoke("status", "--config", str(cfg), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["tick"] == 5 and len(doc["nodes"]) == 4 and doc["inbox"]["pending"] == 0
    code, out = invoke("nodes", "--config", str(cfg), "--json")
    assert {r["node"]: r["tier"] for r in json.loads(out)}["gpu-02"] == "quarantined"


def test_explain(cfg):
    code, out = invoke("explain", "gpu-01", "--config", str(cfg))
    assert code == 0 and out.startswith("node gpu-01: tier ")
    code, out = invoke("explain", "gpu-01", "--config", str(cfg), "--json")
    assert json.loads(out)["node"] == "gpu-01"
    code, out = invoke("explain", "nope", "--config", str(cfg))
    assert code == 1 and "not in the last committed tick" in out


def test_events(cfg):
    code, out = invoke("events", "--config", str(cfg), "--limit", "2", "--json")
    assert code == 0 and len(json.loads(out)) == 2
    code, out = invoke("events", "--config", str(cfg))
    assert code == 0 and "tick=5" in out


def test_read_commands_through_the_api(cfg):
    store = Store(cfg.parent / "fy.db")
    server = ApiServer("127.0.0.1", 0, StoreReadModel(store))
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        code, out = invoke("status", "--api", url)
        assert code == 0 and out.startswith("tick 5 (")
        code, out = invoke("explain", "gpu-02", "--api", url, "--json")
        assert json.loads(out)["tier"] == "quarantined"
        code, out = invoke("events", "--api", url, "--limit", "1", "--json")
        assert len(json.loads(out)) == 1
        code, out = invoke("explain", "nope", "--api", url)
        assert code == 1 and "HTTP 404" in out
    finally:
        server.stop()
        store.close()


def test_no_store_yet(tmp_path):
    path = tmp_path / "fy.toml"
    path.write_text(f'[store]\npath = "{tmp_path / "none.db"}"\n')
    code, out = invoke("status", "--config", str(path))
    assert code == 1 and "no such database" in out


def test_validate_config(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("[loop]\ninterval_s = 10\n")
    assert invoke("validate-config", str(good)) == (0, f"{good}: ok\n")
    code, out = invoke("validate-config", str(good), "--json")
    assert json.loads(out)["loop"]["interval_s"] == 10
    bad = tmp_path / "bad.toml"
    bad.write_text("[loop]\ninterval_s = 0\n")
    code, out = invoke("validate-config", str(bad))
    assert code == 1 and f"{bad}: loop.interval_s: Input should be greater than 0 (got 0)" in out


def test_validate_config_opens_the_files_it_names(tmp_path):
    """validate-config is the controller unit's ExecStartPre: what run refuses to start with, it refuses too,
    naming the file and the field (a 1-byte push secret printed "ok" before and only run refused it)."""
    secret = tmp_path / "push.secret"
    secret.write_bytes(b"x")
    secret.chmod(0o600)
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config:\n  cert_file: nowhere.crt\n  key_file: nowhere.key\n")
    keys = tmp_path / "authorized_keys"
    keys.write_text("fleetyield-ed25519 not-base64 alice\n")
    keys.chmod(0o644)
    path = tmp_path / "fy.toml"
    path.write_text(
        f'[push]\nsecret_file = "{secret}"\n[api]\nweb_config_file = "{web}"\n'
        f'[gate]\nauthorized_keys = "{keys}"\n'
    )
    code, out = invoke("validate-config", str(path))
    assert code == 1, out
    assert f"{secret}: push.secret_file: the secret is 1 bytes, shorter than 16 bytes" in out
    assert f"{web}: api.web_config_file: tls_server_config.cert_file: no such file (got 'nowhere.crt')" in out
    # authorized_keys: said, with file and line, but run starts with it (re-read at every approval)
    assert f"warning: {keys}: gate.authorized_keys (line 1): key is not valid base64" in out
    assert "ok" not in out.splitlines()[-1]
    secret.write_bytes(b"0123456789abcdef0123")
    web.write_text("basic_auth_users: {}\n")
    code, out = invoke("validate-config", str(path))
    assert code == 0 and out.endswith(f"{path}: ok\n") and "gate.authorized_keys (line 1)" in out, out
    secret.chmod(0o644)
    code, out = invoke("validate-config", str(path), "--json")
    assert code == 1 and f"{secret}: push.secret_file: mode 644 is group/world accessible" in out, out


def test_validate_config_opens_the_attestation_policy_and_key_and_creates_nothing(tmp_path):
    """[attest] enabled: run loads the policy and the verdict-signing key before the first tick, so
    validate-config does too, naming each file; it opens no attestation store."""
    policy, key, db = tmp_path / "policy.json", tmp_path / "attest.key", tmp_path / "attest.db"
    policy.write_text("{not json")
    key.write_text("not a key\n")
    key.chmod(0o600)
    path = tmp_path / "fy.toml"
    secret = tmp_path / "push.secret"
    secret.write_bytes(b"0123456789abcdef0123")
    secret.chmod(0o600)
    path.write_text(
        f'[push]\nsecret_file = "{secret}"\n'
        f'[attest]\nenabled = true\npolicy = "{policy}"\nkey = "{key}"\ndb = "{db}"\n'
    )
    code, out = invoke("validate-config", str(path))
    assert code == 1 and f"{policy}: attest.policy:" in out, out
    assert not db.exists()


def test_run_once_dry_run_with_unreachable_slurm(tmp_path):
    path = tmp_path / "fy.toml"
    path.write_text(
        f'[store]\npath = "{tmp_path / "fy.db"}"\n[api]\nenabled = false\n[slurm]\nbin_dir = "{tmp_path}"\n'
    )
    code, out = invoke("run", "--config", str(path), "--once", "--dry-run", "--log-level", "error")
    assert code == 0 and "tick 1: slurm_ok=False nodes=0 actions=0" in out
    assert Store(tmp_path / "fy.db").load_state().tick == 1


def test_example_config_command():
    code, out = invoke("example-config")
    assert code == 0 and "[sense]" in out and 'url_template = "http://{node}:9400/metrics"' in out


def _with_ledger(cfg: Path) -> None:
    from slurm_fleetyield.adapters.store import TickMarks

    db = cfg.read_text().split('"')[1]
    store = Store(db)
    row = {
        "job_id": 9,
        "start": NOW - 7200,
        "end": NOW - 3600,
        "workload": "pretrain",
        "nodes": ["gpu-01"],
        "gpus": 8,
        "state": "NODE_FAIL",
        "useful_gpu_s": 8 * 1800.0,
        "wasted_gpu_s": 8 * 1800.0,
        "premium_misuse_gpu_s": 0.0,
        "failure": True,
        "tier_at_start": "green",
        "cause": "hardware",
    }
    state = store.load_state()
    store.commit_tick(6, NOW, state.state, marks=TickMarks(ledger=[row]))
    store.close()


def test_ledger_by_class_and_json(cfg):
    _with_ledger(cfg)
    code, out = invoke("ledger", "--config", str(cfg), "--by", "class")
    assert code == 0, out
    assert out.splitlines()[0].split()[:4] == ["GROUP", "JOBS", "FAILURES", "USEFUL_GPU_H"]
    assert out.splitlines()[1].split() == ["pretrain", "1", "1", "4", "4", "0", "0"]
    code, out = invoke("ledger", "--config", str(cfg), "--json", "--since", str(NOW))
    assert code == 0 and json.loads(out)["groups"] == []


def test_status_calibration(cfg):
    code, out = invoke("status", "--config", str(cfg), "--calibration", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["tick"] == 5 and "bins" in doc and "multipliers" in doc
    code, out = invoke("status", "--config", str(cfg), "--calibration")
    assert code == 0 and out.startswith("calibration (tick 5): Brier")


def test_run_once_json(tmp_path):
    path = tmp_path / "fy.toml"
    path.write_text(
        f'[store]\npath = "{tmp_path / "fy.db"}"\n[api]\nenabled = false\n[slurm]\nbin_dir = "{tmp_path}"\n'
    )
    args = ["run", "--config", str(path), "--once", "--dry-run", "--log-level", "error", "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {  # the log lines go to stderr
        "tick": 1, "slurm_ok": False, "nodes": 0, "actions": 0, "holds": 0, "slurm_calls": 0, "failed": 0,
    }  # fmt: skip


# --------------------------------------------------------------------------------------------------------
# Where the read commands find the controller: --api, --config, $FLEETYIELD_API, $FLEETYIELD_CONFIG, the
# default config file, the demo cluster's published API; the error says what was tried.
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No controller anywhere: env unset, no default config file, and a demo port that refuses (a socket
    bound but not listening: refused for as long as the test holds it)."""
    import socket

    from slurm_fleetyield import cli

    monkeypatch.delenv("FLEETYIELD_API", raising=False)
    monkeypatch.delenv("FLEETYIELD_CONFIG", raising=False)
    monkeypatch.setattr(cli, "DEFAULT_CONFIG", str(tmp_path / "etc" / "fleetyield.toml"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    monkeypatch.setattr(cli, "DEMO_API", f"http://127.0.0.1:{sock.getsockname()[1]}")
    yield cli
    sock.close()


@pytest.fixture
def api_url(cfg):
    store = Store(cfg.parent / "fy.db")
    server = ApiServer("127.0.0.1", 0, StoreReadModel(store))
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()
    store.close()


def test_status_without_a_controller_says_what_it_tried(nowhere, tmp_path):
    code, out = invoke("status")
    assert code == 1
    for tried in ("--api", "--config", "$FLEETYIELD_API", "$FLEETYIELD_CONFIG", nowhere.DEFAULT_CONFIG,
                  f"demo cluster's published API {nowhere.DEMO_API}"):  # fmt: skip
        assert tried in out, (tried, out)
    assert "cannot read" not in out
    assert not (tmp_path / "etc").exists()


def test_status_from_the_environment_api(nowhere, api_url, monkeypatch):
    monkeypatch.setenv("FLEETYIELD_API", api_url)
    code, out = invoke("status")
    assert code == 0 and out.startswith("tick 5 ("), out


def test_status_from_the_environment_config(nowhere, cfg, monkeypatch):
    monkeypatch.setenv("FLEETYIELD_CONFIG", str(cfg))
    code, out = invoke("nodes", "--json")
    assert code == 0 and len(json.loads(out)) == 4


def test_flags_beat_the_environment(nowhere, cfg, monkeypatch):
    monkeypatch.setenv("FLEETYIELD_API", nowhere.DEMO_API)  # refuses: would fail if it were asked
    code, out = invoke("nodes", "--config", str(cfg), "--json")
    assert code == 0 and len(json.loads(out)) == 4


def test_default_config_file_before_the_demo_cluster(nowhere, cfg, monkeypatch):
    monkeypatch.setattr(nowhere, "DEFAULT_CONFIG", str(cfg))
    code, out = invoke("status", "--json")
    assert code == 0 and json.loads(out)["tick"] == 5


def test_the_demo_cluster_api_last(nowhere, api_url, monkeypatch):
    monkeypatch.setattr(nowhere, "DEMO_API", api_url)
    code, out = invoke("status", "--json")
    assert code == 0 and json.loads(out)["tick"] == 5


def test_the_demo_cluster_publishes_the_api_the_cli_asks_last():
    from slurm_fleetyield.cli import DEMO_API

    compose = (Path(__file__).parents[1] / "contrib/slurm-docker-cluster/docker-compose.yml").read_text()
    host_port = DEMO_API.removeprefix("http://")
    assert f'ports: ["{host_port}:9401"]' in compose


@pytest.fixture
def stake_cfg(tmp_path) -> Path:
    """A store whose committed tick has the stake rule's capacity breaker holding for pretrain and a drain
    proposal on gpu000 (4 nodes; gpu000 about to fail; a 1,000-GPU gang pending)."""
    from core.builders import Fleet, Runner

    from slurm_fleetyield.core import signals as s
    from slurm_fleetyield.core.model import JobView, WorkloadClass

    f = Fleet(4)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)
    f.set("gpu000", 3, s.REMAP_FAILURE, 1)
    f.jobs = [JobView(17, "PENDING", (), True, WorkloadClass.PRETRAIN, 1000)]
    runner = Runner(f)
    result = runner.tick()
    assert {"stake_breaker", "drain_proposal"} <= {e.kind for e in result.events}
    store = Store(tmp_path / "fy.db")
    view = render_result(1, runner.now, result, ApplyReport(), {}, dry_run=False, duration_s=0.1)
    rows = [LogRow(e.time, e.kind, e.node, e.message, dict(e.data)) for e in result.events]
    store.commit_tick(1, runner.now, result.state, (), rows, view)
    store.close()
    path = tmp_path / "fy.toml"
    path.write_text(f'[store]\npath = "{tmp_path / "fy.db"}"\n')
    return path


def test_status_shows_the_capacity_breaker(stake_cfg):
    code, out = invoke("status", "--config", str(stake_cfg))
    assert code == 0, out
    line = next(x for x in out.splitlines() if x.startswith("BREAKER "))
    assert line.startswith(
        "BREAKER fy_ok_train (pretrain): fy_ok_train: withholding it from 8 of 32 in-service GPUs"
    )
    code, out = invoke("status", "--config", str(stake_cfg), "--json")
    (b,) = json.loads(out)["stake"]["breaker"]
    assert b["class"] == "pretrain" and b["feature"] == "fy_ok_train" and b["would_withhold_gpus"] == 8
    assert b["service_gpus"] == 32 and b["withheld_gpus"] == 0


def test_status_of_a_tick_without_a_breaker_has_an_empty_list(cfg):
    _code, out = invoke("status", "--config", str(cfg), "--json")
    assert json.loads(out)["stake"] == {"breaker": []}
    assert "BREAKER" not in invoke("status", "--config", str(cfg))[1]


def test_explain_shows_the_stake_arithmetic_and_the_drain_figures(stake_cfg):
    code, out = invoke("explain", "gpu000", "--config", str(stake_cfg))
    assert code == 0, out
    assert "stake: P(fatal) 0.9049 over 7 d -> excess hazard" in out and "no risk signal" in out
    assert "pretrain fy_ok_train: stake 1024 GPU(s) (largest pretrain job 17: 1000 GPUs, PENDING" in out
    assert "-> carried_by_breaker: " in out
    drain = next(x for x in out.splitlines() if x.startswith("drain proposal "))
    assert (
        "(open), made at " in drain
        and "averted = p 0.500 (risk 0.905, at most stake.drain_precision) x (requeued work 0.0 + "
        "next stake 682.7 "
        in drain
    )
    assert drain.endswith("vs cost = drain downtime 192.0 + requeued work 0.0 = 192.0 GPU-h")
    code, out = invoke("explain", "gpu000", "--config", str(stake_cfg), "--json")
    doc = json.loads(out)
    assert doc["drain_stake"]["open"] and doc["drain_stake"]["figures"]["pays"] is True
    assert doc["drain_stake"]["proposal_id"] == doc["proposal"]["id"]
    train = next(c for c in doc["stake"]["classes"] if c["class"] == "pretrain")
    assert train["decision"] == "carried_by_breaker" and train["source"]["job_id"] == 17
    # a node without a proposal: no drain figures
    assert "drain_stake" not in json.loads(
        invoke("explain", "gpu001", "--config", str(stake_cfg), "--json")[1]
    )


def test_status_through_an_api_behind_tls_and_basic_auth(cfg, tmp_path, monkeypatch):
    """The API served with a web-config (TLS + basic auth): the read commands get the answer with --ca-file,
    --basic-auth-user and --password-file (or their $FLEETYIELD_* defaults); a 401 or an untrusted
    certificate says which options to give."""
    from pki import web_config_with_user

    from node_agent.webconfig import load_web_config

    pki, web, password = web_config_with_user(tmp_path)
    assert pki is not None
    store = Store(cfg.parent / "fy.db")
    server = ApiServer("127.0.0.1", 0, StoreReadModel(store), web=load_web_config(web))
    server.start()
    url = f"https://localhost:{server.port}"
    auth = ["--basic-auth-user", "admin", "--password-file", str(password)]
    try:
        code, out = invoke("status", "--api", url, "--ca-file", str(pki["ca"]))
        assert code == 1 and "HTTP 401" in out and "--basic-auth-user and --password-file" in out, out
        code, out = invoke("status", "--api", url, *auth)
        assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in out and "--ca-file" in out, out
        code, out = invoke("status", "--api", url, "--ca-file", str(pki["ca"]), *auth)
        assert code == 0 and out.startswith("tick 5 ("), out
        code, out = invoke("status", "--api", url, "--ca-file", str(pki["ca"]), "--basic-auth-user", "admin")
        assert code == 2 and "--basic-auth-user and --password-file go together" in out, out
        monkeypatch.setenv("FLEETYIELD_CA_FILE", str(pki["ca"]))
        monkeypatch.setenv("FLEETYIELD_BASIC_AUTH_USER", "admin")
        monkeypatch.setenv("FLEETYIELD_PASSWORD_FILE", str(password))
        code, out = invoke("explain", "gpu-02", "--api", url, "--json")
        assert code == 0 and json.loads(out)["tier"] == "quarantined", out
    finally:
        server.stop()
        store.close()
