"""The controller's configuration: one TOML file, validated, grouped per concern, every field documented.

Input: a TOML file (``contrib/fleetyield.example.toml`` documents every key). Output: a frozen ``Config``.
Loading is two passes, like node-problem-detector's: pydantic applies defaults and checks each field, then
cross-field rules run on the complete model. Any error is a ``ConfigError`` naming the file, the field
(dotted path) and the bad value; nothing is clamped or guessed.
"""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from node_agent.httpclient import BasicAuthConfig, HttpClientConfig, TlsClientConfig
from node_agent.xid_catalog import CatalogError, Handling
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.redfish_config import RedfishConfig
from slurm_fleetyield.xids import catalog_at, resolve

# Strict types ("0.5", true or 1 is no float, "yes" no bool, "9402" no int; an integer is a float) and finite
# numbers only (inf/nan refused), like core/params.py.
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

MIN_SECRET_BYTES = 16
"""Shortest HMAC secret accepted, on both sides of the channel (node_agent/config.py: the same rule)."""


class ConfigError(Exception):
    """The configuration cannot be used. ``str()`` names the file, each bad field and its value."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(problems))


class SlurmConfig(BaseModel):
    """How the controller reaches Slurm (its own CLI; no pyslurm)."""

    model_config = _STRICT

    bin_dir: str | None = Field(
        None, description="Directory holding scontrol and squeue; unset: found on PATH."
    )
    command_timeout_s: float = Field(
        30.0, gt=0, le=600, description="Each Slurm command is killed after this many seconds."
    )
    dry_run: bool = Field(
        False,
        description="Read Slurm and decide, but never change it: the plan is only logged (also --dry-run).",
    )
    adapter: Literal["cli", "rest"] = Field(
        "cli",
        description="'cli': scontrol/squeue. 'rest': slurmrestd with JWT (rest_url, rest_user, "
        "rest_token_file); what the served API lacks (22.05: node update, requeue) runs through scontrol.",
    )
    rest_url: str | None = Field(None, description="slurmrestd base URL, e.g. http://slurmctld:6820.")
    rest_user: str = Field("root", min_length=1, description="X-SLURM-USER-NAME: the user the token is for.")
    rest_token_file: str | None = Field(
        None, description="File holding the JWT (scontrol token output); re-read when it changes."
    )

    @model_validator(mode="after")
    def _rest_needs_url_and_token(self) -> SlurmConfig:
        if self.adapter == "rest":
            if not self.rest_url or not re.match(r"^https?://[^/\s]+", self.rest_url):
                raise ValueError(
                    f"slurm.rest_url = {self.rest_url!r}: adapter = 'rest' needs slurmrestd's http(s):// URL"
                )
            if not self.rest_token_file:
                raise ValueError("slurm.rest_token_file = None: adapter = 'rest' needs the JWT's file")
        return self


class SenseConfig(BaseModel):
    """Where GPU telemetry comes from."""

    model_config = _STRICT

    mode: Literal["agent", "prometheus"] = Field(
        "agent",
        description="'agent': scrape each node's exporter (FleetYield agent or stock dcgm-exporter). "
        "'prometheus': query the Prometheus that scrapes them (see the prometheus table); same decisions.",
    )
    url_template: str = Field(
        "http://{node}:9400/metrics",
        description="Metrics URL of a node; '{node}' is replaced by the Slurm node name.",
    )
    timeout_s: float = Field(5.0, gt=0, le=120, description="Per-node scrape timeout; a timeout is UNKNOWN.")
    concurrency: int = Field(64, ge=1, le=4096, description="Scrapes in flight at once.")
    hostname_label: Literal["Hostname", "hostname"] = Field(
        "Hostname",
        description="Label carrying the host name: dcgm-exporter releases use 'Hostname', its main branch "
        "'hostname'. Both are read; this one is what check_hostname reports on.",
    )
    gpu_nodes_only: bool = Field(
        True,
        description="Scrape only nodes whose Slurm Gres lists GPUs; others are not FleetYield's business. "
        "Turn off for a cluster that does not declare gpu Gres.",
    )
    check_hostname: bool = Field(
        False,
        description="Reject a scrape whose host label names another host (catches DNS/port mix-ups). Leave "
        "off for exporters in containers, whose label is the container id.",
    )
    basic_auth: BasicAuthConfig | None = Field(
        None,
        description="Prometheus' scrape basic_auth (username, password_file) for agents served with "
        "basic_auth_users in their web-config file; also sent with control (reset) requests, which go to the "
        "same listener.",
    )
    tls_config: TlsClientConfig | None = Field(
        None,
        description="Prometheus' scrape tls_config (ca_file, cert_file, key_file, insecure_skip_verify = "
        "false) for agents served over TLS (an https url_template); also used by control requests.",
    )

    def client(self) -> HttpClientConfig | None:
        if self.basic_auth is None and self.tls_config is None:
            return None
        return HttpClientConfig(basic_auth=self.basic_auth, tls_config=self.tls_config)

    @model_validator(mode="after")
    def _template(self) -> SenseConfig:
        if "{node}" not in self.url_template:
            raise ValueError(f"url_template must contain '{{node}}', got {self.url_template!r}")
        if not self.url_template.startswith(("http://", "https://")):
            raise ValueError(f"url_template must be an http(s) URL, got {self.url_template!r}")
        if self.tls_config is not None and not self.url_template.startswith("https://"):
            raise ValueError(f"tls_config is set but url_template is not https://, got {self.url_template!r}")
        return self


class PrometheusConfig(BaseModel):
    """Sensing through Prometheus (``sense.mode = "prometheus"``; contrib/prometheus/README.md)."""

    model_config = _STRICT

    url: str = Field("http://127.0.0.1:9090", description="Prometheus base URL (the HTTP API's root).")
    node_label: str = Field(
        "Hostname",
        description="Label naming a series' Slurm node: 'Hostname' (agent, dcgm-exporter releases), "
        "'hostname' (dcgm-exporter main) or a target label set by relabeling, e.g. 'node'.",
    )
    selector: str = Field(
        "",
        description="Extra PromQL label matchers added to every query, e.g. 'job=\"fleetyield-agent\"' "
        "(select only the GPU exporters' targets).",
    )
    extra_fields: list[str] = Field(
        default_factory=list,
        description="DCGM fields to read besides those the decision core uses (they only show in explain).",
    )
    timeout_s: float = Field(10.0, gt=0, le=300, description="Per-query timeout; a failure is UNKNOWN.")
    nodes_per_query: int = Field(
        5000, ge=1, description="Node names per regex matcher: queries = families x ceil(nodes / this)."
    )
    concurrency: int = Field(8, ge=1, le=256, description="Queries in flight at once.")
    bearer_token_file: str | None = Field(
        None, description="File holding a bearer token for a Prometheus behind authentication."
    )

    @model_validator(mode="after")
    def _check(self) -> PrometheusConfig:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {self.url!r}")
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", self.node_label):
            raise ValueError(f"node_label must be a Prometheus label name, got {self.node_label!r}")
        return self


class AlertmanagerConfig(BaseModel):
    """Alertmanager's webhook on the push listener (``POST /v1/alertmanager``; contrib/alertmanager/)."""

    model_config = _STRICT

    token_file: str | None = Field(
        None,
        description="File holding the bearer token Alertmanager sends (its "
        "http_config.authorization.credentials_file). Set: the webhook is served on the push listener "
        "(which then runs even without push.secret_file). Keep it mode 0600.",
    )
    node_labels: list[str] = Field(
        default_factory=lambda: ["node", "Hostname", "hostname"],
        min_length=1,
        description="Alert labels naming the Slurm node, first present wins.",
    )
    max_body_bytes: int = Field(4 << 20, ge=1024, description="Larger webhook requests are refused with 413.")
    stale_after_s: float = Field(
        3600.0,
        gt=0,
        description="A firing alert whose endsAt is older than this is a replayed request: acknowledged, "
        "not stored.",
    )

    @property
    def active(self) -> bool:
        return self.token_file is not None


