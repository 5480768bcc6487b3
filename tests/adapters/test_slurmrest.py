"""The slurmrestd adapter against a local HTTP server replaying answers captured from the docker cluster's
slurmrestd (Slurm 22.05.8, tests/adapters/data/slurmrest/), and a recorder for the CLI fallback."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from slurm_fleetyield import config as config_mod
from slurm_fleetyield.adapters.slurm import CommandResult, SlurmCli, parse_nodes_text
from slurm_fleetyield.adapters.slurmrest import ServedApi, SlurmRest, SlurmRestError, TokenFile, negotiate
from slurm_fleetyield.core.plan import DrainNode, Plan, RequeueJobs, UpdateNodes

DATA = Path(__file__).parent / "data" / "slurmrest"
SPEC_38 = json.loads((DATA / "openapi_v3_paths.json").read_text())


def captured(name: str) -> tuple[int, str]:
    """A capture: ``*.json`` (HTTP 200) or ``*.txt`` (curl -w: the body, then the status line)."""
    text = (DATA / name).read_text()
    if name.endswith(".txt"):
        body, _, status = text.rstrip("\n").rpartition("\n")
        return int(status), body
    return 200, text


class Server:
    """Answers GET/POST from ``routes`` (path -> (status, body)); records (method, path, headers, body)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, str]] = {}
        self.seen: list[tuple[str, str, dict[str, str], Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                outer.seen.append((self.command, self.path, dict(self.headers), json.loads(raw or b"null")))
                status, body = outer.routes.get(self.path, (404, '{"errors": [{"error": "no route"}]}'))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def paths(self, method: str) -> list[str]:
        return [p for m, p, _, _ in self.seen if m == method]


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.routes["/openapi/v3"] = (200, json.dumps(SPEC_38))
    for name, path in (("nodes", "nodes"), ("jobs", "jobs"), ("ping", "ping")):
        s.routes[f"/slurm/v0.0.38/{path}"] = captured(f"{name}_v0.0.38.json")
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


class Recorder:
    """The CLI's runner: records argv; ``scontrol show hostnames`` expands the two l40s nodes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(tuple(argv))
        if tuple(argv[:3]) == ("scontrol", "show", "hostnames"):
            return CommandResult(0, "gpu-l40s-1\ngpu-l40s-2\n", "")
        return CommandResult(0, "", "")


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("SLURM_JWT=eyJfirst\n")
    path.chmod(0o600)
    return path


def adapter(server: Server, token: Path, recorder: Recorder | None = None) -> SlurmRest:
    cli = SlurmCli(runner=recorder or Recorder(), version=(22, 5, 8))
    return SlurmRest(server.url, "root", TokenFile(str(token)), cli, timeout_s=5, retries=0)


def test_negotiation_picks_the_newest_version_22_05_serves_and_finds_no_writes() -> None:
    api = negotiate(SPEC_38["paths"])
    assert api == ServedApi((0, 0, 38), node_update=False, requeue_path=None)


def test_negotiation_on_24_11_finds_node_update_behind_trailing_slashes() -> None:
    """24.11's paths (captured: tests/adapters/data/slurmrest/openapi_v3_paths_24.11.json, the /slurm/
    paths and methods) end in "/" (``/slurm/v0.0.41/nodes/``); once read as "no nodes", so every write
    went through scontrol. It serves v0.0.40-v0.0.42: the newest this adapter knows is used."""
    paths = json.loads((DATA / "openapi_v3_paths_24.11.json").read_text())["paths"]
    assert "/slurm/v0.0.41/nodes/" in paths and "/slurm/v0.0.42/nodes/" in paths
    assert negotiate(paths) == ServedApi((0, 0, 41), node_update=True, requeue_path=None)
    later = {p.replace("v0.0.4", "v0.0.9"): ops for p, ops in paths.items()}  # a Slurm of the future
    assert negotiate(later).version == (0, 0, 92)


def test_negotiation_uses_node_update_and_requeue_where_a_newer_server_has_them() -> None:
    paths = dict(SPEC_38["paths"])
    paths["/slurm/v0.0.40/nodes"] = {"get": {}}
    paths["/slurm/v0.0.40/jobs"] = {"get": {}}
    paths["/slurm/v0.0.40/node/{node_name}"] = {"get": {}, "post": {}}
    paths["/slurm/v0.0.40/job/{job_id}/requeue"] = {"post": {}}
    paths["/slurm/v0.0.41/ping"] = {"get": {}}  # no nodes/jobs: not usable
    api = negotiate(paths)
    assert api == ServedApi((0, 0, 40), True, "/slurm/v0.0.40/job/{job_id}/requeue")


def test_negotiation_without_slurm_paths_says_what_it_saw() -> None:
    with pytest.raises(ValueError, match=r"no /slurm/vX\.Y\.Z/nodes"):
        negotiate({"/slurmdb/v0.0.38/jobs": {"get": {}}})


def test_nodes_read_over_rest_equal_the_cli_reading_of_the_same_cluster(server: Server, token: Path) -> None:
    rest_nodes = adapter(server, token).read_nodes()
    cli_nodes = {n: v for n, (v, _) in parse_nodes_text((DATA / "scontrol_nodes.txt").read_text()).items()}
    assert len(rest_nodes) == 4
    assert {n: dataclasses.replace(v, boot_time=None) for n, v in rest_nodes.items()} == {
        n: dataclasses.replace(v, boot_time=None) for n, v in cli_nodes.items()
    }
    assert rest_nodes["gpu-h100-1"].weight == 1100 and rest_nodes["gpu-h100-1"].gpu_type == "h100"
    assert "fy_tier_green" in rest_nodes["gpu-h100-1"].active_features


def test_jobs_read_over_rest_carry_nodes_gpus_and_gpu_indices(server: Server, token: Path) -> None:
    jobs = {j.job_id: j for j in adapter(server, token).read_jobs()}
    assert jobs[2].state == "RUNNING" and jobs[2].nodes == ("gpu-l40s-1", "gpu-l40s-2")
    assert jobs[2].gpus == 2 and jobs[2].requeue is True
    assert jobs[2].gpu_index == (("gpu-l40s-1", (0,)), ("gpu-l40s-2", (0,)))
    assert jobs[1].state == "FAILED" and jobs[1].nodes == ()


def test_headers_carry_the_user_and_the_token_which_is_re_read_when_the_file_changes(
    server: Server, token: Path
) -> None:
    rest = adapter(server, token)
    rest.ping()
    token.write_text("eyJsecond-longer\n")
    rest.ping()
    tokens = [h.get("X-SLURM-USER-TOKEN") for _, p, h, _ in server.seen if p.endswith("/ping")]
    assert tokens == ["eyJfirst", "eyJsecond-longer"]
    assert {h.get("X-SLURM-USER-NAME") for _, _, h, _ in server.seen} == {"root"}


def test_a_missing_or_empty_token_file_names_the_field_and_file(tmp_path: Path) -> None:
    with pytest.raises(SlurmRestError, match=r"slurm.rest_token_file: cannot read"):
        TokenFile(str(tmp_path / "absent")).get()
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(SlurmRestError, match=r"rest_token_file: the token file is empty") as exc:
        TokenFile(str(tmp_path / "empty")).get()
    assert str(tmp_path / "empty") in str(exc.value)


def test_a_token_file_others_may_read_is_refused(server: Server, token: Path) -> None:
    token.chmod(0o644)
    with pytest.raises(SlurmRestError, match=r"rest_token_file: mode 644 is group/world accessible") as exc:
        adapter(server, token).ping()
    assert str(token) in str(exc.value) and "eyJfirst" not in str(exc.value)
    assert not [p for _, p, _, _ in server.seen if p.endswith("/ping")]
    token.chmod(0o600)
    adapter(server, token).ping()


def test_api_errors_become_errors_naming_endpoint_status_and_message(server: Server, token: Path) -> None:
    server.routes["/slurm/v0.0.38/nodes"] = captured("job_unknown.txt")
    with pytest.raises(SlurmRestError) as exc:
        adapter(server, token).read_nodes()
    assert str(exc.value) == (
        "slurmrestd GET /slurm/v0.0.38/nodes: HTTP 500: Unable to find JobId=999999: Invalid job id specified"
        " (slurm_load_job)"
    )
    server.routes["/slurm/v0.0.38/ping"] = captured("ping_bad_token.txt")  # what a bad JWT gets on 22.05
    with pytest.raises(SlurmRestError, match="HTTP 500: slurmctld config is unable to load"):
        adapter(server, token).ping()


def test_on_24_11_a_refused_token_is_an_error_not_a_ping(server: Server, token: Path) -> None:
    """Captured from the 24.11 cluster (v0.0.41): a bad JWT gets HTTP 200 with ``"pinged": "DOWN"`` on
    /ping (once read as a working endpoint) and HTTP 511 on /nodes."""
    server.routes["/openapi/v3"] = (200, json.dumps({"paths": {}}))  # probe the versions instead
    server.routes["/slurm/v0.0.41/ping"] = captured("ping_v0.0.41.json")
    assert adapter(server, token).ping()["pings"][0]["pinged"] == "UP"
    server.routes["/slurm/v0.0.41/ping"] = captured("ping_v0.0.41_bad_token.json")
    with pytest.raises(SlurmRestError) as exc:
        adapter(server, token).ping()
    assert str(exc.value) == (
        "slurmrestd GET /slurm/v0.0.41/ping: HTTP 200: no slurmctld answered UP (slurmctld DOWN): "
        "slurmctld down, or it refused the token"
    )
    server.routes["/slurm/v0.0.41/nodes"] = captured("nodes_v0.0.41_bad_token.txt")
    with pytest.raises(SlurmRestError) as exc:
        adapter(server, token).read_nodes()
    assert str(exc.value).endswith(
        "nodes: HTTP 511: Failure to query nodes: Protocol authentication error (_dump_nodes)"
    )


def test_an_unreachable_server_is_an_error_naming_the_endpoint(token: Path) -> None:
    cli = SlurmCli(runner=Recorder(), version=(22, 5, 8))
    rest = SlurmRest("http://127.0.0.1:9", "root", TokenFile(str(token)), cli, timeout_s=2, retries=0)
    with pytest.raises(SlurmRestError, match=r"slurmrestd GET /openapi/v3: no answer|/slurm/vX/ping"):
        rest.read_nodes()


def test_on_22_05_writes_fall_back_to_scontrol(server: Server, token: Path) -> None:
    recorder = Recorder()
    report = adapter(server, token, recorder).apply(
        Plan(
            actions=(
                UpdateNodes(("gpu-h100-1",), ("h100", "fy_x"), 5),
                DrainNode("gpu-h100-2", "fy: r", (7,)),
            )
        )
    )
    assert [r.ok for r in report.results] == [True, True]
    assert ("scontrol", "requeue", "7") in recorder.calls
    assert any(c[:3] == ("scontrol", "update", "NodeName=gpu-h100-1") for c in recorder.calls)
    assert server.paths("POST") == []


def test_where_the_server_has_node_update_and_requeue_they_go_over_rest(server: Server, token: Path) -> None:
    spec = {
        "paths": {
            "/slurm/v0.0.40/nodes": {"get": {}},
            "/slurm/v0.0.40/jobs": {"get": {}},
            "/slurm/v0.0.40/node/{node_name}": {"post": {}},
            "/slurm/v0.0.40/job/{job_id}/requeue": {"post": {}},
        }
    }
    server.routes["/openapi/v3"] = (200, json.dumps(spec))
    ok = (200, '{"errors": []}')
    for path in (
        "/slurm/v0.0.40/node/gpu-h100-1",
        "/slurm/v0.0.40/node/gpu-h100-2",
        "/slurm/v0.0.40/job/7/requeue",
    ):
        server.routes[path] = ok
    recorder = Recorder()
    report = adapter(server, token, recorder).apply(
        Plan(
            actions=(
                UpdateNodes(("gpu-h100-1",), ("h100",), 5),
                DrainNode("gpu-h100-2", "fy: r", (7,)),
                RequeueJobs("gpu-h100-2", (7,), 9, "reclaim"),
            )
        )
    )
    assert [r.ok for r in report.results] == [True, True, True]
    bodies = [(p, b) for m, p, _, b in server.seen if m == "POST"]
    assert bodies[0] == (
        "/slurm/v0.0.40/node/gpu-h100-1",
        {
            "features": ["h100"],
            "features_act": ["h100"],
            "weight": {"set": True, "infinite": False, "number": 5},
        },
    )
    assert bodies[1] == ("/slurm/v0.0.40/node/gpu-h100-2", {"state": ["DRAIN"], "reason": "fy: r"})
    assert [p for p, _ in bodies[2:]] == ["/slurm/v0.0.40/job/7/requeue"] * 2
    assert recorder.calls == []


def test_a_failed_rest_write_is_recorded_and_the_next_action_runs(server: Server, token: Path) -> None:
    spec = {
        "paths": {
            "/slurm/v0.0.39/nodes": {},
            "/slurm/v0.0.39/jobs": {},
            "/slurm/v0.0.39/node/{node_name}": {"post": {}},
        }
    }
    server.routes["/openapi/v3"] = (200, json.dumps(spec))
    server.routes["/slurm/v0.0.39/node/b"] = (200, '{"errors": []}')
    report = adapter(server, token).apply(
        Plan(actions=(UpdateNodes(("a",), (), 1), UpdateNodes(("b",), (), 1)))
    )
    assert [r.ok for r in report.results] == [False, True]
    assert "POST /slurm/v0.0.39/node/a: HTTP 404: no route" in report.results[0].detail
    assert server.seen[-1][3] == {"features": [], "features_act": [], "weight": 1}  # v0.0.39: a plain int


def _slurm(**fields: Any) -> dict[str, Any]:
    return {"slurm": fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"adapter": "rest", "rest_token_file": "/t"}, "slurm.rest_url = None"),
        ({"adapter": "rest", "rest_url": "slurmctld:6820", "rest_token_file": "/t"}, "'slurmctld:6820'"),
        ({"adapter": "rest", "rest_url": "http://slurmctld:6820"}, "slurm.rest_token_file = None"),
        ({"adapter": "grpc"}, "grpc"),
    ],
)
def test_config_rejects_an_incomplete_rest_setup_naming_field_and_value(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(config_mod.ConfigError, match=message):
        config_mod.from_mapping(_slurm(**fields), "test.toml")


def test_config_defaults_to_the_cli_and_accepts_a_rest_setup() -> None:
    assert config_mod.from_mapping({}, "t.toml").slurm.adapter == "cli"
    cfg = config_mod.from_mapping(
        _slurm(adapter="rest", rest_url="http://slurmctld:6820", rest_token_file="/shared/slurmrest/token")
    )
    assert (cfg.slurm.adapter, cfg.slurm.rest_user) == ("rest", "root")


def test_doctor_pings_slurmrestd_with_the_token_and_says_what_falls_back(server: Server, token: Path) -> None:
    from slurm_fleetyield import doctor

    cfg = config_mod.from_mapping(_slurm(adapter="rest", rest_url=server.url, rest_token_file=str(token)))
    ctx = doctor.Context("t.toml", runner=Recorder(), config=cfg)
    (finding,) = doctor.check_slurmrest(ctx)
    assert finding.status == "OK", finding
    assert "/slurm/v0.0.38: slurmctld UP (as root)" in finding.detail
    assert "node update and requeue through scontrol" in finding.detail
    server.routes["/slurm/v0.0.38/ping"] = captured("ping_bad_token.txt")
    ctx = doctor.Context("t.toml", runner=Recorder(), config=cfg)
    (finding,) = doctor.check_slurmrest(ctx)
    assert finding.status == "FAIL" and "slurmctld config is unable to load" in finding.detail, finding


def test_v0_0_38_state_flags_join_the_state_as_the_cli_shows_them() -> None:
    from slurm_fleetyield.adapters.slurmrest import normalize_nodes

    doc = {"nodes": [{"name": "n1", "state": "idle", "state_flags": ["DRAIN", "NOT_RESPONDING"]}]}
    assert normalize_nodes(doc)["nodes"][0]["state"] == ["IDLE", "DRAIN", "NOT_RESPONDING"]
    newer = {"nodes": [{"name": "n1", "state": ["IDLE", "DRAIN"]}]}  # v0.0.40: already a list
    assert normalize_nodes(newer)["nodes"][0]["state"] == ["IDLE", "DRAIN"]
