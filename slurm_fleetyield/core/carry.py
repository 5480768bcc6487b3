"""What a stage's answer carries from last tick: the loop's rule of which nodes can differ.

Input: this tick's inputs of a stage and ``ControllerState.memo`` (last tick's inputs and answer, kept from
tick to tick, never persisted). Output: the stage's answer, equal to the stage's rule applied to every node
(tests/sim/test_reuse.py checks it against an empty memo, tick by tick).

A stage is a rule of one node (``profile.profile``, ``risk.assess``, ``memory.remember_nodes`` here;
``price.price`` and ``route.decide`` in core/carry_place.py), called with the names to do. The rule of which
nodes can differ is written once, beside the call, in the terms of what the stage reads: every other node
keeps last tick's answer. A node's answer equal to last tick's is handed on as that very
object, so the stages after it, which look again only at nodes whose input is another object, do not redo
a node whose answer did not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_fleetyield.core import memory
from slurm_fleetyield.core import price as price_stage
from slurm_fleetyield.core import profile as profile_stage
from slurm_fleetyield.core import risk as risk_stage
from slurm_fleetyield.core.fatal_history import fatal_events
from slurm_fleetyield.core.model import Envelope, Health, NodeDecision, NodeRisk, Observations, SlurmNode
from slurm_fleetyield.core.params import Params, ProfileParams
from slurm_fleetyield.core.quarantine import Drains, Fatal
from slurm_fleetyield.core.rehab import Rehab
from slurm_fleetyield.core.scoring import Scorer, compile_signals
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.state import (
    ControllerState,
    NodeMemory,
    changed_keys,
    note_changes,
    slurm_view,
    sorted_names,
)


def profile(
    sensed: Sensed, obs: Observations, state: ControllerState, pp: ProfileParams
) -> dict[str, Envelope]:
    """``profile.profile`` of the nodes whose inputs changed since last tick, last tick's envelope for every
    other node. An envelope reads the node's ``SensedNode``, the GPU type of its Slurm row and the params, all
    frozen: with the very params as last tick and the same node names, only the nodes whose SensedNode is
    another object or whose GPU type changed are profiled again (else every node is)."""
    nodes = sensed.nodes
    snapshot = slurm_view(state.memo, obs)  # a copy: the shell's mapping may be updated in place
    last: dict[str, Any] | None = state.memo.get("profile_last")
    base: Mapping[str, Envelope] | None = None
    todo: set[str] = set()
    if last is not None and last["pp"] is pp:
        memo, was = state.memo, last["slurm"]
        todo = changed_keys(nodes, last["nodes"], memo)
        moved = changed_keys(snapshot, was, memo)  # Slurm rows that are other objects (a job started, ...)
        todo.update(n for n in moved if _gpu_type(snapshot, n) != _gpu_type(was, n))
        if all(n in nodes and n in last["nodes"] for n in todo):  # the same names: else all, in their order
            base = last["out"]
    if base is None:
        out = profile_stage.profile(sensed, obs, pp)
    else:
        out = dict(base)
        for name, env in profile_stage.profile(sensed, obs, pp, sorted(todo)).items():
            out[name] = env if env != base[name] else base[name]
    state.memo["profile_last"] = {"nodes": nodes, "pp": pp, "slurm": snapshot, "out": out}
    note_changes(state.memo, "profile", out, base, todo if base is not None else ())
    return out


def _gpu_type(slurm: Mapping[str, SlurmNode], name: str) -> str | None:
    """What an envelope reads of a node's Slurm row (tests/core/test_profile.py checks that it is all)."""
    row = slurm.get(name)
    return None if row is None else row.gpu_type