# The listeners' shared settings (push and api), one definition each.
WebConfigFile = Annotated[
    str | None,
    Field(
        description="Web-config file (YAML, the Prometheus exporter-toolkit format dcgm-exporter's "
        "--web-config-file takes): tls_server_config (cert_file, key_file, client_auth_type, client_ca_file) "
        "and basic_auth_users (bcrypt hashes) for this listener. Unset: plain HTTP, no basic auth.",
    ),
]
MaxConnections = Annotated[
    int,
    Field(
        ge=16,
        le=65_536,
        description="Connections held at once (node_agent/httpd.py); at the cap a new one evicts the "
        "longest-waiting connection without a complete request. Keep systemd's LimitNOFILE well above "
        "the sum over listeners.",
    ),
]


class PushConfig(BaseModel):
    """The authenticated listener agents POST fatal events to (``/v1/agent/events``)."""

    model_config = _STRICT

    enabled: bool | None = Field(
        None, description="Run the push listener. Unset: run it exactly when secret_file is set."
    )
    host: str = Field(
        "127.0.0.1",
        description="Listen address: the address of the interface agents reach (set it; 0.0.0.0 binds "
        "every interface). The default binds loopback only, so a fresh install exposes nothing.",
    )
    port: int = Field(9402, ge=0, le=65535, description="Listen port (0: any free port, for tests).")
    web_config_file: WebConfigFile = None
    max_connections: MaxConnections = 1024
    secret_file: str | None = Field(
        None,
        description="File holding the shared HMAC secret (same as the agents' --push-secret-file). "
        "Required when enabled; keep it mode 0600.",
    )
    max_body_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="Larger requests are refused with 413. An agent sends up to 200 events (~70 KB) per "
        "request; 1 MiB leaves room without letting one request pin much memory.",
    )
    max_skew_s: float = Field(
        300.0,
        gt=0,
        le=3600,
        description="Signed timestamps further than this from now: 401. At most an hour: the "
        "window bounds how long a captured request stays replayable.",
    )

    @model_validator(mode="after")
    def _secret(self) -> PushConfig:
        if self.enabled and not self.secret_file:
            raise ValueError("secret_file is required when the push listener is enabled (enabled=true)")
        return self

    @property
    def active(self) -> bool:
        return self.enabled if self.enabled is not None else self.secret_file is not None


