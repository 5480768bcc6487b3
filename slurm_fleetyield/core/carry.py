"""What a stage's answer carries from last tick: the loop's rule of which nodes can differ.

Input: this tick's inputs of a stage and ``ControllerState.memo`` (last tick's inputs and answer, kept from
tick to tick, never persisted). Output: the stage's answer, equal to the stage's rule applied to every node
(tests/sim/test_reuse.py checks it against an empty memo, tick by tick).

A stage here is a rule of one node (``profile.profile``, ``risk.assess``, called with the names to do). The
rule of which nodes can differ is written once, beside the stage, in the terms of what the stage reads:
every other node keeps last tick's answer. A node's answer equal to last tick's is handed on as that very
object, so the stages after it, which look again only at nodes whose input is another object, do not redo
a node whose answer did not change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from inspect import signature
from typing import Any

from slurm_fleetyield.core import gangs, memory
from slurm_fleetyield.core import price as price_stage
from slurm_fleetyield.core import profile as profile_stage
from slurm_fleetyield.core import risk as risk_stage
from slurm_fleetyield.core import route as route_stage
from slurm_fleetyield.core.fatal_history import fatal_events
from slurm_fleetyield.core.learn import is_lemon
from slurm_fleetyield.core.lifecycle import LifecycleMemory
from slurm_fleetyield.core.model import Envelope, Health, NodeDecision, NodeRisk, Observations, SlurmNode
from slurm_fleetyield.core.params import Params, ProfileParams
from slurm_fleetyield.core.plan import DrainNode, UpdateNodes
from slurm_fleetyield.core.premium_supply import share
from slurm_fleetyield.core.price import priced_memory, priced_slurm
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


def price(
    obs: Observations,
    sensed: Sensed,
    risks: Mapping[str, NodeRisk],
    envelopes: Mapping[str, Envelope],
    drains: Drains,
    state: ControllerState,
    params: Params,
    now: float,
    lifecycle: Mapping[str, LifecycleMemory],
    extra_drains: tuple[DrainNode, ...],
) -> price_stage.Priced:
    """``price.price`` of the nodes whose pricing can differ from last tick's, last tick's for every other.

    A node's pricing reads its Slurm row's drain state, reason and weight (``price.priced_slurm``), its
    risk, envelope and lifecycle memory, what ``price.priced_memory`` names of its memory, its drain reason,
    hold and fence, the params, the learned base multiplier and, for its lemon verdict, ``now``. With the
    very params, the same multiplier and Slurm's nodes the same, in the same order, the nodes priced again
    are those with a risk, envelope or lifecycle memory that is another object, a Slurm row or memory that
    differs in what pricing reads, a drain, hold or fence now or last tick, a tier change logged last tick,
    or a lemon verdict last tick (it moves with time; a node that was no lemon, with the same fatal history,
    is none now either: ``learn.is_lemon`` counts failures in a window that only moves forward). Else every
    node is priced."""
    memo = state.memo
    inputs = (slurm_view(memo, obs), risks, envelopes, lifecycle, state.nodes)
    keys = tuple(obs.slurm)
    m = price_stage.base_multiplier(state, params)
    special = frozenset({*(d.node for d in (*drains.drains, *extra_drains)), *drains.held, *drains.fenced})
    last: dict[str, Any] | None = memo.get("price_last")
    todo = _price_todo(last, keys, inputs, params, m, special, memo)
    base: Mapping[str, price_stage.PricedNode] | None = None  # the answer carried
    if todo is None or last is None:
        got = price_stage.price(
            obs, sensed, risks, envelopes, drains, state, params, now, lifecycle, extra_drains
        )
        out, reds = dict(got.nodes), set(got.red)
    else:
        base, pos = last["out"], last["pos"]
        names = sorted(todo & pos.keys(), key=pos.__getitem__)
        got = price_stage.price(
            obs, sensed, risks, envelopes, drains, state, params, now, lifecycle, extra_drains, names
        )
        out = dict(base)
        for name, pn in got.nodes.items():
            old = base[name]
            out[name] = pn if pn != old else old
        reds = {n for n in last["reds"] if n not in todo} | set(got.red)
    lp, memories = params.learn, state.nodes
    lemons = frozenset(
        n
        for n in got.nodes
        if (mem := memories.get(n)) is not None and mem.fatal_history and is_lemon(mem, now, lp)
    )
    pos = last["pos"] if base is not None and last is not None else {n: i for i, n in enumerate(keys)}
    logged = frozenset(e.node for e in got.events)
    memo["price_last"] = {
        "keys": keys, "pos": pos, "inputs": inputs, "params": params, "m": m, "out": out,
        "reds": frozenset(reds), "special": special, "logged": logged, "lemons": lemons,
    }  # fmt: skip
    note_changes(memo, "price", out, base, todo or ())
    return price_stage.Priced(out, got.events, tuple(sorted(reds)))


def _price_todo(
    last: dict[str, Any] | None,
    keys: tuple[str, ...],
    inputs: tuple[Any, ...],
    params: Params,
    m: float,
    special: frozenset[str],
    memo: dict[str, Any],
) -> set[str] | None:
    """The nodes ``price`` prices again (its rule); None: every node."""
    if last is None or last["params"] is not params or last["keys"] != keys or last["m"] != m:
        return None
    slurm, risks, envelopes, lifecycle, memories = inputs
    was = last["inputs"]
    todo = {
        n
        for n in changed_keys(slurm, was[0], memo)
        if priced_slurm(slurm.get(n)) != priced_slurm(was[0].get(n))
    }
    todo |= changed_keys(risks, was[1], memo)
    todo |= changed_keys(envelopes, was[2], memo)
    todo |= changed_keys(lifecycle, was[3], memo)
    old = was[4]
    todo.update(
        n
        for n in changed_keys(memories, old, memo)
        if priced_memory(memories.get(n)) != priced_memory(old.get(n))
    )
    return todo | special | last["special"] | last["logged"] | last["lemons"]


_ROUTE_FLAGS = {  # route's flags, with the defaults of its signature
    k: p.default
    for k, p in signature(route_stage.decide).parameters.items()
    if k in ("batch_wall", "service", "reserve", "spares_on")
}


def route(
    state: ControllerState,
    obs: Observations,
    priced: price_stage.Priced,
    envelopes: Mapping[str, Envelope],
    **how: Any,
) -> tuple[Mapping[str, NodeDecision], tuple[UpdateNodes, ...]]:
    """``route.route`` (its keyword arguments ``how``) of the nodes whose decision can differ from the last
    call's, the last call's decision for every other, and the updates of every node whose Slurm view
    differs from its decision.

    A node's decision reads its Slurm row, priced node and envelope, what ``route.loans`` names for it and
    four flags (batch wall, stake rule, premium reserve, spares). With the same flags and the same node
    names as the last call (the loop routes twice when it keeps a feature open), the nodes routed again
    are those whose Slurm row, priced node or envelope is another object or whose loans differ. Else every
    node is routed."""
    memo = state.memo
    snapshot = slurm_view(memo, obs)  # a copy: the shell's mapping may be updated in place
    flags = tuple(how.get(k, default) for k, default in _ROUTE_FLAGS.items())
    kw = {k: how[k] for k in ("lent", "lent_reason", "train_lent", "train_reason", "opened", "open_reason",
                              "walled", "withheld", "spares") if k in how}  # fmt: skip
    loans = route_stage.loans(**kw)
    inputs = (snapshot, priced.nodes, envelopes)
    last: dict[str, Any] | None = memo.get("route_last")
    base: Mapping[str, NodeDecision] | None = None  # the answer carried
    todo: set[str] = set()
    if last is not None and last["flags"] == flags and last["inputs"][0].keys() == snapshot.keys():
        for new, old in zip(inputs, last["inputs"], strict=True):
            todo |= changed_keys(new, old, memo)
        was = last["loans"]
        todo.update(n for n in loans.keys() | was.keys() if loans.get(n) != was.get(n))
        base = last["out"]
    if base is None or last is None:
        decisions = route_stage.decide(obs, priced, envelopes, **how)
        differ = {n for n, d in decisions.items() if route_stage.differs(d, snapshot[n])}
    else:
        names = sorted(n for n in todo if n in snapshot)
        routed = route_stage.decide(obs, priced, envelopes, **how, names=names)
        decisions = dict(base)
        for name, d in routed.items():
            old = base[name]
            decisions[name] = d if d != old else old
        differ = {n for n in last["differ"] if n not in todo}
        differ.update(n for n, d in routed.items() if route_stage.differs(d, snapshot[n]))
    memo["route_last"] = {
        "flags": flags,
        "inputs": inputs,
        "loans": loans,
        "out": decisions,
        "differ": differ,
    }
    note_changes(memo, "route", decisions, base, todo if base is not None else ())
    return decisions, route_stage.updates(decisions, differ)


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


def premium_supply(
    memo: dict[str, Any],
    idle: Mapping[str, int],
    envelopes: Mapping[str, Envelope],
    pnodes: Mapping[str, price_stage.PricedNode],
) -> tuple[dict[int, int], dict[int, int], list[str]]:
    """``premium_supply.supply`` from the last call's per-node shares and histograms: a node's share reads
    its idle count, envelope and priced node, so only the nodes whose idle count differs or whose envelope
    or priced node is another object are counted again (out of the histograms, then into them)."""
    last = memo.get("premium_supply")
    if last is None:
        shares: dict[str, tuple[int, int, bool]] = {}
        base: dict[int, int] = {}
        batch: dict[int, int] = {}
        eligible: set[str] = set()
        todo: Iterable[str] = idle
    else:
        shares, base, batch = dict(last["shares"]), dict(last["base"]), dict(last["batch"])
        eligible = set(last["eligible"])
        old_idle = last["idle"]
        todo = {n for n, v in idle.items() if old_idle.get(n) != v}  # holds the keys new to idle
        if len(old_idle) != len(idle) - sum(1 for n in todo if n not in old_idle):  # some left idle
            todo.update(old_idle.keys() - idle.keys())
        todo |= changed_keys(envelopes, last["envs"], memo) | changed_keys(pnodes, last["pnodes"], memo)
    moved = last is None  # an eligible node came or went: sorted again
    nothing = (0, 0, False)
    for name in todo:
        n_idle = idle.get(name)
        new = nothing if n_idle is None else share(n_idle, envelopes.get(name), pnodes.get(name))
        old = shares.get(name, nothing)
        if new == old:
            continue
        moved = moved or new[2] is not old[2]
        for hist, was, now in ((base, old[0], new[0]), (batch, old[1], new[1])):
            if was > 0:
                left = hist[was] - 1
                if left:
                    hist[was] = left
                else:
                    del hist[was]  # every count in a histogram stays > 0 (capacity.best_fit_hist)
            if now > 0:
                hist[now] = hist.get(now, 0) + 1
        if new[2]:
            eligible.add(name)
        else:
            eligible.discard(name)
        if new == nothing:
            shares.pop(name, None)
        else:
            shares[name] = new
    names = sorted(eligible) if moved or last is None else last["eligible"]
    memo["premium_supply"] = {
        "idle": idle, "envs": envelopes, "pnodes": pnodes, "shares": shares, "base": base, "batch": batch,
        "eligible": names,
    }  # fmt: skip
    return base, batch, names


def gangs_lent_before(memo: dict[str, Any], memories: Mapping[str, NodeMemory]) -> frozenset[str]:
    """``gangs.lent_before`` from the last call's answer: only the memories that are other objects are read
    again."""
    last = memo.get("gangs_lent_before")
    if last is not None and last[0] is memories:
        out: frozenset[str] = last[1]
        return out
    if last is None:
        out = gangs.lent_before(memories)
    else:
        changed = changed_keys(memories, last[0], memo)
        now = gangs.lent_before({n: memories[n] for n in changed if n in memories})
        out = frozenset({*(n for n in last[1] if n not in changed), *now})
    memo["gangs_lent_before"] = (memories, out)
    return out
