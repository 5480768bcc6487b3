"""Reference values: which record digests are allowed, per node class, with per-node overrides.

Input: a JSON or TOML policy file::

    {"version": 1,
     "classes": {"h100": {"records": {"kernel/osrelease": ["<sha256 hex>", ...], "meta/time": ["*"]}}},
     "nodes": {"gpu-h100-7": {"records": {"gpu/identity": ["<sha256 hex>"]}}}}

Every record name of a quote must be listed for the node's class (enrolled with the node); an entry is a
list of allowed digests (several: e.g. two kernel versions during a rolling upgrade) or ``["*"]`` for a
volatile record (time, GPU identity). A node entry replaces the class entry of the same name. Output:
``evaluate(records, node, node_class)`` -> the ``Difference`` list (empty: the node matches). A record the
policy does not list is a difference too (new measurement, unexpected), as is a listed one the quote lacks.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from node_agent.attest.chain import Record

WILDCARD = "*"
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
MAX_VALUE_IN_DIFF = 2000


class PolicyError(ValueError):
    pass


class RecordRules(BaseModel):
    model_config = ConfigDict(extra="forbid")

    records: dict[str, list[str]] = Field(default_factory=dict, description="record name -> allowed digests")

    @field_validator("records")
    @classmethod
    def _digests(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for name, allowed in value.items():
            if not allowed:
                raise ValueError(
                    f"record {name!r}: an empty allowed list can never pass; use ['*'] or digests"
                )
            for d in allowed:
                if d != WILDCARD and not _DIGEST.fullmatch(d):
                    raise ValueError(
                        f"record {name!r}: {d!r} is neither '*' nor a lowercase sha256 hex digest"
                    )
        return value


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    classes: dict[str, RecordRules] = Field(default_factory=dict)
    nodes: dict[str, RecordRules] = Field(default_factory=dict)

    def rules_for(self, node: str, node_class: str) -> dict[str, list[str]] | None:
        base = self.classes.get(node_class)
        if base is None:
            return None
        merged = dict(base.records)
        if node in self.nodes:
            merged.update(self.nodes[node].records)
        return merged


class Difference(BaseModel):
    name: str
    kind: str
    problem: str  # not_allowed | unexpected_record | missing_record
    expected: list[str]
    actual: str | None
    actual_value: str | None = None


def load_policy(path: str | Path) -> Policy:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"{p}: cannot read the policy: {exc}") from None
    try:
        data: Any = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise PolicyError(f"{p}: does not parse: {exc}") from None
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise PolicyError(f"{p}: {'.'.join(map(str, e['loc']))}: {e['msg']}") from None


def evaluate(records: Sequence[Record], node: str, node_class: str, policy: Policy) -> list[Difference]:
    rules = policy.rules_for(node, node_class)
    if rules is None:
        return [
            Difference(
                name="policy", kind="policy", problem="unknown_class", expected=[node_class], actual=None
            )
        ]
    out: list[Difference] = []
    seen = set()
    for r in records:
        seen.add(r.name)
        allowed = rules.get(r.name)
        value = r.value[:MAX_VALUE_IN_DIFF] if r.value is not None else None
        if allowed is None:
            out.append(Difference(name=r.name, kind=r.kind, problem="unexpected_record", expected=[],
                                  actual=r.digest, actual_value=value))  # fmt: skip
        elif WILDCARD not in allowed and r.digest not in allowed:
            out.append(Difference(name=r.name, kind=r.kind, problem="not_allowed", expected=list(allowed),
                                  actual=r.digest, actual_value=value))  # fmt: skip
    for name in sorted(set(rules) - seen):
        out.append(
            Difference(name=name, kind="?", problem="missing_record", expected=rules[name], actual=None)
        )
    return out