class ApiConfig(BaseModel):
    """The read-only HTTP API (status, nodes, explain, Prolog gate, /metrics)."""

    model_config = _STRICT

    enabled: bool = Field(True, description="Run the read-only API listener.")
    host: str = Field("127.0.0.1", description="Listen address; it exposes no write operation.")
    port: int = Field(9401, ge=0, le=65535, description="Listen port (0: any free port, for tests).")
    web_config_file: WebConfigFile = None
    max_connections: MaxConnections = 1024


class StoreConfig(BaseModel):
    """Durable controller state: SQLite in WAL mode (embedded, one controller), or PostgreSQL (``url``: two
    controllers, one leading by lease)."""

    model_config = _STRICT

    path: str = Field("/var/lib/fleetyield/fleetyield.db", description="SQLite database file.")
    url: str | None = Field(
        None,
        description="PostgreSQL connection URL (postgresql://user@host/db); when set, replaces ``path``. "
        "Needs the controller extra (psycopg).",
    )
    lease_ttl_s: float = Field(
        6.0, gt=0.5, le=60, description="Leader lease lifetime with PostgreSQL: a standby takes over this "
        "long after the leader's last renewal (renewed every ``renew_s``)."
    )  # fmt: skip
    renew_s: float = Field(2.0, gt=0, le=30, description="Seconds between lease renewals (PostgreSQL).")
    controller_id: str | None = Field(
        None, description="This controller's name in the lease and in ``status`` (default: host name:pid)."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"must be a postgresql:// URL, got {value.split('@')[-1]!r}")
        return value

    @model_validator(mode="after")
    def _renew_within_ttl(self) -> StoreConfig:
        if self.renew_s * 2 > self.lease_ttl_s:
            raise ValueError(
                f"renew_s ({self.renew_s}) must be at most half of lease_ttl_s ({self.lease_ttl_s}): "
                "one missed renewal must not lose the lease"
            )
        return self

    @property
    def target(self) -> str:
        """What ``Store`` opens: the URL when set, else the SQLite file."""
        return self.url or self.path

    events_keep: int = Field(
        100_000, ge=100, description="Rows kept in the append-only event log (older rows are pruned)."
    )


