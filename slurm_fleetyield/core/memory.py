"""Remember: fold one tick's decisions into the next ``ControllerState``.

Input: the previous state, sensed history, node decisions, priced nodes, fatal findings, drains,
``Params``, ``now``. Output: the next ``ControllerState``, bounded (fatal history to ``fatal_history_days``,
drain times to the rate window, processed event ids to ``max_processed_event_ids``).

A node's last fy_ features and weight are only remembered when they were derived from fresh data, so an
UNKNOWN stretch keeps re-asserting what the node had before it went dark. Fatal evidence enters the history
once it is acted on (drained or moot); held evidence is reconsidered next tick and recorded then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_fleetyield.core import quarantine
from slurm_fleetyield.core.model import NodeDecision, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.quarantine import MISSING_KEY_PREFIX, Drains, Fatal, pushed_marker, to_held
from slurm_fleetyield.core.rehab import Rehab
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.state import ControllerState, NodeMemory, changed_keys, note_changes, sorted_names


def remember(
    state: ControllerState,
    sensed: Sensed,
    decisions: Mapping[str, NodeDecision],
    priced: Priced,
    fatal: tuple[Fatal, ...],
    drains: Drains,
    params: Params,
    now: float,
    rehab: Rehab | None = None,
) -> ControllerState:
    """``rehab``: the lifecycle's drains of this tick (approved ones count against the rate window). The
    lifecycle, gate, settle and learn parts of the state are set by the loop from their own stages."""
    extra_drains = rehab.drains if rehab is not None else ()
    new_drains = rehab.new_drains if rehab is not None else 0
    # what was acted on is in drains.processed; the findings of held nodes are kept and reconsidered next tick
    oldest = now - params.risk.fatal_history_days * 86_400.0
    new_fatal: dict[str, list[tuple[float, str]]] = {}
    for f in drains.processed:
        new_fatal.setdefault(f.node, []).append((f.time, f.uuid or ""))
    drained_now = {d.node: d for d in drains.drains}
    for dn in extra_drains:
        drained_now.setdefault(dn.node, dn)
    first_fatal = {f.node: f for f in reversed(drains.processed)}
    nodes: dict[str, NodeMemory] = {}
    # A node whose previous memory is the very one remembered from this decision and priced node last tick,
    # with no fatal evidence or drain now and no fatal history to trim, is remembered as that very object
    # (ControllerState.memo, not persisted): the tier did not change, so neither did ``since``.
    memo = state.memo.setdefault("remember", {})
    pnodes = priced.nodes
    names = sorted_names(state.memo.setdefault("remember_names", {}), decisions, sensed.nodes)
    # Last tick's memories are the start when it is known which nodes may differ (_todo); only those go
    # through the per-node memo above.
    carried = state.memo.get("remember_last")
    todo = _todo(carried, names, decisions, pnodes, state, {*new_fatal, *drained_now}, oldest)
    items: list[str] = names
    if todo is not None and carried is not None:
        nodes = dict(carried["out"])
        items = sorted(n for n in todo if n in decisions or n in sensed.nodes)  # the names' order
    for name in items:
        old = state.nodes.get(name)
        d = decisions.get(name)
        hit = memo.get(name)
        if (
            hit is not None
            and hit[2] is old
            and hit[0] is d
            and d is not None
            and hit[1] is pnodes[name]
            and not (old.fatal_history and any(h[0] < oldest for h in old.fatal_history))
            and name not in new_fatal
            and name not in drained_now
        ):
            nodes[name] = old
            continue
        history = old.fatal_history if old else ()
        if name in new_fatal:
            history = (*history, *sorted(new_fatal[name]))
        if history and any(h[0] < oldest for h in history):  # most nodes have none to trim
            history = tuple(h for h in history if h[0] >= oldest)
        if d is None:  # sampled but unknown to Slurm: keep only what we knew
            if old is not None:
                nodes[name] = old if history is old.fatal_history else _replace(old, fatal_history=history)
            continue
        pn = priced.nodes[name]
        fresh_features = pn.keep_fy is None and pn.feature_tier is None and d.managed
        tier = d.tier if d.tier is not Tier.UNKNOWN or old is None else old.tier
        since = old.since if old is not None and old.tier is tier else now
        drained_by_us = name in drained_now or (
            d.slurm_state != "" and "DRAIN" in d.slurm_state and d.reason.startswith("fleetyield:")
        )
        last = first_fatal.get(name) if name in drained_now else None
        nodes[name] = new = NodeMemory(
            tier=tier,
            since=since,
            reason=d.reason,
            drained_by_us=drained_by_us,
            fatal_history=history,
            last_xid=last.xid if last else (old.last_xid if old else None),
            last_gpu=last.gpu if last else (old.last_gpu if old else None),
            fy_features=d.fy_features if fresh_features else (old.fy_features if old else ()),
            weight=d.weight if fresh_features else (old.weight if old else None),
        )
        if old is not None and new == old:
            # e.g. only the Slurm state moved: hand on the very memory (a stage that starts from last
            # tick's answer, core/price.py, looks again only at nodes whose memory is another object)
            nodes[name] = new = old
        if name in drained_now:  # drained_by_us and the last XID came from this tick's drain: not reusable
            memo.pop(name, None)
        else:
            memo[name] = (d, pn, new)
    qp = params.quarantine
    processed = list(state.processed_events)
    dropped = False
    if quarantine.processed(state).has_missing:  # only then is "recovered" needed
        sensed_nodes = sensed.nodes

        def recovered(key: str) -> bool:  # the node the key names is sampled again with every GPU
            s = sensed_nodes.get(key[len(MISSING_KEY_PREFIX) :].split(":", 1)[0])
            return s is not None and s.fresh and not s.missing_gpus

        processed = [k for k in processed if not (k.startswith(MISSING_KEY_PREFIX) and recovered(k))]
        dropped = len(processed) < len(state.processed_events)
    processed.extend(f.key for f in drains.processed)
    processed.extend(m for f in drains.processed if (m := pushed_marker(f)) is not None)
    drain_times = tuple(t for t in state.drain_times if t > now - qp.window_s) + tuple(
        now for _ in range(len(drains.drains) + new_drains)
    )
    ids = state.processed_events
    if dropped or drains.processed or len(ids) > qp.max_processed_event_ids:  # else the very same tuple
        ids = tuple(processed[-qp.max_processed_event_ids :])
    # the earliest report of each node with a fatal history (when it must be trimmed next: _todo)
    if todo is not None and carried is not None:
        # the same keys as last tick, in the same order: the names are the very list, so every node with a
        # decision had a memory then, and a node without one only keeps what it had
        first = dict(carried["first"])
        for name in items:
            nm = nodes.get(name)
            if nm is not None and nm.fatal_history:
                first[name] = min(h[0] for h in nm.fatal_history)
            else:
                first.pop(name, None)
    else:
        first = {n: min(h[0] for h in m.fatal_history) for n, m in nodes.items() if m.fatal_history}
    # the remembered nodes with a fatal history (risk.assess), for the very mapping handed on (not persisted)
    state.memo["fatal_history_index"] = (nodes, frozenset(first))
    state.memo["remember_last"] = {
        "names": names, "decisions": decisions, "pnodes": pnodes, "out": nodes, "first": first,
        "drained": frozenset(drained_now),
    }  # fmt: skip
    base = carried["out"] if todo is not None and carried is not None else None  # the answer carried
    note_changes(state.memo, "remember", nodes, base, items)
    return ControllerState(
        nodes=nodes,
        history=sensed.history,
        layout=sensed.layout,
        drain_times=drain_times,
        processed_events=ids,
        held_fatal=to_held(fatal, drains.held, qp.max_processed_event_ids) if drains.held else (),
        last_tick=now,
    )


def _replace(m: NodeMemory, **changes: object) -> NodeMemory:
    from dataclasses import replace

    return replace(m, **changes)  # type: ignore[arg-type]


def _todo(
    last: dict[str, Any] | None,
    names: list[str],
    decisions: Mapping[str, NodeDecision],
    pnodes: Mapping[str, object],
    state: ControllerState,
    acted: set[str],
    oldest: float,
) -> set[str] | None:
    """The nodes whose memory may differ from last tick's, or None (not known: every node).

    Known when the node names are the very list of last tick (``sorted_names``) and the memories are the
    very mapping remember handed on. Then a node is remembered again when its decision or priced node is
    another object, when it has fatal evidence acted on or a drain now (``acted``) or had a drain last tick
    (not memoized), or when its fatal history holds a report older than ``oldest`` (to trim; 1 s early:
    floats). Every other node has the very inputs of its memo entry, whose memory is last tick's; or it is
    sampled but unknown to Slurm and keeps its memory (nothing to trim) or has none, as the per-node rule
    would."""
    if last is None or last["names"] is not names or last["out"] is not state.nodes:
        return None
    memo = state.memo
    todo = changed_keys(decisions, last["decisions"], memo) | changed_keys(pnodes, last["pnodes"], memo)
    todo |= acted
    todo |= last["drained"]
    due = oldest + 1.0
    todo.update(n for n, t in last["first"].items() if t < due)
    return todo
