"""``fleetyield-prolog --help`` / ``--version`` (and the epilog's) answer and touch nothing: no config read,
no log line, no log file, spool or mapping directory created. The job path never imports click."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from prolog_epilog import _hooklib as lib


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def _run(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"prolog_epilog.{name}", *args], env=env,
                          capture_output=True, text=True, timeout=30, cwd="/")  # fmt: skip


@pytest.mark.parametrize("name", ["prolog", "epilog"])
@pytest.mark.parametrize("flag", ["--help", "-h", "--version"])
def test_help_and_version_touch_nothing(node, name: str, flag: str) -> None:
    before = _files(node.root)
    proc = _run(name, node.env(), flag)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no log line either
    if flag == "--version":
        assert proc.stdout == f"fleetyield-{name} {importlib.metadata.version('fleetyield')}\n"
    else:
        assert proc.stdout.startswith(f"Usage: fleetyield-{name} [OPTIONS]") and "--version" in proc.stdout
    assert _files(node.root) == before
    assert not node.log_file.exists() and not node.spool.exists() and not node.map_dir.exists()


def test_the_hook_itself_still_logs(node) -> None:
    # the contrast: run as slurmd runs it (no arguments), the same hook writes its log file
    proc = _run("prolog", node.env())
    assert proc.returncode == 0, proc.stderr
    assert node.log_file.exists() and "allow user=alice" in node.log_file.read_text()


def test_only_a_persons_flags_leave_the_job_path() -> None:
    assert not lib.asked_for_cli([])
    assert not lib.asked_for_cli(["1001", "--helpx", "-v"])
    assert lib.asked_for_cli(["--version"]) and lib.asked_for_cli(["x", "-h"])


def test_the_job_path_does_not_import_click() -> None:
    code = "import sys, prolog_epilog.prolog, prolog_epilog.epilog; print('click' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.stdout.strip() == "False", proc.stderr