class LoopConfig(BaseModel):
    """The control loop's cadence and error throttle."""

    model_config = _STRICT

    interval_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds between ticks (a pushed event wakes early)."
    )
    backoff_initial_s: float = Field(1.0, gt=0, le=3600, description="First wait after a failed tick.")
    backoff_max_s: float = Field(
        300.0, gt=0, le=86_400, description="Longest wait between failed ticks (at most a day)."
    )
    backoff_factor: float = Field(
        2.0, ge=1, le=10, description="Wait growth per consecutive failure; resets on success (1 .. 10)."
    )
    push_reuse_samples_s: float = Field(
        60.0,
        ge=0,
        description="A tick woken by a pushed event reuses the last scrape when it is younger than this "
        "(the event, not the scrape, carries the fault: this keeps fault-to-drain near one second). "
        "0: always re-scrape.",
    )
    seed: int | None = Field(None, description="Seed of the tick's random generator (unset: from the OS).")

    @model_validator(mode="after")
    def _backoff(self) -> LoopConfig:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"backoff_max_s={self.backoff_max_s!r} is below backoff_initial_s={self.backoff_initial_s!r}"
            )
        return self


class GateConfig(BaseModel):
    """The human gate: where proposals, nonces and the audit log live, and who may approve.

    When a proposal opens and how long it stays open are the core's (core.gate: propose_on_red,
    proposal_ttl_s, ...)."""

    model_config = _STRICT

    state_dir: str | None = Field(
        None,
        description="Directory of gate.db (proposals, used nonces, hash-chained audit log) and audit.head "
        "(the audit chain's head checkpoint; ship it off the host to detect rewrites). Mode 0700. Unset: "
        "'gate' beside the store's database (store.path).",
    )
    authorized_keys: str | None = Field(
        None,
        description="Admins' public keys, one 'fleetyield-ed25519 <base64> <name>' line each (fleetyield "
        "keygen writes NAME.pub). Re-read at every approval, so removing a line revokes at once. Unset: no "
        "approval is accepted (proposals are still recorded and expire).",
    )
    record_in_dry_run: bool = Field(
        True,
        description="In dry-run, still record proposals (and withdrawals) in the gate so admins can review "
        "and rehearse approvals; an approval then changes nothing in Slurm (the drain is only logged).",
    )


class CanaryConfig(BaseModel):
    """How rehabilitation canary jobs are submitted (sbatch -w NODE --constraint=fy_canary ...)."""

    model_config = _STRICT

    command: str = Field(
        "fleetyield-agent check --state-dir {state_dir} --json",
        description="What a canary job runs (sbatch --wrap); '{state_dir}' is replaced by state_dir. Exit 0 "
        "is a pass; anything else (or TIMEOUT/NODE_FAIL) a failure.",
    )
    state_dir: str = Field(
        "/var/lib/fleetyield-agent", description="The node agent's state directory on the compute nodes."
    )
    constraint: str = Field(
        "fy_canary", description="Feature the canary requires (set only on canary nodes)."
    )
    time_limit_s: float | None = Field(
        None,
        gt=0,
        description="Canary job time limit. Unset: the lifecycle's (core.lifecycle); rounded up to minutes.",
    )
    partition: str | None = Field(None, description="Partition for canary jobs (unset: Slurm's default).")
    lookback_s: float = Field(
        86_400.0,
        gt=0,
        description="Canary rounds submitted this long ago are still looked up in sacct/squeue (longer "
        "than core.lifecycle.canary_timeout_s).",
    )

    @property
    def rendered_command(self) -> str:
        return self.command.replace("{state_dir}", self.state_dir)


class ControlConfig(BaseModel):
    """The controller -> agent control channel (signed GPU reset requests)."""

    model_config = _STRICT

    url_template: str = Field(
        "http://{node}:9400", description="Agent base URL of a node; POST <url>/v1/control/reset."
    )
    secret_file: str | None = Field(
        None, description="HMAC secret shared with the agents. Unset: push.secret_file (the same secret)."
    )
    timeout_s: float = Field(
        120.0, gt=0, le=3600, description="A reset request that takes longer is a failed remediation."
    )

    @model_validator(mode="after")
    def _template(self) -> ControlConfig:
        if "{node}" not in self.url_template or not self.url_template.startswith(("http://", "https://")):
            raise ValueError(
                f"url_template must be an http(s) URL containing '{{node}}', got {self.url_template!r}"
            )
        return self


