"""CLI conventions of every console script (node_agent/clikit.py): ``--version``; ``--json`` on every command
that prints data; under ``--json`` an error is ``{"error": ...}`` on stderr with a non-zero status."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from node_agent.cli import main as agent_main
from slurm_fleetyield.cli import main as fy_main

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
VERSION = importlib.metadata.version("fleetyield")

# Commands that print no data: the daemons (their output is their logs).
NO_DATA = {("fleetyield-agent", "serve")}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_console_script_has_version(script: str) -> None:
    module, func = SCRIPTS[script].split(":")
    code = f"import sys; sys.argv[0] = {script!r}; from {module} import {func}; {func}()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{script} {VERSION}\n"


Leaf = tuple[tuple[str, ...], click.Command]


def _leaves(cmd: click.Command, ctx: click.Context, path: tuple[str, ...]) -> Iterator[Leaf]:
    if not isinstance(cmd, click.Group):
        yield path, cmd
        return
    for name in cmd.list_commands(ctx):
        sub = cmd.get_command(ctx, name)
        assert sub is not None, (path, name)
        yield from _leaves(sub, click.Context(sub, info_name=name, parent=ctx), (*path, name))


def _all_leaves() -> list[tuple[click.Command, tuple[str, ...], click.Command]]:
    out = []
    for script, root in (("fleetyield", fy_main), ("fleetyield-agent", agent_main)):
        ctx = click.Context(root, info_name=script)
        out += [(root, path, cmd) for path, cmd in _leaves(root, ctx, (script,))]
    return out


LEAVES = _all_leaves()


def test_the_walk_sees_the_lazy_groups() -> None:
    paths = {" ".join(path) for _, path, _ in LEAVES}
    for expected in ("fleetyield attest nodes", "fleetyield simulate run", "fleetyield chaos ab",
                     "fleetyield-agent attest handover", "fleetyield-agent fault list",
                     "fleetyield doctor"):  # fmt: skip
        assert expected in paths
    assert sum(p.startswith("fleetyield attest ") for p in paths) == 8


@pytest.mark.parametrize(("root", "path", "cmd"), LEAVES, ids=[" ".join(p) for _, p, _ in LEAVES])
def test_every_command_that_prints_takes_json_and_fails_in_json(root, path, cmd) -> None:
    if path[:2] in NO_DATA:
        pytest.skip("prints no data")
    assert "--json" in {opt for p in cmd.params for opt in getattr(p, "opts", ())}, path
    result = CliRunner().invoke(root, [*path[1:], "--json", "--no-such-option"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert json.loads(result.stderr) == {"error": "No such option '--no-such-option'."}


def test_without_json_errors_stay_text() -> None:
    result = CliRunner().invoke(fy_main, ["attest", "nodes", "--no-such-option"])
    assert result.exit_code == 2 and "Error: No such option '--no-such-option'." in result.stderr


def test_runtime_errors_under_json(tmp_path: Path) -> None:
    # a refusal inside the command (not a parse error), from each CLI
    db = tmp_path / "absent" / "attest.db"
    result = CliRunner().invoke(fy_main, ["attest", "nodes", "--db", str(db), "--json"])
    assert result.exit_code == 2 and result.stdout == ""
    assert str(db) in json.loads(result.stderr)["error"]
    no_config = tmp_path / "no.toml"
    result = CliRunner().invoke(fy_main, ["explain", "gpu-01", "--config", str(no_config), "--json"])
    assert result.exit_code == 1 and f"{no_config}: cannot read" in json.loads(result.stderr)["error"]
    result = CliRunner().invoke(agent_main, ["fault", "clear", "--state-dir", str(tmp_path), "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stderr) == {"error": "say which faults: --id ID, or --all [--gpu N]"}
    result = CliRunner().invoke(agent_main, ["fault", "clear", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2 and result.stderr == "Error: say which faults: --id ID, or --all [--gpu N]\n"
