"""Package extras: a GPU node's default install (agent, hooks, RebootProgram) runs without the controller's
Redfish stack; ``fleetyield[controller]`` brings it, ``dev`` includes that; the controller says which extra
is missing when [redfish] is enabled without it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CONTROLLER_ONLY = ("sushy", "requests", "pbr", "stevedore")


def _names(reqs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in reqs}


def test_the_redfish_client_is_a_controller_extra() -> None:
    extras = PROJECT["optional-dependencies"]
    assert not _names(PROJECT["dependencies"]) & set(CONTROLLER_ONLY)
    assert "sushy" in _names(extras["controller"])
    assert "fleetyield[controller]" in extras["dev"]


# A node without the controller's packages: importing any of them fails, as on a default install.
_NODE = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: a GPU node's install)")
sys.meta_path.insert(0, Absent())
import importlib
for module in {modules!r}:
    importlib.import_module(module)
from click.testing import CliRunner
from node_agent.cli import main
for args in (["--help"], ["serve", "--help"], ["attest", "--help"], ["metrics", "--backend", "fake",
             "--state-dir", sys.argv[1], "--gpus", "1", "--hostname", "n1"]):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (args, result.output)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
assert not loaded, loaded
print("ok")
"""

NODE_MODULES = [
    "node_agent.cli", "node_agent.exporter", "node_agent.agent", "node_agent.backends.nvml",
    "node_agent.attest.cli", "node_agent.attest.service", "prolog_epilog.prolog", "prolog_epilog.epilog",
    "prolog_epilog.attest_gate", "prolog_epilog._cli", "slurm_fleetyield.redfish_reboot",
]  # fmt: skip


def test_agent_hooks_and_reboot_program_import_without_the_controller_extra(tmp_path: Path) -> None:
    code = _NODE.format(blocked=CONTROLLER_ONLY, modules=NODE_MODULES)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "state")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_redfish_without_sushy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_fleetyield.adapters.redfish import BmcConfigError, require_sushy

    require_sushy()  # installed here (dev)
    monkeypatch.setitem(sys.modules, "sushy", None)  # what an install without [controller] looks like
    with pytest.raises(BmcConfigError, match=r"pip install 'fleetyield\[controller\]'"):
        require_sushy()


def test_the_daemon_refuses_redfish_without_sushy_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_fleetyield import config as config_mod
    from slurm_fleetyield.daemon import build_redfish

    cfg = config_mod.from_mapping({"redfish": {"enabled": True}}, "fy.toml")
    monkeypatch.setitem(sys.modules, "sushy", None)
    with pytest.raises(config_mod.ConfigError, match=r"\[redfish\]: .*fleetyield\[controller\]"):
        build_redfish(cfg, None, None, lambda: None, dry_run=True)  # type: ignore[arg-type]
