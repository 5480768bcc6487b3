"""The persisted form of ``ControllerState``: one small document per node, a few fleet-level parts, and the
diff that hands the store only what changed since its last commit.

Input: a ``ControllerState`` (``StateEncoder.encode``), or the stored parts and node documents
(``decode``). Output: ``StateRows`` (fleet parts and node documents to write, nodes to delete), or the state
again, equal to the one encoded (``ControllerState.__eq__``) and with the compact GPU history
(``NodeHistory``) the sense stage keeps, so a restarted controller does not rebuild it.

What changes on every tick for every node is time alone: the history's ``last_time`` and ring of times
(one ring object shared by every node sampled together). Those stay out of the node documents, in the fleet
part ``clocks``: the most common (history time, ring) once, the nodes that differ as columns (the ``sample``
column, the memory's former ``last_sample_time``, is written empty and ignored when read). A settled tick
therefore writes ``clocks`` and the few nodes whose memory, GPU tracks, lifecycle, proposal, denial or open
prediction changed.

Change detection compares each node's parts with those of the last accepted encode, by identity first (the
stages keep unchanged objects: GPU tracks, lifecycle memories, predictions), then by value; an unchanged
node is never serialised. The fleet parts are the state's own ``to_dict`` with the per-node mappings left
out, so a field added to the state later is persisted (whole, every tick it changes) without touching this
module. ``memo`` and ``NodeHistory.quiet`` are caches and never persisted: a restored state only costs a
slower first tick.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from typing import Any

from slurm_fleetyield.core.lifecycle import LifecycleMemory
from slurm_fleetyield.core.state import (
    ControllerState,
    Counters,
    Denial,
    GpuHistory,
    GpuTrack,
    LearnMemory,
    NodeHistory,
    NodeMemory,
    Prediction,
    _history_from_dict,
    _history_to_dict,
    _memory_from_dict,
    _memory_to_dict,
    _proposal_from_dict,
    _proposal_to_dict,
)

ROWS_FORMAT = 1
"""Format of the node documents and the ``clocks`` part (stored in the ``meta`` part as ``rows_format``)."""

# fleet parts: name -> keys of ``ControllerState.to_dict()`` it holds; ``meta`` takes every other key
_PART_KEYS = {"events": ("processed_events",), "settle": ("settle",), "learn": ("learn",)}
PARTS = ("meta", *_PART_KEYS, "clocks")
_PER_NODE_KEYS = ("nodes", "history", "lifecycle", "proposals", "denials")

# a node memory as a tuple compared by value
_MEMORY_KEY = attrgetter(*(f.name for f in fields(NodeMemory)))
_MISSING = object()


def _dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, slots=True)
class _Base:
    """What the store holds after a commit: per component, node -> the object compared; the fleet parts."""

    components: tuple[dict[str, Any], ...]
    parts: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StateRows:
    """One commit's worth of state: the fleet parts that changed (name, JSON), the node documents that
    changed (node, JSON) and the nodes gone. ``full``: written from scratch, the store drops every stored
    part and node first."""

    parts: tuple[tuple[str, str], ...]
    nodes: tuple[tuple[str, str], ...]
    deletes: tuple[str, ...]
    full: bool
    node_count: int
    base: _Base


class StateEncoder:
    """Encodes states as the difference to the last accepted one. Call ``accept(rows)`` once the rows are
    committed, ``forget()`` when unsure what the store holds (the next encode is full), ``seed(state)`` with
    a state just loaded from the store (the next encode is a difference to it)."""

    def __init__(self) -> None:
        self._base: _Base | None = None

    def encode(self, state: ControllerState, *, full: bool = False) -> StateRows:
        components = _components(state)
        parts = _parts(state)
        base = None if full else self._base
        names = _names(components)
        if base is None:
            changed: Iterable[str] = names
            deletes: tuple[str, ...] = ()
            part_rows = tuple((p, _dumps(v)) for p, v in parts.items())
        else:
            changed_set: set[str] = set()
            for cur, old in zip(components, base.components, strict=True):
                get = old.get
                for n, v in cur.items():
                    o = get(n, _MISSING)
                    if o is not v and o != v:
                        changed_set.add(n)
                changed_set.update(old.keys() - cur.keys())  # a part gone: the node, or the node's part
            changed = sorted(changed_set & names)
            deletes = tuple(sorted(changed_set - names))
            part_rows = tuple((p, _dumps(v)) for p, v in parts.items() if base.parts.get(p, _MISSING) != v)
        node_rows = tuple((n, _dumps(_node_doc(state, n))) for n in sorted(changed))
        return StateRows(part_rows, node_rows, deletes, base is None, len(names), _Base(components, parts))

    def accept(self, rows: StateRows) -> None:
        self._base = rows.base

    def forget(self) -> None:
        self._base = None

    def seed(self, state: ControllerState) -> None:
        self._base = _Base(_components(state), _parts(state))


def _components(state: ControllerState) -> tuple[dict[str, Any], ...]:
    """Per persisted node part, node -> the object that stands for it (compared by identity, then value)."""
    history = {
        n: (h.gpus if type(h) is NodeHistory else ("plain", h))  # type: ignore[attr-defined]
        for n, h in state.history.items()
    }
    return (
        {n: _MEMORY_KEY(m) for n, m in state.nodes.items()},
        history,
        dict(state.lifecycle),
        dict(state.proposals),
        dict(state.denials),
        dict(state.learn.predictions),
    )


def _names(components: tuple[dict[str, Any], ...]) -> set[str]:
    names: set[str] = set()
    for c in components:
        names.update(c)
    return names


def _parts(state: ControllerState) -> dict[str, Any]:
    """The fleet parts as JSON-safe objects: ``to_dict`` of the state without its per-node mappings."""
    fleet = replace(
        state,
        nodes={},
        history={},
        lifecycle={},
        proposals={},
        denials={},
        learn=replace(state.learn, predictions={}),
    ).to_dict()
    for key in _PER_NODE_KEYS:
        del fleet[key]
    del fleet["learn"]["predictions"]
    parts: dict[str, Any] = {p: {k: fleet.pop(k) for k in keys} for p, keys in _PART_KEYS.items()}
    parts = {"meta": {**fleet, "rows_format": ROWS_FORMAT}, **parts, "clocks": _clocks(state)}
    return parts


# ---- clocks -----------------------------------------------------------------------------------------------


def _clocks(state: ControllerState) -> dict[str, Any]:
    """Every node's (None, history time, ring of times): the most common triple once (``common``), the
    other nodes as columns (``nodes``, ``sample`` (always None: kept for rows format 1), ``last``, ``ring``:
    an index into ``rings``)."""
    hist = {n: h for n, h in state.history.items() if type(h) is NodeHistory}
    rings: list[tuple[float, ...]] = []
    ring_of: dict[int, int] = {}  # id(times) -> index in rings (nodes sampled together share one object)

    def ring(times: tuple[float, ...]) -> int:
        i = ring_of.get(id(times))
        if i is None:
            for j, r in enumerate(rings):
                if r == times:
                    i = j
                    break
            else:
                i = len(rings)
                rings.append(times)
            ring_of[id(times)] = i
        return i

    groups: dict[tuple[Any, Any, Any], list[str]] = {}
    for n in sorted(state.nodes.keys() | hist.keys()):
        h = hist.get(n)
        key = (None, None, None) if h is None else (None, h.last_time, ring(h.times))
        groups.setdefault(key, []).append(n)
    common: tuple[Any, Any, Any] = (None, None, None)
    if groups:
        common = max(groups, key=lambda k: len(groups[k]))
    others = sorted((n, k) for k, ns in groups.items() if k != common for n in ns)
    return {
        "rings": [list(r) for r in rings],
        "common": list(common),
        "nodes": [n for n, _ in others],
        "sample": [k[0] for _, k in others],
        "last": [k[1] for _, k in others],
        "ring": [k[2] for _, k in others],
    }


# ---- node documents ---------------------------------------------------------------------------------------


def _track_doc(t: GpuTrack) -> list[Any]:
    """[last_raw, last_adj (k: equal to last_raw's first k channels, the trended ones; None, as older rows
    wrote: equal to last_raw), steps (a point None: equal to last_adj)]."""
    adj = t.last_adj
    k = len(adj)
    return [
        list(t.last_raw),
        k if adj == t.last_raw[:k] else list(adj),
        [[s, None if p == adj else list(p)] for s, p in zip(t.step_times, t.step_points, strict=True)],
    ]


def _track_from(d: list[Any]) -> GpuTrack:
    raw: Counters = tuple(d[0])
    k = d[1]
    adj: Counters = raw if k is None else raw[:k] if type(k) is int else tuple(k)
    starts = tuple(float(s) for s, _ in d[2])
    return GpuTrack(raw, adj, starts, tuple(adj if p is None else tuple(p) for _, p in d[2]))


def _node_doc(state: ControllerState, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    m = state.nodes.get(name)
    if m is not None:
        doc["memory"] = _memory_to_dict(m)
    h = state.history.get(name)
    if type(h) is NodeHistory:
        doc["tracks"] = {
            u: _track_doc(g) if isinstance(g, GpuTrack) else _history_to_dict(g)
            for u, g in h.gpus.items()  # type: ignore[attr-defined]
        }
    elif h is not None:
        doc["history"] = {u: _history_to_dict(g) for u, g in h.items()}
    lc = state.lifecycle.get(name)
    if lc is not None:
        doc["lifecycle"] = lc.to_dict()
    p = state.proposals.get(name)
    if p is not None:
        doc["proposal"] = _proposal_to_dict(p)
    d = state.denials.get(name)
    if d is not None:
        doc["denial"] = [d.proposal_id, d.time, d.risk]
    r = state.learn.predictions.get(name)
    if r is not None:
        doc["prediction"] = [
            r.made_at,
            r.horizon_s,
            r.p,
            [list(x) for x in r.parts],
            [list(x) for x in r.gpu_buckets],
        ]
    return doc


# ---- decoding ---------------------------------------------------------------------------------------------


def decode(parts: Mapping[str, str], nodes: Iterable[tuple[str, str]]) -> ControllerState:
    """The state from its stored fleet parts (name -> JSON) and node documents ((node, JSON), any order)."""
    missing = [p for p in PARTS if p not in parts]
    if missing:
        raise ValueError(f"stored controller state lacks its parts {missing}")
    loaded = {p: json.loads(parts[p]) for p in PARTS}
    meta = dict(loaded["meta"])
    fmt = meta.pop("rows_format", None)
    if fmt != ROWS_FORMAT:
        raise ValueError(
            f"stored controller state rows format {fmt!r} is not supported (expected {ROWS_FORMAT})"
        )
    fleet: dict[str, Any] = {**meta}
    for p in _PART_KEYS:
        fleet.update(loaded[p])
    base = ControllerState.from_dict(fleet)
    clocks = loaded["clocks"]
    rings = [tuple(float(t) for t in r) for r in clocks["rings"]]
    common = clocks["common"]
    special = {
        n: (s, t, i)
        for n, s, t, i in zip(clocks["nodes"], clocks["sample"], clocks["last"], clocks["ring"], strict=True)
    }
    memories: dict[str, NodeMemory] = {}
    history: dict[str, Mapping[str, GpuHistory]] = {}
    lifecycle: dict[str, LifecycleMemory] = {}
    proposals = {}
    denials: dict[str, Denial] = {}
    predictions: dict[str, Prediction] = {}
    for name, text in sorted(nodes):
        doc = json.loads(text)
        _sample, last, ring = special.get(name, common)
        if "memory" in doc:
            memories[name] = _memory_from_dict(doc["memory"])
        if "tracks" in doc:
            gpus = {
                u: _track_from(g) if isinstance(g, list) else _history_from_dict(g)
                for u, g in doc["tracks"].items()
            }
            history[name] = NodeHistory(last, rings[ring], gpus)
        elif "history" in doc:
            history[name] = {u: _history_from_dict(g) for u, g in doc["history"].items()}
        if "lifecycle" in doc:
            lifecycle[name] = LifecycleMemory.from_dict(doc["lifecycle"])
        if "proposal" in doc:
            proposals[name] = _proposal_from_dict(doc["proposal"])
        if "denial" in doc:
            i, t, r = doc["denial"]
            denials[name] = Denial(i, float(t), float(r))
        if "prediction" in doc:
            t, h, p, pp, gb = doc["prediction"]
            predictions[name] = Prediction(
                name,
                float(t),
                float(h),
                float(p),
                tuple((b, float(e)) for b, e in pp),
                tuple((int(g), b) for g, b in gb),
            )
    learn: LearnMemory = replace(base.learn, predictions=predictions)
    return replace(
        base,
        nodes=memories,
        history=history,
        lifecycle=lifecycle,
        proposals=proposals,
        denials=denials,
        learn=learn,
    )
