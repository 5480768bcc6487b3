"""Learn a policy from a golden node's quote (``fleetyield attest baseline``).

Input: a quote (the records are read; its signature is not checked here -- take the quote from a node you
trust, ideally right after provisioning) and a class name, optionally an existing policy to merge into.
Output: a ``Policy`` whose class allows exactly the quote's digests, plus ``*`` for the volatile kinds
(``volatile``: the time; ``identity``: per-node GPU UUIDs). Merging adds a digest to the allowed list of
each record (so two golden nodes, or two kernel versions, make two allowed values) and never removes one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from node_agent.attest.chain import Record
from slurm_fleetyield.attest.policy import WILDCARD, Policy, RecordRules

VOLATILE_KINDS = ("volatile", "identity")


def learn(
    quote: Mapping[str, Any],
    node_class: str,
    existing: Policy | None = None,
    volatile_kinds: Sequence[str] = VOLATILE_KINDS,
) -> Policy:
    records = [Record.from_dict(r) for r in quote.get("records", [])]
    if not records:
        raise ValueError("the quote holds no records")
    policy = existing.model_copy(deep=True) if existing is not None else Policy()
    rules = policy.classes.setdefault(node_class, RecordRules())
    for r in records:
        allowed = rules.records.setdefault(r.name, [])
        if r.kind in volatile_kinds:
            rules.records[r.name] = [WILDCARD]
        elif WILDCARD not in allowed and r.digest not in allowed:
            allowed.append(r.digest)
    return Policy.model_validate(policy.model_dump())
