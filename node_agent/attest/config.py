"""Attestation settings of the agent: the ``[attest]`` table of the agent's TOML config (all optional).

Input: the agent config file (the same ``--config`` as ``serve``; ``AgentConfig`` reads only its
``[agent]`` table, so an ``[attest]`` table beside it does not disturb it) or a dict. Output: a validated
``AttestConfig``; a bad value raises ``ValueError`` naming the field and the value.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError

from node_agent.attest import places
from node_agent.attest.measure import DEFAULT_PERSISTENCE

VERDICT_FILE = "attest-verdict.json"


_PathLike = Annotated[Path, Strict(False)]  # TOML strings; every other field is strict


class AttestConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    root: _PathLike = Field(
        default=Path("/"), description="Prefix of every measured path (tests: a fixture)."
    )
    persistence: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PERSISTENCE),
        description="Persistence points measured, in order (absolute paths under root).",
    )
    python_env: list[str] = Field(
        default_factory=lambda: list(places.python_env()),
        description="The interpreter and library trees the agent and hooks run from (absolute, under root).",
    )
    homes: list[str] | None = Field(
        default=None,
        description="Home directories measured (start-up files, .ssh, user units); unset: every home of "
        "the node's local /etc/passwd plus /root.",
    )
    areas: list[str] = Field(
        default_factory=lambda: ["/tmp/fy-job-{job_id}"],
        description="The hooks' attest_areas templates: any area still present at a quote is a leftover.",
    )
    tenant_uid_min: int = Field(
        default=places.TENANT_UID_MIN, ge=1, description="uids from here up are tenants (login.defs UID_MIN)."
    )
    agent_config_file: _PathLike | None = Field(default=None, description="The agent config file measured.")
    controller_url: str | None = Field(
        default=None,
        description="Controller listener for the hand-over (nonce + quote), e.g. http://ctl:8701.",
    )
    controller_pubkey: _PathLike | None = Field(
        default=None, description="The controller's public key line; verdicts are verified with it."
    )
    verdict_file: _PathLike | None = Field(
        default=None, description=f"Where the verified verdict goes (default STATE_DIR/{VERDICT_FILE})."
    )
    tpm_tcti: str | None = Field(
        default=None, description="TPM 2.0 TCTI (device:/dev/tpmrm0); unset: software quote only."
    )
    tpm_pcr: int = Field(default=16, description="Resettable PCR the chain is extended into (16 or 23).")
    scrub_command: list[str] | None = Field(
        default=None,
        description="nvml backend: a command run once per GPU to scrub its memory (CUDA memset job), "
        "{gpu} replaced by the index; unset: rely on the driver's clear-on-alloc (reported as such).",
    )
    timeout_s: float = Field(default=1.5, gt=0, le=30, description="Hand-over HTTP timeout per request.")


def load_attest_config(config_file: Path | None) -> AttestConfig:
    data: dict = {}
    if config_file is not None:
        try:
            data = dict(tomllib.loads(Path(config_file).read_text(encoding="utf-8")).get("attest", {}))
        except UnicodeDecodeError as exc:
            raise ValueError(f"cannot load {config_file}: not UTF-8 text at offset {exc.start}") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"cannot load {config_file}: {exc}") from None
        data = {k.replace("-", "_"): v for k, v in data.items()}
        data.setdefault("agent_config_file", str(config_file))
    try:
        return AttestConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"attest.{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})"
            for e in exc.errors()
        )
        raise ValueError(f"{config_file or 'attest config'}: {problems}") from None
