"""The controller's configuration: one TOML file, validated, grouped per concern, every field documented.

Input: a TOML file (``contrib/fleetyield.example.toml`` documents every key). Output: a frozen ``Config``.
Loading is two passes, like node-problem-detector's: pydantic applies defaults and checks each field, then
cross-field rules run on the complete model. Any error is a ``ConfigError`` naming the file, the field
(dotted path) and the bad value; nothing is clamped or guessed.
"""

from __future__ import annotations

import json
import textwrap
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from slurm_fleetyield.core.params import Params

_STRICT = ConfigDict(extra="forbid", frozen=True)


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


class SenseConfig(BaseModel):
    """Where GPU telemetry comes from."""

    model_config = _STRICT

    mode: Literal["agent"] = Field(
        "agent",
        description="'agent': scrape each node's exporter (FleetYield agent or stock dcgm-exporter).",
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

    @model_validator(mode="after")
    def _template(self) -> SenseConfig:
        if "{node}" not in self.url_template:
            raise ValueError(f"url_template must contain '{{node}}', got {self.url_template!r}")
        if not self.url_template.startswith(("http://", "https://")):
            raise ValueError(f"url_template must be an http(s) URL, got {self.url_template!r}")
        return self


class PushConfig(BaseModel):
    """The authenticated listener agents POST fatal events to (``/v1/agent/events``)."""

    model_config = _STRICT

    enabled: bool | None = Field(
        None, description="Run the push listener. Unset: run it exactly when secret_file is set."
    )
    host: str = Field("0.0.0.0", description="Listen address (agents must reach it).")
    port: int = Field(9402, ge=0, le=65535, description="Listen port (0: any free port, for tests).")
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
    max_skew_s: float = Field(300.0, gt=0, description="Signed timestamps further than this from now: 401.")

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


class StoreConfig(BaseModel):
    """Durable controller state: SQLite in WAL mode."""

    model_config = _STRICT

    path: str = Field("/var/lib/fleetyield/fleetyield.db", description="SQLite database file.")
    events_keep: int = Field(
        100_000, ge=100, description="Rows kept in the append-only event log (older rows are pruned)."
    )


class LoopConfig(BaseModel):
    """The control loop's cadence and error throttle."""

    model_config = _STRICT

    interval_s: float = Field(
        30.0, gt=0, le=3600, description="Seconds between ticks (a pushed event wakes early)."
    )
    backoff_initial_s: float = Field(1.0, gt=0, description="First wait after a failed tick.")
    backoff_max_s: float = Field(300.0, gt=0, description="Longest wait between failed ticks.")
    backoff_factor: float = Field(
        2.0, ge=1, description="Wait growth per consecutive failure; resets on success."
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


class Config(BaseModel):
    """Everything the controller reads at start-up."""

    model_config = _STRICT

    core: Params = Field(default_factory=Params, description="Decision-core parameters (core/params.py).")
    slurm: SlurmConfig = Field(default_factory=SlurmConfig, description="Slurm CLI access.")
    sense: SenseConfig = Field(default_factory=SenseConfig, description="GPU telemetry source.")
    push: PushConfig = Field(default_factory=PushConfig, description="Push listener for agents' events.")
    api: ApiConfig = Field(default_factory=ApiConfig, description="Read-only API.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="SQLite store.")
    loop: LoopConfig = Field(default_factory=LoopConfig, description="Loop cadence and backoff.")

    @model_validator(mode="after")
    def _listeners(self) -> Config:
        wildcard = {"", "0.0.0.0", "::"}
        same_host = self.push.host == self.api.host or {self.push.host, self.api.host} & wildcard
        if self.push.active and self.api.enabled and self.push.port == self.api.port != 0 and same_host:
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
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), [f"not valid TOML: {exc}"]) from None
    return from_mapping(data, str(path))


def read_secret(path: str | Path) -> bytes:
    """The push secret: file contents without surrounding whitespace. Empty, or readable by group/others
    (the agent refuses such a file too), is an error."""
    try:
        mode = Path(path).stat().st_mode
        if mode & 0o077:
            raise ConfigError(
                str(path), [f"push.secret_file: mode {mode & 0o777:o} is group/world accessible (chmod 600)"]
            )
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(str(path), [f"push.secret_file: cannot read: {exc.strerror or exc}"]) from None
    if not secret:
        raise ConfigError(str(path), ["push.secret_file: the secret is empty"])
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
    raise TypeError(f"no TOML for {value!r}")


def _comment(text: str, width: int = 100) -> list[str]:
    return [f"# {line}" for line in textwrap.wrap(text, width - 2)]


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
