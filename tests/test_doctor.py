"""``fleetyield doctor``: each check's pass and fail path, with temp dirs, local HTTP servers standing in for
agents and the controller, and the Slurm command seam (captured-format scontrol output)."""

from __future__ import annotations

import email.utils
import json
import os
import re
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_fleetyield import doctor
from slurm_fleetyield.adapters.slurm import CommandResult
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.cli import main

SNIPPET_FILE = Path(__file__).parents[1] / "contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf"
METRICS = (
    b"# HELP DCGM_FI_DEV_GPU_TEMP x\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
    b'DCGM_FI_DEV_GPU_TEMP{gpu="0",device="nvidia0"} 40\nDCGM_FI_DEV_GPU_TEMP{gpu="1",device="nvidia1"} 41\n'
)
FIXTURE = Path(__file__).parent / "adapters/fixtures/agent_nvml_h200_real.txt"

SHOW_CONFIG = """Configuration data as of 2026-01-12T10:00:00
AccountingStorageType   = accounting_storage/slurmdbd
Epilog                  = /opt/fleetyield/bin/fleetyield-epilog
JobSubmitPlugins        = lua
Prolog                  = /opt/fleetyield/bin/fleetyield-prolog
PrologFlags             = Alloc,DeferBatch
SlurmctldHost[0]        = slurmctld
"""


def node_line(name: str, gres: str = "gpu:h100:8(S:0-1)") -> str:
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUTot=32 CPULoad=0.01 "
        f"AvailableFeatures=h100 ActiveFeatures=h100 Gres={gres} NodeAddr={name} NodeHostName={name} "
        "Version=22.05.8 OS=Linux RealMemory=1031000 AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 "
        "State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu "
        "CfgTRES=cpu=32,gres/gpu=8 AllocTRES="
    )


