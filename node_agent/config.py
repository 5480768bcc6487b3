"""Agent configuration: one pydantic model fed by CLI flags and an optional TOML ``--config`` file.

Input: a dict of settings (flags override file values). Output: a validated ``AgentConfig``
or a ``ValueError`` with a clear message. The push secret is read from a file, never taken
from the command line.
"""

from __future__ import annotations

import os
import socket
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from node_agent.gpu_models import MODELS
from node_agent.httpclient import BasicAuthConfig, HttpClientConfig, TlsClientConfig

MIN_SECRET_BYTES = 16
"""Shortest push secret accepted (the controller's slurm_fleetyield/config.py applies the same rule)."""

_PathLike = Annotated[Path, Strict(False)]
"""Paths come as TOML strings; every other field is strict."""


class AgentConfig(BaseModel):
    # strict: "9400" is no port, "yes" no bool, 2.0 no GPU count; finite: inf/nan are refused
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    backend: Literal["fake", "nvml"] = "fake"
    listen: str = "0.0.0.0"
    port: int = Field(default=9400, ge=0, le=65535)
    state_dir: _PathLike
    gpus: int = Field(default=8, ge=1, le=64)
    model: str = "h100"
    seed: int = 0
    hostname: str | None = None
    lowercase_hostname: bool = False
    hpc_job_mapping_dir: _PathLike | None = None
    xid_count_window_ms: int = Field(default=300000, ge=1)
    nvml_slow_interval_s: float = Field(default=10.0, ge=0, le=300)
    # One controller URL, or several (two controllers in high availability: every fatal event goes to each,
    # each destination with its own spool, so a dead controller holds back none of the others). TOML: a
    # string or a list; the CLI: --push-url repeated.
    push_url: list[str] | None = None
    push_secret_file: _PathLike | None = None
    scenario: _PathLike | None = None
    outcomes_dir: _PathLike | None = Path("/var/spool/fleetyield/outcomes")
    # Where outcomes go: by default the outcome endpoint beside each push URL. One controller answering
    # 2xx is enough (in high availability both write the one PostgreSQL store), so they are tried in turn
    # and the one that last answered goes first. TOML: a string or a list; the CLI: --outcomes-url repeated.
    outcomes_url: list[str] | None = None
    outcomes_interval_s: float = Field(default=5.0, gt=0, le=3600)
    web_config_file: _PathLike | None = None  # exporter-toolkit web config: TLS, basic auth (webconfig.py)
    max_connections: int = Field(default=256, ge=16, le=65536)
    # How the push and outcome senders authenticate to a controller listener served with a web-config
    # file: Prometheus' basic_auth and tls_config (node_agent/httpclient.py), TOML tables
    push_basic_auth: BasicAuthConfig | None = None
    push_tls_config: TlsClientConfig | None = None

    @field_validator("push_url", "outcomes_url", mode="before")
    @classmethod
    def _url_lists(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [value]
        if isinstance(value, tuple):
            return list(value)
        return value

    @model_validator(mode="after")
    def _check(self) -> AgentConfig:
        if self.model not in MODELS:
            raise ValueError(f"unknown GPU model {self.model!r}; choose one of {', '.join(sorted(MODELS))}")
        if self.push_url and not self.push_secret_file:
            raise ValueError("--push-url needs --push-secret-file")
        for push in self.push_url or []:
            if not push.startswith(("http://", "https://")):
                raise ValueError(f"--push-url must be an http(s) URL, got {push!r}")
        if self.push_url is not None and len(set(self.push_url)) != len(self.push_url):
            raise ValueError(f"--push-url names a URL twice: {self.push_url!r}")
        for url in self.outcomes_url or []:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"--outcomes-url must be an http(s) URL, got {url!r}")
        if self.outcomes_url is not None and len(set(self.outcomes_url)) != len(self.outcomes_url):
            raise ValueError(f"--outcomes-url names a URL twice: {self.outcomes_url!r}")
        for url in (*(self.push_url or []), *(self.outcomes_url or [])):
            if self.push_tls_config is not None and url and not url.startswith("https://"):
                raise ValueError(f"push_tls_config is set but {url!r} is not an https:// URL")
        if self.outcomes_url and not self.push_secret_file:
            raise ValueError("--outcomes-url needs --push-secret-file")
        return self

    def outcome_urls(self) -> list[str]:
        """``outcomes_url``, else the outcome endpoint beside each push URL."""
        from node_agent.outcomes import outcomes_url_from_push

        if self.outcomes_url:
            return list(self.outcomes_url)
        return [outcomes_url_from_push(u) for u in self.push_url or []]

    def push_client(self) -> HttpClientConfig | None:
        if self.push_basic_auth is None and self.push_tls_config is None:
            return None
        return HttpClientConfig(basic_auth=self.push_basic_auth, tls_config=self.push_tls_config)

    def node_name(self) -> str:
        return self.hostname or socket.gethostname()

    def read_secret(self) -> bytes | None:
        if self.push_secret_file is None:
            return None
        try:
            st = os.stat(self.push_secret_file)
            secret = self.push_secret_file.read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --push-secret-file: {exc}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(
                f"--push-secret-file {self.push_secret_file} must not be group/world accessible (chmod 600)"
            )
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"--push-secret-file {self.push_secret_file} holds a secret shorter than "
                f"{MIN_SECRET_BYTES} bytes"
            )
        return secret


def build_config(config_file: Path | None, flags: dict[str, Any]) -> AgentConfig:
    data: dict[str, Any] = {}
    if config_file is not None:
        try:
            data = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"cannot load --config {config_file}: not UTF-8 text (TOML must be): byte "
                f"{exc.object[exc.start]:#04x} at offset {exc.start}"
            ) from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot load --config {config_file}: {exc}") from None
        # settings: the [agent] table, else the top level ([attest] is node_agent/attest/config.py's)
        table = data.get("agent", {k: v for k, v in data.items() if k != "attest"})
        data = {k.replace("-", "_"): v for k, v in table.items()}
    data.update({k: v for k, v in flags.items() if v is not None})
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        source = f"{config_file} (and flags)" if config_file is not None else "flags"
        raise ValueError(f"bad configuration in {source}: {_problems(exc)}") from None


def _problems(exc: ValidationError) -> str:
    out = []
    for e in exc.errors():
        shown = "" if isinstance(e.get("input"), dict) else f" (got {e.get('input')!r})"
        out.append(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}{shown}")
    return "; ".join(out)
