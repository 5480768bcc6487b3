"""The Redfish test rig: a real BMC: sushy-tools' sushy-emulator with its fake systems driver.

``contrib/redfish/fake_bmc.py`` runs the emulator as a subprocess on 127.0.0.1 (a free port), with HTTP basic
auth (a bcrypt htpasswd file, ``SUSHY_EMULATOR_AUTH_FILE``), one fake system per node (``gpu-01`` ...), a
fixed 1 s power-change delay and one system that never powers back on (``gpu-stuck``).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
from rig import free_port, start_fake_bmc, stop_group, system_uuid

from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket
from slurm_fleetyield.adapters.redfish import (
    BmcNode,
    PowerController,
    PowerOp,
    RedfishConfig,
    SafetyContext,
)

ROOT = Path(__file__).resolve().parents[2]
FAKE_BMC = ROOT / "contrib" / "redfish" / "fake_bmc.py"
USER, PASSWORD = "fy-admin", "Pa55:w0rd/with@odd=chars"
NODES = [f"gpu-{i:02d}" for i in range(1, 15)]
STUCK = "gpu-stuck"


@dataclass
class Emulator:
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    systems: dict[str, str] = field(default_factory=dict)  # node -> system uuid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, nodes: list[str], stuck: tuple[str, ...] = (), delay_s: int = 1) -> Emulator:
        self.workdir.mkdir(parents=True, exist_ok=True)
        htpasswd = self.workdir / "htpasswd"
        digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{USER}:{digest}\n")
        self.systems = {n: system_uuid(i) for i, n in enumerate(nodes, start=1)}
        fake = [{"uuid": u, "name": n, "power_state": "On", "nics": []} for n, u in self.systems.items()]
        config = self.workdir / "emulator.conf.py"
        config.write_text(
            f"SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n"
            f"SUSHY_EMULATOR_LISTEN_PORT = {self.port}\n"
            f"SUSHY_EMULATOR_FAKE_DRIVER = True\n"
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(self.workdir / 'state')!r}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
            f"FLEETYIELD_FAKE_DELAY_S = {delay_s}\n"
            f"FLEETYIELD_FAKE_STUCK = {list(stuck)!r}\n"
        )
        self.proc = start_fake_bmc(config, self.workdir / "emulator.log", self.url)
        return self

    def stop(self) -> None:
        stop_group(self.proc)

    def node_map(self, **overrides: Any) -> dict[str, BmcNode]:
        return {n: BmcNode(address=self.url, system_id=u, **overrides) for n, u in self.systems.items()}


def write_credentials(path: Path, user: str = USER, password: str = PASSWORD, mode: int = 0o600) -> Path:
    path.write_text(f"{user}\n{password}\n")
    path.chmod(mode)
    return path


class RecordingAudit:
    """An ``AuditSink`` that keeps entries in memory (the gate's AuditLog is exercised separately)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def append(self, *, time: float, actor: str, kind: str, subject: str, data: dict[str, Any]) -> None:
        self.entries.append({"time": time, "actor": actor, "kind": kind, "subject": subject, "data": data})

    def results(self, node: str | None = None) -> list[str]:
        return [e["data"]["result"] for e in self.entries if node is None or e["subject"] == node]


def drained(node: str, op: PowerOp) -> SafetyContext:
    return SafetyContext(node, drained_by_us=True)


def make_config(emulator: Emulator, creds: Path, **kw: Any) -> RedfishConfig:
    base: dict[str, Any] = {
        "enabled": True,
        "credentials_file": str(creds),
        "auth": "basic",
        "nodes": emulator.node_map(),
        "connect_timeout_s": 2.0,
        "read_timeout_s": 5.0,
        "poll_interval_s": 0.2,
        "off_timeout_s": 8.0,
        "on_timeout_s": 8.0,
        "off_dwell_s": 0.2,
        "backoff_initial_s": 0.5,
        "backoff_max_s": 2.0,
        "rate_limit_actions": 100,
    }
    base.update(kw)
    return RedfishConfig.model_validate(base)


def make_controller(
    config: RedfishConfig,
    *,
    safety: Any = drained,
    audit: Any = None,
    bucket: TokenBucket | None = None,
    **kw: Any,
) -> PowerController:
    return PowerController(
        config, safety=safety, audit=audit if audit is not None else RecordingAudit(), bucket=bucket, **kw
    )
