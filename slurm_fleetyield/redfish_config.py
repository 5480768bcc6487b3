"""The ``[redfish]`` configuration table: which BMC serves which node, and how to talk to it.

Input: the TOML table (validated by pydantic). Output: ``RedfishConfig`` and, per node, a ``ResolvedBmc``.
Kept apart from ``adapters/redfish.py`` so that loading the controller's config never imports the Redfish
client (sushy) nor makes the other adapters depend on the Redfish adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class BmcNode(BaseModel):
    """One node's BMC. Unset fields come from the `[redfish]` defaults."""

    model_config = _STRICT

    address: str | None = Field(
        None, description="BMC base URL, e.g. 'https://gpu-001-bmc.mgmt'. Unset: redfish.address_template."
    )
    system_id: str | None = Field(
        None,
        description="Redfish ComputerSystem id under /redfish/v1/Systems/, or 'first': the BMC's only "
        "system (a BMC listing several is an error, never a guess). Unset: redfish.system_id.",
    )
    credentials_file: str | None = Field(
        None, description="Credentials file (line 1 user, line 2 password; mode 0600). Unset: the default."
    )


class RedfishConfig(BaseModel):
    """Power actions through each node's BMC (Redfish): the ladder's power_cycle rung, Suspend/Resume."""

    model_config = _STRICT

    enabled: bool = Field(
        False,
        description="Execute PowerCycle actions through the BMC. Also set "
        "core.lifecycle.power_cycle_enabled, or the ladders never emit one.",
    )
    address_template: str | None = Field(
        None,
        description="BMC URL of a node not listed in nodes; '{node}' is replaced by the Slurm node name, "
        "e.g. 'https://{node}-bmc.mgmt'. Unset: only listed nodes have a BMC.",
    )
    system_id: str = Field("first", description="Default Redfish system id ('first': the BMC's only one).")
    credentials_file: str | None = Field(
        None,
        description="Default credentials file: line 1 the BMC user, line 2 its password, mode 0600 (group "
        "or world bits are refused). Never put credentials in this file or on a command line.",
    )
    nodes: dict[str, BmcNode] = Field(
        default_factory=dict, description="Per-node BMC settings (node name -> address, system_id, file)."
    )
    auth: Literal["auto", "session", "basic"] = Field(
        "auto",
        description="Redfish authentication: 'session' (X-Auth-Token), 'basic' (HTTP basic on every "
        "request) or 'auto' (session, falling back to basic: sushy's default).",
    )
    verify_tls: bool | str = Field(
        True, description="Verify the BMC's certificate: true, false, or a CA bundle path."
    )
    connect_timeout_s: float = Field(5.0, gt=0, le=120, description="TCP connect timeout per request.")
    read_timeout_s: float = Field(30.0, gt=0, le=600, description="Read timeout per request.")
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="Extra attempts after a retryable failure (unreachable; timeout or 5xx of an idempotent "
        "request). Authentication errors are never retried: BMCs lock accounts.",
    )
    backoff_initial_s: float = Field(1.0, ge=0, description="Wait before the first retry.")
    backoff_max_s: float = Field(15.0, ge=0, description="Longest wait between retries (doubling).")
    poll_interval_s: float = Field(2.0, gt=0, description="Power state polling interval while waiting.")
    off_timeout_s: float = Field(
        60.0, gt=0, description="ForceOff must show PowerState Off within this (BMCs take seconds)."
    )
    off_dwell_s: float = Field(
        10.0,
        ge=0,
        description="Seconds to stay off in a power cycle before On: lets the board's rails and the GPUs' "
        "PCIe/NVSwitch state actually drain (the point of a cold cycle).",
    )
    on_timeout_s: float = Field(
        120.0,
        gt=0,
        description="On / a restart must show PowerState On within this. The node's OS, driver and slurmd "
        "take minutes more: the lifecycle's remediation timeout covers that, not this.",
    )
    rate_limit_actions: int = Field(
        5, ge=1, description="Fleet-wide power actions allowed per rate_limit_window_s (token bucket)."
    )
    rate_limit_window_s: float = Field(600.0, gt=0, description="Window of rate_limit_actions (seconds).")
    power_save_actions: int = Field(
        100,
        ge=1,
        description="Slurm power saving (Suspend/ResumeProgram) has its own bucket of this many actions per "
        "rate_limit_window_s, so it can neither starve remediation nor be starved by it (Slurm's "
        "SuspendRate/ResumeRate pace it first).",
    )
    rate_limit_state: str | None = Field(
        None,
        description="File shared by every process doing power actions on the controller host (daemon, "
        "RebootProgram handler, Suspend/Resume programs), so the limit is fleet-wide. Unset: "
        "'<gate state dir>/bmc-ratelimit.json'.",
    )

    @model_validator(mode="after")
    def _usable(self) -> RedfishConfig:
        if self.address_template is not None and "{node}" not in self.address_template:
            raise ValueError(f"address_template must contain '{{node}}', got {self.address_template!r}")
        for url in [self.address_template, *(n.address for n in self.nodes.values())]:
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"BMC address must be an http(s) URL, got {url!r}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"backoff_max_s={self.backoff_max_s!r} is below backoff_initial_s={self.backoff_initial_s!r}"
            )
        if self.enabled and self.credentials_file is None:
            missing = [n for n, b in self.nodes.items() if b.credentials_file is None]
            if missing or self.address_template is not None:
                who = ", ".join(sorted(missing)) or "nodes from address_template"
                raise ValueError(f"credentials_file is required (no default and none for {who})")
        return self

    def bmc_for(self, node: str) -> ResolvedBmc | None:
        """The node's BMC settings with defaults applied; None if the node has no BMC configured."""
        entry = self.nodes.get(node)
        address = entry.address if entry and entry.address else None
        if address is None and self.address_template is not None:
            address = self.address_template.replace("{node}", node)
        if address is None:
            return None
        creds = (entry.credentials_file if entry else None) or self.credentials_file
        system = (entry.system_id if entry else None) or self.system_id
        return ResolvedBmc(node, address.rstrip("/"), system, creds)


@dataclass(frozen=True, slots=True)
class ResolvedBmc:
    node: str
    address: str
    system_id: str
    credentials_file: str | None
