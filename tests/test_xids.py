"""slurm_fleetyield/xids.py and ``fleetyield xids``: what the catalog and the config say, and that the
controller does exactly that to every XID the catalog lists, injected through the fake agent."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.registry import CollectorRegistry

from node_agent.agent import Agent
from node_agent.backends.fake import FakeBackend
from node_agent.collector import GpuCollector
from node_agent.exposition import render
from node_agent.faults import parse_fault
from node_agent.protocol import AgentEvent
from node_agent.xid_catalog import Handling, load_catalog
from slurm_fleetyield import cli
from slurm_fleetyield.adapters.ingest import fatal_events
from slurm_fleetyield.adapters.scrape import parse_exposition
from slurm_fleetyield.config import ConfigError, from_mapping, load
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import Observations, SlurmNode
from slurm_fleetyield.core.params import DEFAULT_QUARANTINE_XIDS, DEFAULT_RISK_ONLY_XIDS, Params
from slurm_fleetyield.core.plan import DrainNode
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.xids import resolve

T0 = 1_700_000_000.0
NODE = "gpu-a"
OVERRIDES = {"46": "ignore", "43": "drain", "31": "ignore", "154": "drain", "162": "risk"}


@pytest.fixture(autouse=True)
def _no_site_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cli, "DEFAULT_CONFIG", str(tmp_path / "absent.toml"))  # never this host's /etc


def test_core_defaults_are_the_catalogs_derivation() -> None:
    resolved = resolve(load_catalog())
    assert resolved.quarantine_xids == DEFAULT_QUARANTINE_XIDS
    assert resolved.risk_only_xids == DEFAULT_RISK_ONLY_XIDS


def test_precedence_catalog_then_explicit_lists_then_overrides() -> None:
    cat = load_catalog()
    # an explicit list replaces its class of the catalog (a config written before the catalog keeps its sense)
    r = resolve(cat, quarantine_xids=[79, 13])
    assert r.quarantine_xids == (13, 79)
    assert r.handling(46) is Handling.IGNORE and r.handling(31) is Handling.RISK
    # overrides win over both, and may name an XID the catalog does not know
    r = resolve(cat, {79: Handling.RISK, 500: Handling.DRAIN}, quarantine_xids=[79])
    assert r.quarantine_xids == (500,) and 79 in r.risk_only_xids
    assert [(x.name, x.catalog_action) for x in r.rows if x.xid == 500] == [("(not in the catalog)", "-")]


def test_config_fills_the_core_lists_in() -> None:
    cfg = from_mapping({"xids": {"overrides": OVERRIDES}})
    q = cfg.core.quarantine
    assert 43 in q.quarantine_xids and 154 in q.quarantine_xids and 46 not in q.quarantine_xids
    assert 162 in q.risk_only_xids and 31 not in q.risk_only_xids and 31 not in q.quarantine_xids
    old = from_mapping({"core": {"quarantine": {"quarantine_xids": [48, 79], "risk_only_xids": [13]}}})
    assert old.core.quarantine.quarantine_xids == (48, 79)  # pre-catalog configs mean what they said
    assert old.core.quarantine.risk_only_xids == (13,)


def test_config_errors_name_the_field_and_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"xids\.overrides\.13: .*\(got 'quarantine'\)"):
        from_mapping({"xids": {"overrides": {"13": "quarantine"}}})
    with pytest.raises(ConfigError, match=r"xids\.overrides: Value error, XID numbers are positive"):
        from_mapping({"xids": {"overrides": {"-4": "drain"}}})
    bad = tmp_path / "cat.csv"
    bad.write_text("xid,mnemonic,description,immediate_action,investigatory_action\n7,X,Y,PANIC,\n")
    with pytest.raises(ConfigError, match=r"xids\.catalog: .*cat\.csv: line 2: immediate_action 'PANIC'"):
        from_mapping({"xids": {"catalog": str(bad)}})


def _cli_rows(*args: str) -> dict[int, dict[str, object]]:
    result = CliRunner(env={"FLEETYIELD_CONFIG": None}).invoke(cli.main, ["xids", "--json", *args])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert all(set(r) == {"xid", "name", "catalog_action", "handling"} for r in rows)
    return {int(r["xid"]): r for r in rows}


def test_cli_table_and_json(tmp_path: Path) -> None:
    rows = _cli_rows()
    assert sorted(rows) == list(range(1, 173))
    assert rows[154] == {
        "xid": 154,
        "name": "GPU Recovery Action Changed",
        "catalog_action": "XID_154",
        "handling": "risk",
    }
    assert (
        rows[79]["handling"] == "drain" and rows[13]["handling"] == "risk" and rows[8]["handling"] == "ignore"
    )
    table = CliRunner(env={"FLEETYIELD_CONFIG": None}).invoke(cli.main, ["xids"])
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].startswith("# catalog: node_agent/data/xid_catalog.csv (source: https://docs.nvidia.com/")
    assert lines[2].split() == ["XID", "NAME", "CATALOG", "ACTION", "HANDLING"]
    assert lines[3 + 78].split()[0] == "79" and lines[3 + 78].split()[-2:] == ["RESTART_BM", "drain"]
    config = _config_file(tmp_path)
    overridden = _cli_rows("--config", str(config))
    assert {x: overridden[x]["handling"] for x in (46, 43, 31, 154, 162)} == {
        46: "ignore",
        43: "drain",
        31: "ignore",
        154: "drain",
        162: "risk",
    }


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "fy.toml"
    path.write_text("[xids.overrides]\n" + "".join(f'{x} = "{h}"\n' for x, h in OVERRIDES.items()))
    return path


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _handling_seen(xid: int, state_dir: Path, params: Params) -> str:
    """Inject ``xid`` into a one-GPU fake agent and run the controller's path on what it emits: the push
    (through the listener's filter) and the scrape (through the scrape parser), two ticks of history first.
    'drain' if the tick drains the node, 'risk' if the xid_nonfatal signal moved the GPU's score."""
    clock = _Clock()
    backend = FakeBackend(state_dir, NODE, gpus=1, model="h100", clock=clock)
    backend.start()
    agent = Agent(backend, state_dir, NODE, clock)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(backend, NODE, clock))
    slurm = {NODE: SlurmNode(NODE, frozenset({"IDLE"}), gpu_count=1)}
    state, rng = ControllerState.empty(), random.Random(0)

    def step(pushed: tuple = ()) -> object:
        nonlocal state
        sample = parse_exposition(render(registry).decode(), NODE, clock())
        result = tick(state, Observations(clock(), slurm, {NODE: sample}, pushed), params, clock(), rng)
        state = result.state
        clock.now += 30.0
        return result

    step()
    step()
    answer = agent.inject(parse_fault({"kind": "xid", "xid": xid, "gpu": 0}))
    events = [AgentEvent.model_validate(e) for e in answer["events"]]
    result = step(tuple(fatal_events(events, frozenset(params.quarantine.quarantine_xids))))
    if any(isinstance(a, DrainNode) and a.node == NODE for a in result.plan.actions):  # type: ignore[attr-defined]
        return "drain"
    gpus = result.risks[NODE].gpus  # type: ignore[attr-defined]
    if any(c.signal == "xid_nonfatal" for g in gpus for c in g.contributions):
        return "risk"
    return "ignore"


@pytest.mark.parametrize("with_overrides", [False, True], ids=["catalog", "overrides"])
def test_every_catalog_xid_injected_through_the_fake_agent_gets_the_stated_handling(
    tmp_path: Path, with_overrides: bool
) -> None:
    args = ("--config", str(_config_file(tmp_path))) if with_overrides else ()
    stated = _cli_rows(*args)
    params = load(args[1]).core if with_overrides else from_mapping({}).core
    seen = {x: _handling_seen(x, tmp_path / f"xid{x}", params) for x in stated}
    assert seen == {x: row["handling"] for x, row in stated.items()}
    assert {"drain", "risk", "ignore"} == set(seen.values())


def test_the_prometheus_fatal_xid_alerts_match_the_catalog() -> None:
    rules = (Path(__file__).parents[1] / "contrib" / "prometheus" / "fleetyield-rules.yml").read_text()
    regexes = set(re.findall(r'xid=~"([0-9|]+)"', rules))
    assert regexes == {"|".join(str(x) for x in DEFAULT_QUARANTINE_XIDS)}
