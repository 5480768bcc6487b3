"""contrib/systemd units: hardening directives present, and ``systemd-analyze verify`` (and ``security
--offline``) clean where systemd-analyze exists, run against a throw-away root so nothing is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).parents[1] / "contrib" / "systemd"
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
}
MAX_EXPOSURE = {"fleetyield-controller": 2.0, "fleetyield-agent": 3.5}
"""``systemd-analyze security`` exposure ceilings (0 best, 10 worst); measured 1.4 and 2.7 on systemd 252."""


def directives(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    text = re.sub(r"\\\n\s*", " ", unit.read_text())
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_unit_is_hardened(name):
    d = directives(UNITS / f"{name}.service")
    for key, value in HARDENING.items():
        assert d.get(key) == [value], (name, key)
    assert "@system-service" in d["SystemCallFilter"]
    assert d["RestrictAddressFamilies"][0].startswith("AF_UNIX AF_INET AF_INET6")
    assert d["ReadWritePaths"] and d["StateDirectory"]
    assert d["CapabilityBoundingSet"] in ([""], ["CAP_SYS_ADMIN"])
    assert len(d.get("LimitNOFILE", [])) == 1 and int(d["LimitNOFILE"][0]) >= 8192, (name, "LimitNOFILE")
    assert d["Documentation"] == ["file:///opt/fleetyield/docs/admin-guide.md"]  # the .deb installs it


def test_controller_runs_unprivileged_with_no_capabilities():
    d = directives(UNITS / "fleetyield-controller.service")
    assert (
        d["User"] == ["fleetyield"] and d["CapabilityBoundingSet"] == [""] and d["PrivateDevices"] == ["yes"]
    )
    assert d["ReadWritePaths"] == ["/var/lib/fleetyield"]


def test_agent_keeps_only_what_nvml_and_resets_need():
    d = directives(UNITS / "fleetyield-agent.service")
    assert "User" not in d and d["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    assert d["DevicePolicy"] == ["closed"] and "/dev/nvidiactl rw" in d["DeviceAllow"]
    assert "--push-secret-file /etc/fleetyield/push.secret" in d["ExecStart"][0]


def test_the_agents_default_file_passes_more_options_such_as_a_web_config_file():
    """/etc/default/fleetyield-agent's FLEETYIELD_AGENT_ARGS reaches ExecStart unbraced: systemd splits it
    into words, and an empty one adds no argument."""
    d = directives(UNITS / "fleetyield-agent.service")
    assert d["ExecStart"][0].split()[-1] == "$FLEETYIELD_AGENT_ARGS"
    default = (UNITS / "fleetyield-agent.default").read_text()
    assert re.search(r"^FLEETYIELD_AGENT_ARGS=$", default, re.M)
    assert re.search(r"^#FLEETYIELD_AGENT_ARGS=--web-config-file \S+ --config \S+$", default, re.M)


def test_fd_limits_leave_room_above_the_listener_caps():
    """Issue 27 item 1: 1,017 half-sent requests used the default 1,024 FDs and every tick failed with
    EMFILE. The units raise the limit well above what the listeners may hold (their caps)."""
    from node_agent.exporter import AGENT_LIMITS
    from slurm_fleetyield.config import Config

    cfg = Config()
    controller = directives(UNITS / "fleetyield-controller.service")["LimitNOFILE"]
    agent = directives(UNITS / "fleetyield-agent.service")["LimitNOFILE"]
    assert int(controller[0]) >= 4 * (cfg.push.max_connections + cfg.api.max_connections)
    assert int(agent[0]) >= 4 * AGENT_LIMITS.max_connections


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory):
    if shutil.which("systemd-analyze") is None or not Path("/usr/lib/systemd/system/sysinit.target").exists():
        pytest.skip("systemd-analyze (Debian: apt-get install systemd) is not available")
    root = tmp_path_factory.mktemp("root")
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "opt/fleetyield/bin").mkdir(parents=True)
    for exe in ("fleetyield", "fleetyield-agent"):
        (root / "opt/fleetyield/bin" / exe).write_text("#!/bin/sh\n")
        (root / "opt/fleetyield/bin" / exe).chmod(0o755)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS.glob("*.service"):
        shutil.copy(unit, root / "etc/systemd/system" / unit.name)
    return root


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_systemd_analyze_verify_is_clean(fake_root, name):
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={fake_root}", f"{name}.service"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_systemd_analyze_security_score(fake_root, name):
    proc = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", f"--root={fake_root}", f"{name}.service"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    if m is None:
        pytest.skip(f"systemd-analyze security --offline unsupported here: {proc.stderr[-300:]}")
    print(f"{name}: exposure {m.group(1)}")
    assert float(m.group(1)) <= MAX_EXPOSURE[name]