def risk(
    sensed: Sensed, fatal: tuple[Fatal, ...], state: ControllerState, params: Params, now: float
) -> dict[str, NodeRisk]:
    """``risk.assess`` of the nodes whose risk can differ from last tick's, last tick's risk for every other.

    A node's risk reads its SensedNode and sample age, its fatal findings, its fatal history (whose window
    and decay move with ``now``), the learned multipliers and the params. With the very params and layout
    as last tick, sense's list of the nodes that changed against the very nodes last tick assessed
    (``Sensed.changed``) and remember's index of the very memories (``fatal_history_index``), the nodes
    assessed again are:

    - the changed nodes, except one whose GPUs are the very same objects (fresh then and now), whose sample
      age alone moved: its last risk, restamped;
    - the nodes with fatal findings now or last tick;
    - the nodes with a fatal history that is another object than when last assessed, or whose due time
      (``risk.history_due``) has come;
    - when a signal's learned multiplier moved, the nodes with a GPU whose score read one (a GPU with
      contributions: ``scored``); when the learned base moved, every other node sat at the old base
      (``risk.sits_at_base``) and is put at the new one (``risk.at_base``).

    Else (any of the above is not known) every node is assessed."""
    memo = state.memo
    scorer = _scorer(memo, params, sensed.layout)
    mult = state.learn.multipliers if params.learn.enabled else {}
    key = (params, sensed.layout, mult, risk_stage.base_probability(state, params))
    fatal_nodes = frozenset(f.node for f in fatal)
    last: dict[str, Any] | None = memo.get("risk_last")
    todo = _risk_todo(sensed, fatal_nodes, state, key, now, last)
    nodes = sensed.nodes
    base: Mapping[str, NodeRisk] | None = None  # the answer carried
    done: set[str] = set()
    if todo is None or last is None:
        out = risk_stage.assess(sensed, fatal, state, params, now, scorer=scorer)
        due: dict[str, tuple[Any, float]] = {}
        scored: set[str] = set()
        names: list[str] = list(nodes)
    else:
        base = last["out"]
        out = dict(base)
        due, scored = dict(last["due"]), set(last["scored"])
        changed, again = todo
        again |= fatal_nodes | last["fatal"]
        kept: set[str] = set()  # restamped or rebased, not assessed
        since = sensed.since or {}
        for name in changed - again:
            node, was = nodes.get(name), since.get(name)
            if node is not None and was is not None and was.gpus is node.gpus and was.fresh and node.fresh:
                nr = base[name]  # the very GPUs, only the sample's age moved: restamped
                out[name] = NodeRisk(
                    name, nr.health, nr.probability, nr.gpus, nr.reason, sensed.stale_s(name)
                )
                kept.add(name)
        if last["key"][3] != key[3]:  # the learned base moved: read by every GPU no signal moved
            old_base = last["key"][3]
            for name, nr in base.items():
                if name in changed or name in again:
                    continue
                if risk_stage.sits_at_base(nr, old_base):
                    out[name] = risk_stage.at_base(nr, key[3], params)
                    kept.add(name)
                elif nr.health is not Health.UNKNOWN:
                    again.add(name)
        names = sorted(n for n in changed | again if n in nodes and n not in kept)
        for name, nr in risk_stage.assess(sensed, fatal, state, params, now, names, scorer).items():
            old = base.get(name)
            out[name] = nr if old is None or nr != old else old
        done = changed | again | kept
    memories = state.nodes
    for name in names:
        mem = memories.get(name)
        if mem is not None and mem.fatal_history:
            events = fatal_events(state, name, params, now)
            due[name] = (mem.fatal_history, risk_stage.history_due(mem.fatal_history, events, params, now))
        if any(g.contributions for g in out[name].gpus):
            scored.add(name)
        else:
            scored.discard(name)
    memo["risk_last"] = {"since": nodes, "out": out, "key": key, "fatal": fatal_nodes, "due": due,
                         "scored": frozenset(scored)}  # fmt: skip
    note_changes(memo, "risk", out, base, done if base is not None else ())
    return out