class Slurm:
    """The command seam: ping, version, show config, show node, timedatectl."""

    def __init__(self, nodes: Sequence[str] = ("gpu-01", "gpu-02"), show_config: str = SHOW_CONFIG) -> None:
        self.up = True
        self.nodes = list(nodes)
        self.show_config = show_config
        self.ntp = "yes"

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = (os.path.basename(argv[0]), *argv[1:])
        if argv[0] == "timedatectl":
            return CommandResult(0, self.ntp + "\n", "")
        if not self.up:
            return CommandResult(1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller")
        if argv[:2] == ("scontrol", "ping"):
            return CommandResult(0, "Slurmctld(primary) at slurmctld is UP\n", "")
        if argv[:2] == ("scontrol", "--version"):
            return CommandResult(0, "slurm-wlm 22.05.8\n", "")
        if argv[:3] == ("scontrol", "show", "config"):
            return CommandResult(0, self.show_config, "")
        if argv[:3] == ("scontrol", "show", "node"):
            return CommandResult(0, "\n".join(node_line(n) for n in self.nodes) + "\n", "")
        return CommandResult(1, "", f"unexpected {argv}")


class Server:
    """A local HTTP server answering GET with (status, body) and a Date header ``skew_s`` off."""

    def __init__(self, status: int = 200, body: bytes = METRICS, skew_s: float = 0.0) -> None:
        outer = self
        self.status, self.body, self.skew_s = status, body, skew_s

        class Handler(BaseHTTPRequestHandler):
            def date_time_string(self, timestamp=None):
                import time

                return email.utils.formatdate(time.time() + outer.skew_s, usegmt=True)

            def do_GET(self):
                self.send_response(outer.status)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def agent():
    s = Server()
    yield s
    s.close()


def write_config(tmp: Path, agent_port: int, api_port: int = 1, **extra: str) -> Path:
    secret = tmp / "push.secret"
    secret.write_bytes(b"s3cret-of-32-bytes-0123456789abc")
    secret.chmod(0o600)
    keys = tmp / "authorized_keys"
    keys.write_text("fleetyield-ed25519 AAAA alice\n")
    keys.chmod(0o644)
    (tmp / "state").mkdir(exist_ok=True)
    lines = [
        *(
            [f"[core.quarantine]\nrequeue_whole_node = {extra['whole_node']}"]
            if "whole_node" in extra
            else []
        ),
        "[store]",
        f'path = "{tmp / "state" / "fy.db"}"',
        "[sense]",
        f'url_template = "http://127.0.0.1:{agent_port}/metrics?node={{node}}"',
        "timeout_s = 2",
        "[push]",
        f'secret_file = "{extra.get("secret", secret)}"',
        "[gate]",
        f'authorized_keys = "{extra.get("keys", keys)}"',
        "[api]",
        f"port = {api_port}",
    ]
    path = tmp / "fleetyield.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(tmp: Path, cfg: Path, slurm: Slurm, only: Sequence[str] | None = None, key_dirs=()) -> list:
    ctx = doctor.Context(str(cfg), runner=slurm, which=lambda name: "/usr/bin/" + name, key_dirs=key_dirs)
    return doctor.run_checks(ctx, only)


def by_check(findings, name):
    return [(f.status, f.detail) for f in findings if f.check == name]


@pytest.fixture
def hooks(tmp_path, monkeypatch):
    """The hook paths of the snippet, pointed at executables in tmp_path."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("fleetyield-prolog", "fleetyield-epilog"):
        (d / name).write_text("#!/bin/sh\nexit 0\n")
        (d / name).chmod(0o755)
    monkeypatch.setattr(
        doctor, "HOOKS", {"Prolog": str(d / "fleetyield-prolog"), "Epilog": str(d / "fleetyield-epilog")}
    )
    return d


def show_config_for(hooks_dir: Path, **override: str) -> str:
    text = SHOW_CONFIG.replace("/opt/fleetyield/bin", str(hooks_dir))
    for key, value in override.items():
        text = re.sub(rf"^{key}\s*=.*$", f"{key} = {value}", text, flags=re.M)
    return text


# --------------------------------------------------------------------------------------------------------


def test_snippet_constant_matches_the_canonical_snippet():
    text = SNIPPET_FILE.read_text()
    settings = dict(
        line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#")
    )
    assert settings == doctor.SNIPPET


def test_healthy_installation_is_all_ok(tmp_path, agent, hooks):
    api = Server(body=b'{"ok": true, "tick": 3}')
    try:
        cfg = write_config(tmp_path, agent.port, api.port)
        findings = run(tmp_path, cfg, Slurm(show_config=show_config_for(hooks)))
    finally:
        api.close()
    assert [f for f in findings if f.status != "OK"] == []
    assert {f.check for f in findings} == {n for n, _ in doctor.CHECKS}
    assert "2/2 agents answer" in by_check(findings, "agents")[0][1]


def test_config_invalid_fails_and_names_the_field(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[loop]\ninterval_s = -1\n")
    findings = run(tmp_path, cfg, Slurm(), only=["config", "store", "agents"])
    assert findings[0].status == "FAIL" and "loop.interval_s" in findings[0].detail
    assert by_check(findings, "store")[0][0] == "WARN"  # skipped, not guessed
    assert by_check(findings, "agents")[0][0] == "WARN"


def test_slurm_unreachable_fails(tmp_path, agent):
    slurm = Slurm()
    slurm.up = False
    findings = run(tmp_path, write_config(tmp_path, agent.port), slurm, only=["slurm", "hooks"])
    assert (
        by_check(findings, "slurm")[0][0] == "FAIL"
        and "Unable to contact" in by_check(findings, "slurm")[0][1]
    )
    assert by_check(findings, "hooks")[0][0] == "WARN"


def test_hooks_missing_from_slurm_conf_fail(tmp_path, agent, hooks):
    text = show_config_for(hooks, Prolog="(null)", PrologFlags="Alloc", JobSubmitPlugins="(null)")
    findings = run(tmp_path, write_config(tmp_path, agent.port), Slurm(show_config=text), only=["hooks"])
    statuses = by_check(findings, "hooks")
    assert ("FAIL", f"Prolog is (null), which does not run {hooks}/fleetyield-prolog") in statuses
    assert any(s == "FAIL" and "lacks DeferBatch" in d for s, d in statuses)
    assert any(s == "WARN" and "JobSubmitPlugins" in d for s, d in statuses)
    assert any(s == "OK" and d.startswith("Epilog=") for s, d in statuses)


def test_hooks_beside_the_sites_own_through_the_snippets_glob(tmp_path, agent, hooks):
    """The snippet's form: Prolog/Epilog are globs over directories where our hooks are links beside a site's
    own programs; a glob directory without our link fails and says which link to make."""
    for kind in ("prolog", "epilog"):
        d = tmp_path / f"{kind}.d"
        d.mkdir()
        (d / "10-site").write_text("#!/bin/sh\nexit 0\n")
        (d / "10-site").chmod(0o755)
    (tmp_path / "prolog.d/50-fleetyield").symlink_to(hooks / "fleetyield-prolog")
    text = show_config_for(hooks, Prolog=f"{tmp_path}/prolog.d/*", Epilog=f"{tmp_path}/epilog.d/*")
    findings = run(tmp_path, write_config(tmp_path, agent.port), Slurm(show_config=text), only=["hooks"])
    statuses = by_check(findings, "hooks")
    assert (
        "OK",
        f"Prolog={tmp_path}/prolog.d/* runs {hooks}/fleetyield-prolog as {tmp_path}/prolog.d/50-fleetyield "
        "(executable)",
    ) in statuses
    failed = [f for f in findings if f.status == "FAIL"]
    assert [f.detail for f in failed] == [
        f"Epilog is {tmp_path}/epilog.d/*, which does not run {hooks}/fleetyield-epilog"
    ]
    assert failed[0].fix.startswith(f"ln -s {hooks}/fleetyield-epilog /etc/slurm/epilog.d/50-fleetyield")
    # Slurm 24.11's repeated Prolog= lines, as scontrol shows them: a comma list, ours named directly.
    text = show_config_for(hooks, Prolog=f"/usr/local/sbin/site-prolog,{hooks}/fleetyield-prolog")
    findings = run(tmp_path, write_config(tmp_path, agent.port), Slurm(show_config=text), only=["hooks"])
    assert [f for f in findings if f.status != "OK"] == []


def test_hook_not_executable_fails(tmp_path, agent, hooks):
    (hooks / "fleetyield-epilog").chmod(0o644)
    findings = run(tmp_path, write_config(tmp_path, agent.port), Slurm(show_config=show_config_for(hooks)))
    assert ("FAIL", f"{hooks}/fleetyield-epilog is not an executable file") in by_check(findings, "hooks")


def test_agents_some_unreachable_warn_all_unreachable_fail(tmp_path, agent):
    slurm = Slurm(nodes=["gpu-01"])
    cfg = write_config(tmp_path, agent.port)
    assert by_check(run(tmp_path, cfg, slurm, only=["slurm", "agents"]), "agents")[0][0] == "OK"
    agent.status = 500
    got = by_check(run(tmp_path, cfg, slurm, only=["slurm", "agents"]), "agents")
    assert got[0][0] == "FAIL" and "HTTP 500" in got[0][1]
    agent.status, agent.body = 200, b"hello"
    got = by_check(run(tmp_path, cfg, slurm, only=["slurm", "agents"]), "agents")
    assert got[0][0] == "FAIL" and "not with dcgm-exporter metrics" in got[0][1]


def test_agents_partly_down_warn(tmp_path, agent):
    cfg = write_config(tmp_path, agent.port)
    ctx = doctor.Context(str(cfg), runner=Slurm(nodes=["gpu-01", "gpu-02"]), which=lambda n: None)

    def get(url, timeout_s):
        if "gpu-02" in url:
            raise OSError("connection refused")
        return doctor.http_get(url, timeout_s)

    ctx.get = get
    got = by_check(doctor.run_checks(ctx, ["slurm", "agents"]), "agents")
    assert got[0][0] == "WARN" and "1/2 agents unreachable: gpu-02" in got[0][1]


@pytest.mark.parametrize(
    ("skew_s", "status"), [(0.0, "OK"), (10.0, "WARN"), (-10.0, "WARN"), (400.0, "FAIL")]
)
def test_clock_skew_against_agents(tmp_path, skew_s, status):
    server = Server(skew_s=skew_s)
    try:
        cfg = write_config(tmp_path, server.port)
        findings = run(tmp_path, cfg, Slurm(nodes=["gpu-01"]), only=["slurm", "agents", "clocks"])
    finally:
        server.close()
    clocks = by_check(findings, "clocks")
    assert ("OK", "this host's clock is NTP-synchronised (timedatectl)") in clocks
    assert clocks[-1][0] == status, clocks


def test_timedatectl_not_synchronised_warns(tmp_path, agent):
    slurm = Slurm(nodes=["gpu-01"])
    slurm.ntp = "no"
    findings = run(tmp_path, write_config(tmp_path, agent.port), slurm, only=["slurm", "agents", "clocks"])
    assert by_check(findings, "clocks")[0][0] == "WARN"


def test_keys_safe_and_unsafe(tmp_path, agent):
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "alice.key").write_text("k")
    (admin / "alice.key").chmod(0o600)
    cfg = write_config(tmp_path, agent.port)
    findings = run(tmp_path, cfg, Slurm(), only=["keys"], key_dirs=[str(admin)])
    assert all(f.status == "OK" for f in findings), findings
    (tmp_path / "push.secret").chmod(0o640)
    (tmp_path / "authorized_keys").chmod(0o666)
    (admin / "alice.key").chmod(0o644)
    findings = run(tmp_path, cfg, Slurm(), only=["keys"], key_dirs=[str(admin)])
    fails = [f.detail for f in findings if f.status == "FAIL"]
    assert len(fails) == 3, findings
    assert any("push.secret_file" in d and "640" in d for d in fails)
    assert any("others can add an admin key" in d for d in fails)
    assert any("alice.key has mode 644" in d for d in fails)
    cfg = write_config(tmp_path, agent.port, secret=str(tmp_path / "nope"))
    assert any(
        "No such file" in f.detail for f in run(tmp_path, cfg, Slurm(), only=["keys"]) if f.status == "FAIL"
    )
    short = tmp_path / "short.secret"
    short.write_bytes(b"0123456789abcde")  # 15 bytes: the agents and the controller refuse it
    short.chmod(0o600)
    cfg = write_config(tmp_path, agent.port, secret=str(short))
    assert any(
        "15 bytes, fewer than 16" in f.detail
        for f in run(tmp_path, cfg, Slurm(), only=["keys"])
        if f.status == "FAIL"
    )


def test_store_writable_and_not(tmp_path, agent):
    cfg = write_config(tmp_path, agent.port)
    assert by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")[0][0] == "OK"
    Store(tmp_path / "state" / "fy.db").close()
    got = by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")
    assert got[0][0] == "OK" and "quick_check ok" in got[0][1]
    (tmp_path / "state" / "fy.db").write_bytes(b"not a database, just junk" * 100)
    assert by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")[0][0] == "FAIL"
    (tmp_path / "state" / "fy.db").unlink()
    (tmp_path / "state").rmdir()
    assert by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")[0][0] == "FAIL"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_store_read_only_dir_fails(tmp_path, agent):
    cfg = write_config(tmp_path, agent.port)
    (tmp_path / "state").chmod(0o500)
    try:
        assert by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")[0][0] == "FAIL"
    finally:
        (tmp_path / "state").chmod(0o700)


def test_controller_down_warns(tmp_path, agent):
    cfg = write_config(tmp_path, agent.port, api_port=1)
    assert by_check(run(tmp_path, cfg, Slurm(), only=["controller"]), "controller")[0][0] == "WARN"


def test_the_api_behind_basic_auth_and_the_prologs_it_refused(tmp_path, agent):
    """doctor asks the api listener with --basic-auth-user/--password-file, and reports the requests it
    refused for credentials: Prologs whose hooks.conf does not match run without the health gate."""
    import urllib.request

    from pki import web_config_with_user

    from node_agent.webconfig import load_web_config
    from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel
    from slurm_fleetyield.adapters.metrics import ControllerStats, make_registry

    _, web, password = web_config_with_user(tmp_path, tls=False)
    stats = ControllerStats()
    store = Store(tmp_path / "api.db")
    api = ApiServer(
        "127.0.0.1",
        0,
        StoreReadModel(store),
        make_registry(stats),
        web=load_web_config(web),
        on_unauthenticated=stats.unauthenticated,
    )
    api.start()
    try:
        cfg = write_config(tmp_path, agent.port, api_port=api.port)
        cfg.write_text(cfg.read_text() + f'web_config_file = "{web}"\n')  # [api] is the last table
        doctor_cmd = ["doctor", "--config", str(cfg), "--only", "controller"]
        out = CliRunner().invoke(main, doctor_cmd)
        assert "[WARN] controller" in out.output and "wants credentials" in out.output, out.output
        assert "--basic-auth-user and --password-file" in out.output
        with pytest.raises(urllib.error.HTTPError) as refused:  # a node's Prolog without credentials
            urllib.request.urlopen(f"http://127.0.0.1:{api.port}/v1/nodes/gpu-01/gate", timeout=10)
        assert refused.value.code == 401
        out = CliRunner().invoke(
            main, [*doctor_cmd, "--basic-auth-user", "admin", "--password-file", str(password)]
        )
        assert out.exit_code == 0, out.output
        assert "HTTP 503" in out.output and "no tick committed yet" in out.output  # the answer, authenticated
        assert "refused 2 request(s) for missing or wrong basic-auth credentials" in out.output, out.output
        assert "controller_basic_auth_username" in out.output and "AUTH REFUSED" in out.output
    finally:
        api.stop()
        store.close()


def test_a_crashing_check_is_one_fail(tmp_path, agent, monkeypatch):
    def boom(ctx):
        raise RuntimeError("bug")

    monkeypatch.setattr(doctor, "CHECKS", (("config", doctor.check_config), ("store", boom)))
    findings = run(tmp_path, write_config(tmp_path, agent.port), Slurm())
    assert [(f.check, f.status) for f in findings] == [("config", "OK"), ("store", "FAIL")]


def test_cli_json_and_exit_status(tmp_path, agent):
    cfg = write_config(tmp_path, agent.port)
    out = CliRunner().invoke(main, ["doctor", "--config", str(cfg), "--json", "--only", "store"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["ok"] is True and [f["check"] for f in doc["findings"]] == ["config", "store"]
    (tmp_path / "push.secret").chmod(0o644)
    out = CliRunner().invoke(
        main, ["doctor", "--config", str(cfg), "--only", "keys", "--key-dir", str(tmp_path)]
    )
    assert out.exit_code == 1 and "[FAIL] keys" in out.output and "fix: chmod 600" in out.output


def test_gpu_index_pairs_parse_the_real_nvml_exposition():
    assert doctor.gpu_device_pairs(FIXTURE.read_text()) == [("0", "nvidia0")]  # the H200 (stop 15)


@pytest.mark.parametrize(
    ("body", "whole_node", "status", "words"),
    [
        (METRICS, None, "OK", "4 GPUs on 2 nodes: NVML index = device minor"),
        (
            METRICS.replace(b'device="nvidia1"', b'device="nvidia3"'),
            None,
            "WARN",
            "gpu-01 (gpu 1 is /dev/nvidia3)",
        ),
        (METRICS.replace(b'device="nvidia1"', b'device="nvidia3"'), "true", "OK", "requeues every job"),
        (METRICS.replace(b',device="nvidia0"', b""), None, "WARN", "export no device label"),
    ],
)
def test_gpu_index_vs_device_minor(tmp_path, body, whole_node, status, words):
    s = Server(body=body)
    try:
        extra = {} if whole_node is None else {"whole_node": whole_node}
        cfg = write_config(tmp_path, s.port, **extra)
        got = by_check(run(tmp_path, cfg, Slurm(), only=["slurm", "agents", "gpu_index"]), "gpu_index")
    finally:
        s.close()
    assert len(got) == 1 and got[0][0] == status and words in got[0][1], got


def test_a_postgresql_store_is_checked_by_connecting(tmp_path, agent, pg_url):
    cfg = write_config(tmp_path, agent.port)
    cfg.write_text(cfg.read_text().replace("[store]\n", f'[store]\nurl = "{pg_url}"\n'))
    got = by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")
    assert got[0][0] == "OK" and "created at first start" in got[0][1]
    Store(pg_url).lease_acquire("ctl-a", 60.0, time.time())
    got = by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")
    assert got[0][0] == "OK" and "leader ctl-a" in got[0][1], got
    dead = pg_url.replace("host=", "port=1&host=")
    cfg.write_text(cfg.read_text().replace(pg_url, dead))
    assert by_check(run(tmp_path, cfg, Slurm(), only=["store"]), "store")[0][0] == "FAIL"
