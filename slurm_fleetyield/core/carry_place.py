"""What the placing stages carry from last tick (core/carry.py says how): price, route, premium supply
and gang loans.

Input: this tick's inputs of a stage and ``ControllerState.memo`` (last tick's inputs and answer, kept from
tick to tick, never persisted). Output: the stage's answer, equal to the stage's rule applied to every node
(tests/sim/test_reuse.py, tests/core/test_premium.py and tests/core/test_gangs.py check it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from inspect import signature
from typing import Any

from slurm_fleetyield.core import gangs
from slurm_fleetyield.core import price as price_stage
from slurm_fleetyield.core import route as route_stage
from slurm_fleetyield.core.model import Envelope, NodeDecision, NodeRisk, Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import UpdateNodes
from slurm_fleetyield.core.premium_supply import share
from slurm_fleetyield.core.price import priced_memory, priced_slurm
from slurm_fleetyield.core.quarantine import Drains
from slurm_fleetyield.core.rehab import Rehab
from slurm_fleetyield.core.sense import Sensed
from slurm_fleetyield.core.state import (
    ControllerState,
    NodeMemory,
    changed_keys,
    note_changes,
    slurm_view,
)


def price(
    obs: Observations,
    sensed: Sensed,
    risks: Mapping[str, NodeRisk],
    envelopes: Mapping[str, Envelope],
    drains: Drains,
    state: ControllerState,
    params: Params,
    now: float,
    rh: Rehab,
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
    lifecycle, extra_drains = rh.lifecycle, rh.drains  # this tick's lifecycle memories and drains
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
    pos = last["pos"] if base is not None and last is not None else {n: i for i, n in enumerate(keys)}
    logged = frozenset(e.node for e in got.events)
    memo["price_last"] = {
        "keys": keys, "pos": pos, "inputs": inputs, "params": params, "m": m, "out": out,
        "reds": frozenset(reds), "special": special, "logged": logged, "lemons": frozenset(got.lemons),
    }  # fmt: skip
    note_changes(memo, "price", out, base, todo or ())
    # last tick's lemons are priced again every tick (_price_todo): this call's are all of them
    return price_stage.Priced(out, got.events, tuple(sorted(reds)), got.lemons)


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


_LOAN_ARGS = tuple(signature(route_stage.loans).parameters)  # the arguments of route's that name loans


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
    loans = route_stage.loans(**{k: how[k] for k in _LOAN_ARGS if k in how})
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