def _risk_todo(
    sensed: Sensed,
    fatal_nodes: frozenset[str],
    state: ControllerState,
    key: tuple[Any, ...],
    now: float,
    last: dict[str, Any] | None,
) -> tuple[set[str], set[str]] | None:
    """Besides the nodes with fatal findings now or last tick, the nodes ``risk`` may assess again (its
    rule): (the changed nodes, those with a history that moved or came due or whose score read a learned
    signal multiplier that moved); None: every node."""
    hist = state.memo.get("fatal_history_index")
    if (
        sensed.changed is None
        or last is None
        or last["since"] is not sensed.since
        or hist is None
        or hist[0] is not state.nodes
    ):
        return None
    params, layout, mult, _ = last["key"]
    if params is not key[0] or layout != key[1]:
        return None
    again: set[str] = set()
    if mult != key[2]:
        again |= last["scored"]
    due = last["due"]
    memories = state.nodes
    for n in hist[1]:
        d = due.get(n)
        m = memories.get(n)
        if d is None or m is None or d[0] is not m.fatal_history or now >= d[1] - 1.0:  # 1 s early: floats
            again.add(n)
    return set(sensed.changed), again


def _scorer(memo: dict[str, Any], params: Params, layout: tuple[str, ...]) -> Scorer:
    """The signals compiled for ``params`` and ``layout``: built again only when either changed."""
    made = memo.setdefault("scorer", {})
    if made.get("params") is not params or made.get("layout") != layout:
        made.update(
            params=params, layout=layout, scorer=Scorer(compile_signals(params, layout), params, layout)
        )
    return made["scorer"]  # type: ignore[no-any-return]


def remember(
    state: ControllerState,
    sensed: Sensed,
    decisions: Mapping[str, NodeDecision],
    priced: price_stage.Priced,
    fatal: tuple[Fatal, ...],
    drains: Drains,
    params: Params,
    now: float,
    rh: Rehab,
) -> ControllerState:
    """``memory.remember`` with the node memories of ``memory.remember_nodes`` for the nodes whose memory can
    differ from last tick's, and last tick's for every other.

    A node's memory reads its last memory, its decision and priced node, its fatal evidence acted on and its
    drain this tick, and ``now`` (its fatal history is trimmed to the window). With the same node names as
    last tick and the very memories remember handed on, the nodes remembered again are those whose
    decision or priced node is another object, those with fatal evidence acted on or a drain now or a drain
    last tick, and those whose fatal history holds a report leaving the window (1 s early: floats). Else
    every node is remembered. Also kept (never persisted): the index of the nodes with a fatal history, for
    the very memories handed on (``fatal_history_index``, read by ``risk`` above)."""
    memo = state.memo
    names = sorted_names(memo.setdefault("remember_names", {}), decisions, sensed.nodes)
    drained = frozenset(d.node for d in (*drains.drains, *rh.drains))
    acted = {f.node for f in drains.processed} | drained
    oldest = now - params.risk.fatal_history_days * 86_400.0
    last: dict[str, Any] | None = memo.get("remember_last")
    base: Mapping[str, NodeMemory] | None = None  # the answer carried
    todo: list[str] = []
    if last is None or last["names"] is not names or last["out"] is not state.nodes:
        nodes = memory.remember_nodes(state, sensed, decisions, priced, drains, params, now, rh, names)
        first = {n: min(h[0] for h in m.fatal_history) for n, m in nodes.items() if m.fatal_history}
    else:
        again = changed_keys(decisions, last["decisions"], memo) | changed_keys(
            priced.nodes, last["pnodes"], memo
        )
        again |= acted | last["drained"]
        again.update(n for n, t in last["first"].items() if t < oldest + 1.0)
        todo = sorted(n for n in again if n in decisions or n in sensed.nodes)  # the names' order
        base = last["out"]
        nodes = dict(base)
        nodes.update(memory.remember_nodes(state, sensed, decisions, priced, drains, params, now, rh, todo))
        first = dict(last["first"])  # the earliest report of each node with a fatal history
        for name in todo:
            nm = nodes.get(name)
            if nm is not None and nm.fatal_history:
                first[name] = min(h[0] for h in nm.fatal_history)
            else:
                first.pop(name, None)
    memo["fatal_history_index"] = (nodes, frozenset(first))
    memo["remember_last"] = {
        "names": names, "decisions": decisions, "pnodes": priced.nodes, "out": nodes, "first": first,
        "drained": drained,
    }  # fmt: skip
    note_changes(memo, "remember", nodes, base, todo)
    return memory.remember(state, sensed, decisions, priced, fatal, drains, params, now, rh, nodes)
