"""The pure parts of adapters/redfish.py: safety rules, config, credentials, redaction."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from slurm_fleetyield.adapters.redfish import (
    BmcConfigError,
    BmcNode,
    Credentials,
    PowerOp,
    RedfishConfig,
    SafetyContext,
    read_credentials,
    redact,
    safety_from_views,
    slurm_is_rebooting,
    slurm_safety,
)
from slurm_fleetyield.core.model import JobView, SlurmNode

N = "gpu-01"
CASES = [
    # context, op, expected rule (None: allowed)
    (SafetyContext(N, drained_by_us=True), PowerOp.POWER_CYCLE, None),
    (SafetyContext(N, (5,), drained_by_us=True), PowerOp.POWER_CYCLE, "safety"),
    (SafetyContext(N, (5,), quarantined=True), PowerOp.POWER_CYCLE, None),
    (SafetyContext(N), PowerOp.FORCE_RESTART, "safety"),  # in service, idle: not ours to cut
    (SafetyContext(N, slurm_initiated=True), PowerOp.FORCE_RESTART, None),
    (SafetyContext(N, (5,), slurm_initiated=True), PowerOp.POWER_OFF, "safety"),
    (SafetyContext(N, (5,)), PowerOp.POWER_ON, None),  # powering on hurts nobody
    (SafetyContext(N, slurm_initiated=True, counts_against_drain_cap=True), PowerOp.POWER_OFF, "drain_cap"),
    (
        SafetyContext(N, slurm_initiated=True, counts_against_drain_cap=True, drain_cap_room=1),
        PowerOp.POWER_OFF,
        None,
    ),
]


@pytest.mark.parametrize("ctx,op,rule", CASES)
def test_safety_rules(ctx: SafetyContext, op: PowerOp, rule: str | None) -> None:
    refusal = ctx.refusal(op)
    assert (refusal[0] if refusal else None) == rule


def node(states: set[str], reason: str = "") -> SlurmNode:
    return SlurmNode(N, frozenset(states), reason)


def test_safety_from_slurm_views() -> None:
    jobs = [JobView(1, "RUNNING", (N,)), JobView(2, "PENDING", ()), JobView(3, "COMPLETING", (N, "gpu-02"))]
    ctx = safety_from_views(N, node({"MIXED", "DRAIN"}, "fleetyield: XID 79"), jobs)
    assert ctx.running_jobs == (1, 3) and ctx.drained_by_us and not ctx.counts_against_drain_cap
    other = safety_from_views(N, node({"IDLE", "DRAIN"}, "admin: bad fan"), [])
    assert not other.drained_by_us and other.counts_against_drain_cap
    assert other.refusal(PowerOp.POWER_CYCLE) == (
        "safety",
        "node is neither drained by FleetYield, quarantined, nor handed over by Slurm",
    )


def test_slurm_safety_reads_slurm_at_each_call_and_checks_reboot_flag() -> None:
    class Slurm:
        reads = 0

        def read_nodes(self):  # type: ignore[no-untyped-def]
            self.reads += 1
            return {N: node({"IDLE", "REBOOT_ISSUED"})}

        def read_jobs(self):  # type: ignore[no-untyped-def]
            return []

    s = Slurm()
    check = slurm_safety(s, lambda n: False, initiated=slurm_is_rebooting)
    assert check(N, PowerOp.FORCE_RESTART).refusal(PowerOp.FORCE_RESTART) is None
    assert check("gpu-02", PowerOp.FORCE_RESTART).refusal(PowerOp.FORCE_RESTART) is not None
    assert s.reads == 2


def test_config_resolves_defaults_and_templates() -> None:
    c = RedfishConfig(
        address_template="https://{node}-bmc.mgmt",
        credentials_file="/etc/fleetyield/bmc.creds",
        nodes={"gpu-07": BmcNode(address="https://10.0.0.7/", system_id="System.Embedded.1")},
    )
    a = c.bmc_for("gpu-01")
    assert a is not None and (a.address, a.system_id, a.credentials_file) == (
        "https://gpu-01-bmc.mgmt",
        "first",
        "/etc/fleetyield/bmc.creds",
    )
    b = c.bmc_for("gpu-07")
    assert b is not None and (b.address, b.system_id) == ("https://10.0.0.7", "System.Embedded.1")
    assert RedfishConfig().bmc_for("gpu-01") is None


@pytest.mark.parametrize(
    "data,match",
    [
        ({"address_template": "https://bmc"}, "must contain"),
        ({"nodes": {"a": {"address": "10.0.0.1"}}}, "http"),
        ({"enabled": True, "nodes": {"a": {"address": "https://x"}}}, "credentials_file is required"),
        ({"backoff_initial_s": 5, "backoff_max_s": 1}, "backoff_max_s"),
        ({"nodes": {"a": {"password": "x"}}}, "Extra inputs"),  # no secret fields, ever
    ],
)
def test_config_errors(data: dict, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        RedfishConfig.model_validate(data)


def test_credentials_file(tmp_path: Path) -> None:
    p = tmp_path / "c"
    p.write_text("root\n  sp ace:d@\n")
    p.chmod(0o600)
    c = read_credentials(p)
    assert (c.username, c.password) == ("root", "  sp ace:d@")
    assert "sp ace" not in repr(c)
    p.chmod(0o640)
    with pytest.raises(BmcConfigError, match="640"):
        read_credentials(p)
    p.write_text("only-user\n")
    p.chmod(0o600)
    with pytest.raises(BmcConfigError, match="line 2") as err:
        read_credentials(p)
    assert "only-user" not in str(err.value)
    with pytest.raises(BmcConfigError, match="cannot read"):
        read_credentials(tmp_path / "missing")


def test_redact() -> None:
    c = Credentials("admin", "hunter2")
    text = "GET https://admin:hunter2@bmc/ Authorization: Basic YWRtaW46aHVudGVyMg== pw=hunter2"
    out = redact(text, c.secrets())
    assert "hunter2" not in out and "YWRtaW46aHVudGVyMg" not in out
    assert redact("https://u:p@host/x", ()) == "https://u:***@host/x"
