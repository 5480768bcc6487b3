"""Slurm's power hooks through the BMC: RebootProgram (node side) and Suspend/ResumeProgram (controller host).

Input: Slurm invoking ``fleetyield-redfish-reboot`` (on the node for RebootProgram, on the slurmctld host for
Suspend/Resume), a small node-side TOML file or the controller's config. Output: an exit status for Slurm, a
signed request to the controller, or power actions through ``adapters/redfish.py``.

Which design (``contrib/redfish/README.md`` has the long form): Slurm runs RebootProgram on the node, through
slurmd. We chose (a): the program asks the controller, over the agents' existing HMAC channel, and the
controller drives the BMC. Not (b), node-local BMC credentials: a BMC account is an administrator of the
board (firmware, virtual media, the management network), and compute nodes run users' code, so every node
would hold keys worth more than the node; a per-node limiter and audit file could not bound or record
power actions fleet-wide either. A request is honoured only for a node that Slurm itself shows with a reboot
pending (REBOOT_ISSUED/REQUESTED): the shared secret alone cannot reboot a neighbour. A node too hung to run
slurmd is not this program's case at all: the lifecycle's PowerCycle goes from the controller straight to the
BMC.

Modes of the one command:
- ``fleetyield-redfish-reboot [FEATURES...]``: RebootProgram. Slurm may append the node features requested
  by ``scontrol reboot`` as arguments (ignored). Reads ``/etc/fleetyield/redfish-reboot.toml`` (or
  ``$FLEETYIELD_REDFISH_REBOOT_CONFIG``); on "controller unreachable" only, runs ``fallback_command``
  (default: a plain ``systemctl reboot``, what Slurm would have done); a refusal is never overridden.
- ``--suspend HOSTLIST`` / ``--resume HOSTLIST``: Suspend/ResumeProgram, on the slurmctld host, reading the
  ``[redfish]`` and ``[gate]`` tables of the controller's config: power off / on through the adapter.

The controller side of (a) is ``RebootEndpoint``: the push listener mounts it at ``REBOOT_PATH``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from node_agent.clikit import version_option
from node_agent.httpclient import (
    BasicAuthConfig,
    ClientConfigError,
    HttpClient,
    HttpClientConfig,
    TlsClientConfig,
)
from slurm_fleetyield.adapters.redfish import (
    BmcConfigError,
    BmcError,
    PerThreadAudit,
    PowerController,
    PowerOp,
    PowerRefused,
    RedfishConfig,
    require_sushy,
)

log = logging.getLogger("fleetyield.redfish_reboot")

REBOOT_PATH = "/v1/bmc/reboot"
DEFAULT_NODE_CONFIG = "/etc/fleetyield/redfish-reboot.toml"
DEFAULT_CONTROLLER_CONFIG = "/etc/fleetyield/fleetyield.toml"
NODE_CONFIG_ENV = "FLEETYIELD_REDFISH_REBOOT_CONFIG"
REBOOT_OPERATIONS = (PowerOp.FORCE_RESTART, PowerOp.GRACEFUL_RESTART, PowerOp.POWER_CYCLE)

EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_CONFIG = 0, 1, 2, 3


# --------------------------------------------------------------------------------------------------------
# Wire format
# --------------------------------------------------------------------------------------------------------


class RebootRequest(BaseModel):
    """Body of ``POST /v1/bmc/reboot`` (signed like the agents' pushes: node, timestamp, HMAC headers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1, max_length=128)
    operation: Literal["force_restart", "graceful_restart", "power_cycle"] = "force_restart"
    request_id: str = Field(pattern=r"^[A-Za-z0-9_.:-]{8,128}$")
    features: list[str] = Field(default_factory=list, max_length=64)


class NodeRebootConfig(BaseModel):
    """``/etc/fleetyield/redfish-reboot.toml`` on every compute node. No BMC credentials here, ever."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    controller_url: str = Field(description="Controller push listener, e.g. 'http://slurmctl:9402'.")
    secret_file: str = Field(description="The agent's push secret (same file as --push-secret-file), 0600.")
    node: str | None = Field(None, description="Slurm node name. Unset: the short host name.")
    operation: Literal["force_restart", "graceful_restart", "power_cycle"] = Field(
        "force_restart", description="What the controller asks the BMC for."
    )
    timeout_s: float = Field(20.0, gt=0, le=300, description="HTTP timeout of the request.")
    fallback_command: list[str] | None = Field(
        default_factory=lambda: ["systemctl", "reboot"],
        description="Run when the controller cannot be reached (never when it refuses). Empty/null: none.",
    )
    controller_basic_auth: BasicAuthConfig | None = Field(
        None,
        description="Basic auth for a push listener served with a web-config file: {username, "
        "password_file} (the agent's push_basic_auth).",
    )
    controller_tls_config: TlsClientConfig | None = Field(
        None,
        description="TLS for an https:// controller_url: {ca_file, cert_file, key_file} (the agent's "
        "push_tls_config).",
    )

    @model_validator(mode="after")
    def _tls_needs_https(self) -> NodeRebootConfig:
        if self.controller_tls_config is not None and not self.controller_url.startswith("https://"):
            raise ValueError(
                "controller_tls_config is set but controller_url is not https://, "
                f"got {self.controller_url!r}"
            )
        return self

    def client(self) -> HttpClient | None:
        """The client for the controller's listener, or None (plain HTTP, no credentials); a file it names
        that cannot be used is a ``ClientConfigError`` naming the field and the value."""
        if self.controller_basic_auth is None and self.controller_tls_config is None:
            return None
        cfg = HttpClientConfig(basic_auth=self.controller_basic_auth, tls_config=self.controller_tls_config)
        return HttpClient(cfg, "controller_")


# --------------------------------------------------------------------------------------------------------
# Controller side
# --------------------------------------------------------------------------------------------------------


class RebootEndpoint:
    """``POST REBOOT_PATH`` on the controller: verify, admit (safety + rate limit + audit), answer 202, then
    drive the BMC in a background thread (the requesting node is about to go down: it cannot wait).

    ``power`` must be built with ``slurm_safety(..., initiated=slurm_is_rebooting)`` so only a node Slurm is
    rebooting can be power-actioned through this path. Answers: 202 accepted, 400 malformed, 401 bad
    signature, 409 refused (safety, drain cap, config), 429 rate limited, 503 audit unavailable.
    """

    def __init__(
        self,
        power: PowerController,
        secret: bytes,
        *,
        max_skew_s: float = 300.0,
        run_async: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.power = power
        self.secret = secret
        self.max_skew_s = max_skew_s
        self._run_async = run_async or _thread
        self._seen: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._lock = threading.Lock()

    def handle(self, headers: Mapping[str, str], body: bytes, now: float) -> tuple[int, dict[str, Any]]:
        from node_agent.protocol import SignatureError, verify_signed

        try:
            node = verify_signed(self.secret, headers, body, now, self.max_skew_s)
        except SignatureError as exc:
            return 401, {"error": str(exc)}
        try:
            req = RebootRequest.model_validate_json(body)
        except ValidationError as exc:
            return 400, {"error": f"malformed body: {exc.errors()[0]['msg']}"}
        if req.node != node:
            return 401, {"error": f"node mismatch: header says {node!r}, body says {req.node!r}"}
        if not self._first_use(req.request_id, now):
            return 409, {"error": f"request {req.request_id} already seen (replay)"}
        try:
            admitted = self.power.admit(node, req.operation, reason=f"slurm RebootProgram {req.request_id}")
        except PowerRefused as exc:
            status = {"rate_limit": 429, "audit": 503}.get(exc.rule, 409)
            return status, {"error": str(exc), "rule": exc.rule}

        def perform() -> None:
            try:
                self.power.perform(admitted)
            except BmcError as exc:  # audited by perform; the lifecycle sees the node not coming back
                log.error("RebootProgram power action failed: %s", exc)

        self._run_async(perform)
        return 202, {"node": node, "operation": req.operation, "request_id": req.request_id}

    def _first_use(self, request_id: str, now: float) -> bool:
        with self._lock:
            horizon = now - 2 * self.max_skew_s  # older ids fail the timestamp check anyway
            while self._seen and next(iter(self._seen.values())) < horizon:
                self._seen.popitem(last=False)
            if request_id in self._seen:
                return False
            self._seen[request_id] = now
            return True


def _thread(fn: Callable[[], None]) -> None:
    threading.Thread(target=fn, name="fleetyield-bmc", daemon=True).start()


def open_controller_power(
    config_path: str | Path, *, safety: Any, power_save: bool = False
) -> PowerController:
    """A ``PowerController`` from the controller's TOML (``[redfish]``, ``[gate]``, ``[store]``), with the
    gate's audit log and the shared rate-limit file. ``power_save``: Slurm's power saving gets its own
    bucket (``bmc-ratelimit-powersave.json``, ``power_save_actions`` per window) so it cannot starve
    remediation, nor remediation it."""
    from slurm_fleetyield.adapters.bmc_ratelimit import TokenBucket
    from slurm_fleetyield.gate.audit import AuditLog

    data = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
    config = RedfishConfig.model_validate(data.get("redfish", {}))
    require_sushy()  # Suspend/ResumeProgram run on the controller host, which installs [controller]
    gate_dir = Path(
        data.get("gate", {}).get("state_dir")
        or Path(data.get("store", {}).get("path", "/var/lib/fleetyield/fleetyield.db")).parent / "gate"
    )
    gate_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if power_save:
        bucket = TokenBucket(
            config.power_save_actions,
            config.rate_limit_window_s,
            state_path=gate_dir / "bmc-ratelimit-powersave.json",
        )
    else:
        state = config.rate_limit_state or gate_dir / "bmc-ratelimit.json"
        bucket = TokenBucket(config.rate_limit_actions, config.rate_limit_window_s, state_path=state)
    audit = PerThreadAudit(lambda: AuditLog.open(gate_dir / "gate.db", gate_dir / "audit.head"))
    return PowerController(config, safety=safety, audit=audit, bucket=bucket)


# --------------------------------------------------------------------------------------------------------
# Node side
# --------------------------------------------------------------------------------------------------------


class ControllerUnreachable(Exception):
    """No HTTP answer from the controller."""


def request_reboot(
    config: NodeRebootConfig,
    secret: bytes,
    node: str,
    *,
    features: Sequence[str] = (),
    now: Callable[[], float] = time.time,
    client: HttpClient | None = None,
) -> tuple[int, dict[str, Any]]:
    """POST the signed request (with ``client``'s credentials, ``NodeRebootConfig.client()``); (status,
    answer). ``ControllerUnreachable`` when no answer came back."""
    from node_agent.httpclient import urlopen
    from node_agent.protocol import signed_headers

    body = (
        RebootRequest(
            node=node, operation=config.operation, request_id=uuid.uuid4().hex, features=list(features)
        )
        .model_dump_json()
        .encode()
    )
    headers = signed_headers(secret, node, int(now()), body)
    url = config.controller_url.rstrip("/") + REBOOT_PATH
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urlopen(req, config.timeout_s, client) as resp:
            return resp.status, _json(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _json(exc.read())
    except (urllib.error.URLError, OSError) as exc:  # refused, no route, DNS, timeout
        raise ControllerUnreachable(f"{url}: {getattr(exc, 'reason', exc)}") from None


def _json(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        return {"error": raw[:200].decode("utf-8", "replace")}
    return doc if isinstance(doc, dict) else {"answer": doc}


def load_node_config(path: str | Path) -> NodeRebootConfig:
    p = Path(path)
    try:
        return NodeRebootConfig.model_validate(tomllib.loads(p.read_text(encoding="utf-8")))
    except OSError as exc:
        raise click.ClickException(f"{p}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise click.ClickException(f"{p}: {exc}") from None


def reboot_program(
    config: NodeRebootConfig,
    features: Sequence[str],
    *,
    run: Callable[[list[str]], int] = lambda argv: subprocess.call(argv),
    request: Callable[..., tuple[int, dict[str, Any]]] = request_reboot,
) -> int:
    """The RebootProgram's decision: exit status for slurmd."""
    from slurm_fleetyield.config import ConfigError, read_secret

    node = config.node or socket.gethostname().split(".")[0]
    try:
        secret = read_secret(config.secret_file, "secret_file")
        client = config.client()
    except ConfigError as exc:
        log.error("%s", exc)
        return EXIT_CONFIG
    except ClientConfigError as exc:
        log.error("%s: %s", exc.file, exc)
        return EXIT_CONFIG
    try:
        status, answer = request(config, secret, node, features=features, client=client)
    except ClientConfigError as exc:  # the password file became unreadable since
        log.error("%s: %s", exc.file, exc)
        return EXIT_CONFIG
    except ControllerUnreachable as exc:
        if not config.fallback_command:
            log.error("controller unreachable (%s); no fallback_command", exc)
            return EXIT_UNREACHABLE
        log.error("controller unreachable (%s); falling back to %s", exc, " ".join(config.fallback_command))
        return EXIT_OK if run(list(config.fallback_command)) == 0 else EXIT_UNREACHABLE
    if status == 202:
        log.warning("controller accepted %s of %s (%s)", config.operation, node, answer.get("request_id"))
        return EXIT_OK
    if status in (401, 403) and not answer.get("error"):  # the listener's web-config, not our HMAC
        log.error(
            "controller's listener refused our credentials for %s of %s: HTTP %d: set controller_basic_auth "
            "(and controller_tls_config) in the reboot config to what its web-config accepts",
            config.operation,
            node,
            status,
        )
        return EXIT_REFUSED
    log.error("controller refused %s of %s: HTTP %d %s", config.operation, node, status, answer.get("error"))
    return EXIT_REFUSED


# --------------------------------------------------------------------------------------------------------
# Suspend / Resume (slurmctld host)
# --------------------------------------------------------------------------------------------------------


def power_save(power: PowerController, nodes: Sequence[str], op: PowerOp) -> int:
    """Power every node off (SuspendProgram) or on (ResumeProgram); exit 1 if any failed (each is tried)."""
    failed = 0
    for node in nodes:
        try:
            power.act(
                node, op, reason=f"slurm {'SuspendProgram' if op is PowerOp.POWER_OFF else 'ResumeProgram'}"
            )
        except (PowerRefused, BmcError) as exc:
            failed += 1
            log.error("%s", exc)
    return EXIT_REFUSED if failed else EXIT_OK


def _expand(hostlist: str, bin_dir: str | None) -> list[str]:
    from slurm_fleetyield.adapters.slurm import SlurmCli

    return list(SlurmCli(bin_dir=bin_dir).expand_hostlists([hostlist])[hostlist])


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("features", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--reboot-config",
    type=click.Path(dir_okay=False),
    default=lambda: os.environ.get(NODE_CONFIG_ENV, DEFAULT_NODE_CONFIG),
    show_default=DEFAULT_NODE_CONFIG,
    help="Node-side config (RebootProgram mode).",
)
@click.option("--suspend", "suspend", metavar="HOSTLIST", help="SuspendProgram mode: power these nodes off.")
@click.option("--resume", "resume", metavar="HOSTLIST", help="ResumeProgram mode: power these nodes on.")
@click.option(
    "--controller-config",
    type=click.Path(dir_okay=False),
    default=DEFAULT_CONTROLLER_CONFIG,
    show_default=True,
    help="Controller config ([redfish], [gate]) for --suspend/--resume.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO (default WARNING) to stderr.")
@version_option()
def main(
    features: tuple[str, ...],
    reboot_config: str,
    suspend: str | None,
    resume: str | None,
    controller_config: str,
    verbose: bool,
) -> None:
    """Slurm RebootProgram (default) or Suspend/ResumeProgram (--suspend/--resume) through the BMC."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr)
    if suspend and resume:
        raise click.UsageError("--suspend and --resume are exclusive")
    if suspend or resume:
        from slurm_fleetyield.adapters.redfish import slurm_safety
        from slurm_fleetyield.adapters.slurm import SlurmCli

        data = tomllib.loads(Path(controller_config).read_text(encoding="utf-8"))
        bin_dir = data.get("slurm", {}).get("bin_dir")
        # Slurm's power saving only suspends idle nodes; the safety callback still re-reads the jobs
        safety = slurm_safety(SlurmCli(bin_dir=bin_dir), lambda _n: False, initiated=lambda _v: True)
        try:
            power = open_controller_power(controller_config, safety=safety, power_save=True)
        except BmcConfigError as exc:
            raise click.ClickException(f"{controller_config}: {exc}") from None
        op = PowerOp.POWER_OFF if suspend else PowerOp.POWER_ON
        sys.exit(power_save(power, _expand(suspend or resume or "", bin_dir), op))
    sys.exit(reboot_program(load_node_config(reboot_config), features))
