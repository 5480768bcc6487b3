"""Measurement records and the PCR-like hash chain over them (stdlib only; shared with the controller).

Input: ordered ``Record``s. Output: the chain value ``pcr`` where, from 32 zero bytes,
``pcr = sha256(pcr || sha256(record_bytes(record)))`` for every record in index order -- exactly what a
TPM 2.0 ``PCR_Extend`` of ``sha256(record_bytes(record))`` into a reset PCR computes, so the software chain
and a real TPM's PCR 16 hold the same value. ``record_bytes`` is the canonical JSON of
``{index, kind, name, digest}``: the optional human ``value`` is *not* in the chain, it is bound through
``digest == sha256(value)`` instead (``check_value``), so a verifier can show it in a diff.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ZERO_PCR = b"\x00" * 32
ABSENT = "absent"


def canonical(doc: Any) -> bytes:
    """The one byte encoding signed and hashed everywhere: sorted keys, no spaces, UTF-8."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


@dataclass(frozen=True)
class Record:
    index: int
    kind: str
    name: str
    digest: str
    value: str | None = None

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "index": self.index,
            "kind": self.kind,
            "name": self.name,
            "digest": self.digest,
        }
        if self.value is not None:
            doc["value"] = self.value
        return doc

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Record:
        try:
            index, kind, name, digest = doc["index"], doc["kind"], doc["name"], doc["digest"]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"record lacks {exc}") from None
        value = doc.get("value")
        if not (isinstance(index, int) and all(isinstance(x, str) for x in (kind, name, digest))):
            raise ValueError(f"record {doc!r}: index must be an int, kind/name/digest strings")
        if value is not None and not isinstance(value, str):
            raise ValueError(f"record {name!r}: value must be a string")
        return cls(index, kind, name, digest, value)


def record_bytes(record: Record) -> bytes:
    return canonical(
        {"index": record.index, "kind": record.kind, "name": record.name, "digest": record.digest}
    )


def record_hash(record: Record) -> bytes:
    """What is extended into the PCR for ``record`` (32 bytes)."""
    return hashlib.sha256(record_bytes(record)).digest()


def extend(pcr: bytes, record: Record) -> bytes:
    return hashlib.sha256(pcr + record_hash(record)).digest()


def replay(records: Iterable[Record]) -> str:
    """The chain value over ``records`` in the order given, as lowercase hex."""
    pcr = ZERO_PCR
    for record in records:
        pcr = extend(pcr, record)
    return pcr.hex()


def check_order(records: list[Record]) -> str | None:
    """None when indices are 0..n-1 in order, else why not (a reordered or dropped record)."""
    for i, record in enumerate(records):
        if record.index != i:
            return f"record {record.name!r} has index {record.index}, expected {i}"
    return None


def check_value(record: Record) -> bool:
    """A record carrying a ``value`` must have ``digest == sha256(value)``."""
    return record.value is None or sha256_hex(record.value) == record.digest
