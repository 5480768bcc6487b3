"""The OpenAPI document agrees with the API's routes; every public route is read-only; schemathesis fuzzes a
live in-process server against the document (responses conform, no 5xx)."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from slurm_fleetyield import openapi
from slurm_fleetyield.adapters import api as api_mod
from slurm_fleetyield.adapters.api import ApiServer, StoreReadModel
from slurm_fleetyield.adapters.metrics import ControllerStats, make_registry
from slurm_fleetyield.adapters.scrape import parse_exposition
from slurm_fleetyield.adapters.slurm import CommandResult, SlurmCli
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.adapters.views import render_result
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.ports import ApplyReport
from slurm_fleetyield.web import ASSETS

EXAMPLES = {"{node}": "gpu-01", "{id}": "p-000000000000", "{name}": "app.js"}


def _documented_routes() -> set[str]:
    """The routes api.py's docstring lists (its route table), as OpenAPI path templates."""
    routes = set()
    for line in api_mod.__doc__.splitlines():
        m = re.match(r"\s+GET ([^\s,]+(?:, [^\s,]+)*)", line)
        if m:
            for path in m.group(1).split(", "):
                routes.add(path.split("?")[0])
    return routes


def test_document_and_route_table_agree():
    doc = openapi.document()
    assert doc["openapi"].startswith("3.0") and doc["info"]["version"]
    assert set(doc["paths"]) == _documented_routes()
    assert all(set(item) == {"get"} for item in doc["paths"].values())  # read-only: GET and nothing else
    ops = [item["get"]["operationId"] for item in doc["paths"].values()]
    assert len(ops) == len(set(ops))


def test_static_assets_are_documented():
    text = openapi.PATHS["/static/{name}"]["get"]["summary"]
    assert all(name in text for name in ASSETS)


FIXTURES = Path(__file__).parent / "adapters" / "fixtures"
NOW = 1_768_212_200.0


def _tick_parts():
    """A real tick over captured Slurm output and a captured agent scrape (as tests/adapters/conftest.py)."""
    text = (FIXTURES / "scontrol_show_node_o_22.05_edgecases.txt").read_text()
    nodes = SlurmCli(runner=lambda argv, t: CommandResult(0, text, ""), version=(22, 5, 8)).read_nodes()
    sample = parse_exposition((FIXTURES / "agent_fake_h100_2gpu_xid48.txt").read_text(), "gpu-01", NOW)
    samples = {"gpu-01": sample}
    obs = Observations(time=NOW, slurm=nodes, samples=samples)
    result = tick(ControllerState.empty(), obs, Params(), NOW, random.Random(0))
    return result, ApplyReport(), samples


@pytest.fixture
def live(tmp_path):
    result, report, samples = _tick_parts()
    now = NOW
    store = Store(tmp_path / "fy.db")
    view = render_result(3, now, result, report, samples, dry_run=False, duration_s=0.5)
    store.commit_tick(3, now, result.state, (), [], view)
    from slurm_fleetyield.gate import Gatekeeper

    with Gatekeeper.open(str(tmp_path / "gate")):
        pass  # the daemon creates the gate at start; without it /v1/proposals is (documented) 503
    server = ApiServer(
        "127.0.0.1",
        0,
        StoreReadModel(store, lambda: {"slurm_ok": True}, gate_dir=str(tmp_path / "gate")),
        make_registry(ControllerStats()),
        stale_after_s=10**9,
    )
    server.start()
    yield server
    server.stop()
    store.close()


def _request(server, path: str, method: str = "GET") -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def _concrete(template: str) -> str:
    for k, v in EXAMPLES.items():
        template = template.replace(k, v)
    return template


@pytest.mark.parametrize("template", sorted(openapi.PATHS))
def test_every_route_answers_a_documented_status(live, template):
    status, headers = _request(live, _concrete(template))
    documented = openapi.PATHS[template]["get"]["responses"]
    assert str(status) in documented, (template, status)
    media = next(iter(documented[str(status)]["content"]))
    assert headers["Content-Type"].split(";")[0] in documented[str(status)]["content"], (template, media)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("template", sorted(openapi.PATHS))
def test_every_public_route_refuses_writes(live, template, method):
    status, headers = _request(live, _concrete(template), method)
    assert status == 405 and headers["Allow"] == "GET"


def test_schemathesis_fuzz(live, tmp_path):
    """schemathesis's CLI against the live server: every check, at most 50 examples per operation, a fixed
    seed. Responses must match the document (status, content type, schema), no 5xx, other methods 405."""
    st = Path(sys.executable).parent / "st"
    if not st.exists():
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    base = f"http://127.0.0.1:{live.port}"
    proc = subprocess.run(
        [
            str(st),
            "run",
            base + "/v1/openapi.json",
            "--url",
            base,
            "--checks",
            "all",
            "--max-examples",
            "50",
            "--seed",
            "1",
            "--request-timeout",
            "10",
            "--no-color",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
    )
    (tmp_path / "st.out").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
