"""``promtool check metrics`` on the fake agent's /metrics, as Prometheus' own linter reads it.

The only warnings allowed are those dcgm-exporter's own names cause (``DCGM_ALLOWED``): its field names are
DCGM's (counters without ``_total``, ``PCIE_REPLAY_COUNTER`` naming its type) and its labels are camelCase
(``modelName``, ``Hostname``), also on ``fleetyield_gpu_xid_errors_total``, which carries them to join the
DCGM series; renaming them would break every dashboard and rule written for dcgm-exporter. Anything else
(FleetYield's own families, the host metrics) must be clean. promtool comes with Debian's ``prometheus``
package (``.ci/run`` installs it); without it the test skips, except under CI where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from node_agent.config import build_config
from node_agent.exporter import Server

DCGM_ALLOWED = (
    re.compile(r'^DCGM_\w+ counter metrics should have "_total" suffix$'),
    re.compile(r"^DCGM_\w+ label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$"),
    # our exact XID counter carries dcgm-exporter's GPU label set (modelName, Hostname) so rules join it with
    # the DCGM series; its camelCase labels are DCGM's names, its own name is snake_case with _total
    re.compile(
        r"^fleetyield_gpu_xid_errors_total label names should be written in 'snake_case' not 'camelCase'$"
    ),
)


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        reason = "promtool not installed (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    return path


def _scrape(tmp_path: Path, lowercase: bool) -> str:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text("4242\n")  # an hpc_job label on GPU 1's series
    cfg = build_config(
        None,
        {
            "backend": "fake",
            "listen": "127.0.0.1",
            "port": 0,
            "state_dir": tmp_path / "state",
            "gpus": 2,
            "hostname": "gpu-lint",
            "lowercase_hostname": lowercase or None,
            "hpc_job_mapping_dir": jobs,
        },
    )
    srv = Server(cfg)
    srv.start()
    try:
        from node_agent.faults import parse_fault

        assert srv.agent is not None
        srv.agent.inject(parse_fault({"kind": "xid", "gpu": 0, "xid": 48}))  # XID series, err_msg label
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10) as resp:
            return resp.read().decode()
    finally:
        srv.stop()


def _problems(promtool: str, text: str) -> list[str]:
    out = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    lines = [line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode in (0, 3), (out.returncode, lines)  # 3: lint warnings only; 1: unparsable
    return lines


@pytest.mark.parametrize("lowercase", [False, True], ids=["Hostname", "hostname"])
def test_promtool_warns_only_about_dcgms_own_names(promtool: str, tmp_path: Path, lowercase: bool) -> None:
    text = _scrape(tmp_path, lowercase)
    assert "fleetyield_gpu_xid_errors_total{" in text and 'hpc_job="4242"' in text
    lines = _problems(promtool, text)
    others = [line for line in lines if not any(p.match(line) for p in DCGM_ALLOWED)]
    assert others == [], others
    assert any(line.startswith("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter") for line in lines)


def test_the_allowlist_does_not_hide_our_own_names(promtool: str) -> None:
    """A FleetYield counter without ``_total`` or a camelCase label of ours is reported and not allowed."""
    bad = (
        "# HELP fleetyield_agent_restarts Restarts.\n# TYPE fleetyield_agent_restarts counter\n"
        'fleetyield_agent_restarts{threadName="x"} 1\n'
    )
    lines = _problems(promtool, bad)
    assert lines and not any(p.match(line) for line in lines for p in DCGM_ALLOWED), lines