class OutcomesConfig(BaseModel):
    """Job outcomes forwarded by the agents (the Epilog's records) and how they are completed."""

    model_config = _STRICT

    sacct_state: bool = Field(
        True,
        description="Ask sacct (one call per tick with new outcomes) for each job's final state and node "
        "list; the Epilog cannot tell TIMEOUT from FAILED or see a requeue. Off, or when sacct does not know "
        "the job: the state is derived from the exit code.",
    )


class AttestConfig(BaseModel):
    """Tenant-isolation attestation: verify the agents' hand-overs, gate the Prolog, drain failed nodes.

    Enrolment and policy are admin steps (``fleetyield attest keygen / enroll / baseline``); see
    slurm_fleetyield/attest/__init__.py."""

    model_config = _STRICT

    enabled: bool = Field(
        False,
        description="Serve POST /v1/attest/nonce and /v1/attest/quote on the push listener (needs "
        "push.secret_file: nonce requests are signed with it), deny the API's Prolog gate to nodes without a "
        "fresh passing verdict, and drain nodes whose latest verdict failed.",
    )
    db: str = Field(
        "/var/lib/fleetyield/attest.db",
        description="SQLite database of enrolled node keys, issued nonces and the latest verdict per node "
        "(the same file `fleetyield attest --db` edits).",
    )
    policy: str | None = Field(
        None,
        description="Policy file (JSON or TOML): allowed record digests per node class "
        "(`fleetyield attest baseline`). Required when enabled; read at start-up.",
    )
    key: str | None = Field(
        None,
        description="The controller's verdict-signing private key (`fleetyield attest keygen`; mode 0600). "
        "Its .pub line goes to every node (agent [attest] controller_pubkey). Required when enabled.",
    )
    nonce_ttl_s: float = Field(
        60.0, gt=0, le=3600, description="A nonce must come back in a quote within this many seconds."
    )
    max_age_s: float = Field(
        3600.0,
        gt=0,
        description="The API gate denies a node whose latest verdict is older (keep it >= the hooks' "
        "attest_max_age_s and above the agents' 900 s re-attestation interval).",
    )

    @model_validator(mode="after")
    def _needs(self) -> AttestConfig:
        if self.enabled and not (self.policy and self.key):
            missing = [name for name in ("policy", "key") if not getattr(self, name)]
            raise ValueError(f"enabled=true needs {' and '.join(missing)}")
        return self


