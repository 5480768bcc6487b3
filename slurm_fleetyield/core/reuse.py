"""Reuse between ticks: the helpers the carries (core/carry.py, carry_place.py, carry_sense.py) use to
start a stage from last tick's answer.

``ControllerState.memo`` (not persisted, not compared) holds each carry's last inputs and answer, keyed by
the very input objects. These helpers find what changed: the sorted node names while the key sets stay the
same (``sorted_names``), the keys whose value is another object (``changed_keys``, with the changes a carry
noted for the next one, ``note_changes``), and one shared copy of the Slurm view per tick (``slurm_view``).
No decision stage imports them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def sorted_names(memo: dict[str, Any] | None, *maps: Mapping[str, object]) -> list[str]:
    """Every key of ``maps``, sorted: a stage's node order. ``memo`` (an entry of ``ControllerState.memo``)
    keeps the answer while every map has the same keys in the same order, the common case from tick to tick;
    the list handed back is shared: read it, never change it."""
    if memo is None:
        return sorted(set().union(*maps))
    key = tuple(tuple(m) for m in maps)
    if memo.get("keys") != key:
        memo["keys"], memo["names"] = key, sorted(set().union(*maps))
    names: list[str] = memo["names"]
    return names


_ABSENT = object()


def changed_keys(
    new: Mapping[str, object], old: Mapping[str, object], memo: dict[str, Any] | None = None
) -> set[str]:
    """The keys whose value in ``new`` is not the very object it is in ``old``, and the keys only one of them
    has: what a stage that starts from its last answer must look at again (the values are frozen, so the
    same object is the same value). One C-level pass over ``new``; ``old`` is read again only when it has a
    key ``new`` lacks. ``memo`` (``ControllerState.memo``): where a stage that built ``new`` from ``old``
    noted the answer (``note_changes``), it is handed back without a pass."""
    if new is old:
        return set()
    if memo is not None:
        for n, o, keys in memo.get("changes", {}).values():
            if n is new and o is old:
                return set(keys)
    get = old.get
    out = {k for k, v in new.items() if get(k, _ABSENT) is not v}
    if len(old) != len(new) - sum(1 for k in out if k not in old):  # old has keys new lacks
        out.update(k for k in old if k not in new)
    return out


def note_changes(
    memo: dict[str, Any],
    stage: str,
    new: Mapping[str, object],
    old: Mapping[str, object] | None,
    todo: Iterable[str] = (),
) -> None:
    """Note, for ``changed_keys``, the keys in which ``stage``'s answer ``new`` differs from ``old``, when
    ``new`` was built as a copy of ``old`` with only the keys ``todo`` set again (the same keys: the stage
    carried its last answer); ``old`` None: the stage did not carry (its note is dropped). Only
    ``todo`` is compared, so a consumer's diff of the two costs the stage's work, not the fleet's. The note
    holds both mappings, so an identity match can never be a recycled ``id``."""
    notes = memo.setdefault("changes", {})
    if old is None or len(new) != len(old):
        notes.pop(stage, None)
        return
    get = old.get
    notes[stage] = (new, old, frozenset(k for k in todo if new.get(k, _ABSENT) is not get(k, _ABSENT)))


def slurm_view(memo: dict[str, Any] | None, obs: Any) -> dict[str, Any]:
    """This tick's copy of Slurm's node view (the shell's mapping may be updated in place from tick to tick:
    the simulator's is), made once per ``Observations`` and shared by the stages that carry their last
    answer (profile, price, route); its changes against last tick's copy are noted once (``note_changes``).
    ``memo`` None: a fresh copy."""
    if memo is None:
        return dict(obs.slurm)
    hit = memo.get("slurm_view")
    if hit is not None and hit[0] is obs:
        snapshot: dict[str, Any] = hit[1]
        return snapshot
    snapshot = dict(obs.slurm)
    if hit is not None:
        last = hit[1]
        memo.setdefault("changes", {})["slurm"] = (snapshot, last, frozenset(changed_keys(snapshot, last)))
    memo["slurm_view"] = (obs, snapshot)
    return snapshot
