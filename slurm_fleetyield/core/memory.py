"""Remember: fold one tick's decisions into the next ``ControllerState``.

Input: the previous state, sensed history, node decisions, priced nodes, fatal findings, drains,
``Params``, ``now``. Output: the next ``ControllerState``, bounded (fatal history to ``fatal_history_days``,
drain times to the rate window, processed event ids to ``max_processed_event_ids``).

A node's last fy_ features and weight are only remembered when they were derived from fresh data, so an
UNKNOWN stretch keeps re-asserting what the node had before it went dark. Fatal evidence enters the history
once it is acted on (drained or moot); held evidence is reconsidered next tick and recorded then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from slurm_fleetyield.core import quarantine
from slurm_fleetyield.core.model import NodeDecision, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.quarantine import MISSING_KEY_PREFIX, Drains, Fatal, pushed_marker, to_held
from slurm_fleetyield.core.rehab import Rehab
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.state import ControllerState, NodeMemory


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
    nodes: dict[str, NodeMemory] | None = None,
) -> ControllerState:
    """``rehab``: the lifecycle's drains of this tick (approved ones count against the rate window). The
    lifecycle, gate, settle and learn parts of the state are set by the loop from their own stages.
    ``nodes``: the node memories when already made (core/carry.py), else every node's (``remember_nodes``)."""
    if nodes is None:
        nodes = remember_nodes(state, sensed, decisions, priced, drains, params, now, rehab)
    new_drains = rehab.new_drains if rehab is not None else 0
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
    return ControllerState(
        nodes=nodes,
        history=sensed.history,
        layout=sensed.layout,
        drain_times=drain_times,
        processed_events=ids,
        held_fatal=to_held(fatal, drains.held, qp.max_processed_event_ids) if drains.held else (),
        last_tick=now,
    )


def remember_nodes(
    state: ControllerState,
    sensed: Sensed,
    decisions: Mapping[str, NodeDecision],
    priced: Priced,
    drains: Drains,
    params: Params,
    now: float,
    rehab: Rehab | None = None,
    names: Iterable[str] | None = None,
) -> dict[str, NodeMemory]:
    """Each node's next memory: of every node with a decision or sensed, by name, or of ``names`` only (a
    node sampled but unknown to Slurm keeps what it had; with no memory it has none).

    A node's memory reads its last memory, its decision and priced node, its fatal evidence acted on and
    its drain this tick, and, to trim its fatal history, ``now``. A memory equal to the last one is handed
    on as that very object."""
    extra_drains = rehab.drains if rehab is not None else ()
    oldest = now - params.risk.fatal_history_days * 86_400.0
    new_fatal: dict[str, list[tuple[float, str]]] = {}
    for f in drains.processed:
        new_fatal.setdefault(f.node, []).append((f.time, f.uuid or ""))
    drained_now = {d.node: d for d in drains.drains}
    for dn in extra_drains:
        drained_now.setdefault(dn.node, dn)
    first_fatal = {f.node: f for f in reversed(drains.processed)}
    nodes: dict[str, NodeMemory] = {}
    for name in sorted({*decisions, *sensed.nodes}) if names is None else names:
        old = state.nodes.get(name)
        d = decisions.get(name)
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
        new = NodeMemory(
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
        # e.g. only the Slurm state moved: hand on the very memory (the stages that carry their answer,
        # core/carry.py, look again only at nodes whose memory is another object)
        nodes[name] = old if old is not None and new == old else new
    return nodes


def _replace(m: NodeMemory, **changes: object) -> NodeMemory:
    from dataclasses import replace

    return replace(m, **changes)  # type: ignore[arg-type]