class XidsConfig(BaseModel):
    """Which XIDs drain, feed risk or are ignored: NVIDIA's Xid catalog, then these overrides."""

    model_config = _STRICT

    catalog: str | None = Field(
        None,
        description="A site's copy of NVIDIA's Xid catalog in the shipped format "
        "(node_agent/data/xid_catalog.csv: xid, mnemonic, description, immediate_action, "
        "investigatory_action); unset: the shipped one. `fleetyield xids` shows the result.",
    )
    # TOML table keys are strings and values names: these two are parsed (lax), everything else is strict
    overrides: dict[Annotated[int, Strict(False)], Annotated[Handling, Strict(False)]] = Field(
        default_factory=dict,
        description="Per-XID handling over the catalog's (and over core.quarantine's explicit lists), "
        'e.g. {79 = "drain", 13 = "ignore", 145 = "risk"}. drain: quarantine the node; risk: '
        "counted by the xid_nonfatal risk signal; ignore: neither. Without core.quarantine.quarantine_xids "
        "/ risk_only_xids in the file, those lists are the catalog's, with these overrides applied.",
    )

    @field_validator("catalog")
    @classmethod
    def _readable(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                catalog_at(v)
            except CatalogError as exc:
                raise ValueError(str(exc)) from None
        return v

    @field_validator("overrides")
    @classmethod
    def _positive(cls, v: dict[int, Handling]) -> dict[int, Handling]:
        bad = sorted(x for x in v if x <= 0)
        if bad:
            raise ValueError(f"XID numbers are positive, got {bad!r}")
        return v


def _with_xid_lists(data: Any) -> Any:
    """The raw config with ``core.quarantine``'s two XID lists resolved from the catalog and ``[xids]``
    (``slurm_fleetyield/xids.py``); a list the file gives stays the base of its class. A config the xids
    section of which does not validate is returned as is: validation then reports it, field by field."""
    if not isinstance(data, dict):
        return data
    core = data.get("core", {})
    if not isinstance(core, dict):
        return data  # a Params instance (tests, code): taken as given
    quarantine = core.get("quarantine", {})
    if not isinstance(quarantine, dict):
        return data
    try:
        xids = XidsConfig.model_validate(data.get("xids", {}))
    except ValidationError:
        return data
    given_q, given_r = quarantine.get("quarantine_xids"), quarantine.get("risk_only_xids")
    if not all(isinstance(g, list | tuple | type(None)) for g in (given_q, given_r)):
        return data  # not a list: Params reports it
    try:
        resolved = resolve(catalog_at(xids.catalog), xids.overrides, given_q, given_r)
    except (TypeError, ValueError):
        return data  # e.g. a non-integer XID in a list: Params reports it with its field
    quarantine = {
        **quarantine,
        "quarantine_xids": list(resolved.quarantine_xids),
        "risk_only_xids": list(resolved.risk_only_xids),
    }
    return {**data, "core": {**core, "quarantine": quarantine}}


class Config(BaseModel):
    """Everything the controller reads at start-up."""

    model_config = _STRICT

    core: Params = Field(default_factory=Params, description="Decision-core parameters (core/params.py).")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="Slurm CLI access.")
    sense: SenseConfig = Field(default_factory=SenseConfig, description="GPU telemetry source.")
    push: PushConfig = Field(default_factory=PushConfig, description="Push listener for agents' events.")
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig, description="Prometheus, when sense.mode is 'prometheus'."
    )
    alertmanager: AlertmanagerConfig = Field(
        default_factory=AlertmanagerConfig, description="Alertmanager webhook receiver."
    )
    api: ApiConfig = Field(default_factory=ApiConfig, description="Read-only API.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="SQLite store.")
    loop: LoopConfig = Field(default_factory=LoopConfig, description="Loop cadence and backoff.")
    gate: GateConfig = Field(default_factory=GateConfig, description="Human gate for pre-emptive drains.")
    canary: CanaryConfig = Field(default_factory=CanaryConfig, description="Rehabilitation canary jobs.")
    control: ControlConfig = Field(default_factory=ControlConfig, description="Agent control channel.")
    outcomes: OutcomesConfig = Field(default_factory=OutcomesConfig, description="Job outcome intake.")
    redfish: RedfishConfig = Field(
        default_factory=RedfishConfig, description="BMC power actions over Redfish (power cycle rung)."
    )
    attest: AttestConfig = Field(default_factory=AttestConfig, description="Tenant-isolation attestation.")
    xids: XidsConfig = Field(default_factory=XidsConfig, description="XID handling: catalog and overrides.")

    @model_validator(mode="before")
    @classmethod
    def _xid_lists(cls, data: Any) -> Any:
        return _with_xid_lists(data)

    @property
    def gate_url(self) -> str | None:
        """The gate's database when it is not ``<gate_dir>/gate.db``: PostgreSQL's ``store.url`` (the gate
        follows the store, so a standby can finish a proposal the leader raised)."""
        return self.store.url

    @property
    def gate_dir(self) -> str:
        """``gate.state_dir``, or ``<directory of store.path>/gate``."""
        if self.gate.state_dir:
            return self.gate.state_dir
        return str(Path(self.store.path).parent / "gate")

    @model_validator(mode="after")
    def _power_cycle_needs_redfish(self) -> Config:
        # Without a BMC every PowerCycle fails and burns remediation attempts until NEEDS_HUMAN.
        if self.core.lifecycle.power_cycle_enabled and not self.redfish.enabled:
            raise ValueError(
                "core.lifecycle.power_cycle_enabled is true but redfish.enabled is false: "
                "enable [redfish] (BMC map and credentials) or turn power cycling off"
            )
        return self

    @model_validator(mode="after")
    def _attest_needs_push(self) -> Config:
        if self.attest.enabled and not self.push.active:
            raise ValueError(
                "attest.enabled is true but the push listener is off: set push.secret_file (agents sign "
                "their nonce requests with it and post their quotes to that listener)"
            )
        return self

    @model_validator(mode="after")
    def _listeners(self) -> Config:
        wildcard = {"", "0.0.0.0", "::"}
        same_host = self.push.host == self.api.host or {self.push.host, self.api.host} & wildcard
        listening = self.push.active or self.alertmanager.active
        if listening and self.api.enabled and self.push.port == self.api.port != 0 and same_host:
            raise ValueError(
                f"push.port and api.port are both {self.api.port} on overlapping addresses "
                f"({self.push.host!r}, {self.api.host!r}): the listeners must differ"
            )
        return self


def _problems(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input")
        shown = "" if isinstance(value, dict) else f" (got {value!r})"
        out.append(f"{where}: {err['msg']}{shown}")
    return out


def from_mapping(data: dict[str, Any], source: str = "<config>") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, _problems(exc)) from None


def load(path: str | Path) -> Config:
    """Read and validate a config file; every failure is a ``ConfigError``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            str(path),
            [f"not UTF-8 text (TOML must be): byte {exc.object[exc.start]:#04x} at offset {exc.start}"],
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from None
    return from_mapping(data, str(path))


def read_secret(
    path: str | Path, field: str = "push.secret_file", min_bytes: int = MIN_SECRET_BYTES
) -> bytes:
    """A secret: file contents without surrounding whitespace. Shorter than ``min_bytes`` (an HMAC secret:
    16, the agent's own minimum) or readable by group/others (the agent refuses such a file too) is an
    error."""
    try:
        mode = Path(path).stat().st_mode
        if mode & 0o077:
            raise ConfigError(
                str(path), [f"{field}: mode {mode & 0o777:o} is group/world accessible (chmod 600)"]
            )
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(str(path), [f"{field}: cannot read: {exc.strerror or exc}"]) from None
    if not secret:
        raise ConfigError(str(path), [f"{field}: the secret is empty"])
    if len(secret) < min_bytes:
        raise ConfigError(
            str(path),
            [
                f"{field}: the secret is {len(secret)} bytes, shorter than {min_bytes} bytes "
                "(the agents refuse it)"
            ],
        )
    return secret


# --------------------------------------------------------------------------------------------------------
# The documented example (``fleetyield example-config > contrib/fleetyield.example.toml``)
# --------------------------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, BaseModel):
        return _toml_value(value.model_dump())
    raise TypeError(f"no TOML for {value!r}")


def _comment(text: str, width: int = 100) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(text, width - 2)]


_FROM_CATALOG = frozenset({"core.quarantine.quarantine_xids", "core.quarantine.risk_only_xids"})
"""Shown commented out: a copy of the example that set them would stop following the catalog."""


def _example_section(model: type[BaseModel], instance: BaseModel, path: str, out: list[str]) -> None:
    """One [path] table (its scalar fields), then its sub-models as their own tables."""
    scalars, groups = [], []
    for name, info in type(instance).model_fields.items():
        value = getattr(instance, name)
        (groups if isinstance(value, BaseModel) else scalars).append((name, info, value))
    if scalars:
        out.append("")
        out.append(f"[{path}]")
        for line in _comment((model.__doc__ or "").strip().splitlines()[0]):
            out.append(line)
        for name, info, value in scalars:
            out.extend(_comment(info.description or ""))
            dumped = value if not isinstance(value, BaseModel) else None
            if dumped is None:
                out.append(f"# {name} =   (unset)")
            elif f"{path}.{name}" in _FROM_CATALOG:
                out.append(f"# {name} = {_toml_value(dumped)}   (unset: from the Xid catalog, see [xids])")
            else:
                out.append(f"{name} = {_toml_value(dumped)}")
    for name, _info, value in groups:
        _example_section(type(value), value, f"{path}.{name}" if path else name, out)


def example_toml() -> str:
    """Every option with its description and default, as a loadable TOML file."""
    out = [
        "# FleetYield controller configuration: every option, with its default and what it does.",
        "# Generated by `fleetyield example-config`; load-checked by `fleetyield validate-config FILE`.",
        "# Unset options are commented out; everything else shows its default value.",
    ]
    defaults = Config()
    # site settings first, the decision core's tuning last
    for name in sorted(type(defaults).model_fields, key=lambda n: n == "core"):
        value = getattr(defaults, name)
        _example_section(type(value), value, name, out)
    return "\n".join(out) + "\n"
