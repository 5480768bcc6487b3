"""Reusing unchanged nodes' results (``ControllerState.memo``, ``NodeHistory.quiet``) changes no decision.

One observation stream is recorded from a simulated fleet with faults and precursor episodes (the simulator
hands the core the very same reading objects for GPUs whose latent state did not change, which is what the
reuse keys on). It is replayed through ``tick`` twice: as recorded (reuse on) and with every sample rebuilt
from copies of its readings and the memo dropped before every tick (reuse impossible). Plans, decisions,
risks, sensed nodes, events and states must be equal tick by tick, and the first replay must really have
reused results (or the comparison would prove nothing).
"""

from __future__ import annotations

import copy
import random
from dataclasses import replace

from sim.fleets import fault_heavy
from slurm_fleetyield.core import carry, carry_place, memory
from slurm_fleetyield.core.loop import TickResult, tick
from slurm_fleetyield.core.model import Observations
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.rehab import Rehab
from slurm_fleetyield.core.state import ControllerState, changed_keys
from slurm_fleetyield.sim import runner


def _record() -> list[Observations]:
    sim = fault_heavy(nodes=10, days=4, seed=5)
    seen: list[Observations] = []
    original = runner.tick

    def spy(state, obs, params, now, rng):  # type: ignore[no-untyped-def]
        seen.append(replace(obs, slurm=dict(obs.slurm)))  # the simulator updates its Slurm view in place
        return original(state, obs, params, now, rng)

    runner.tick = spy  # type: ignore[assignment]
    try:
        sim.run()
    finally:
        runner.tick = original  # type: ignore[assignment]
    assert any(o.fatal_events for o in seen), "the stream must contain pushed fatal events"
    return seen


def _retyped(stream: list[Observations]) -> list[Observations]:
    """From the middle of the stream on, Slurm reports another GPU type for one node (re-imaged with other
    GPUs): only its Slurm view changes, which the envelope (premium or not) reads."""
    premium = [m.lower() for m in Params().profile.premium_gpu_models]

    def is_premium(t: str | None) -> bool:
        return any(m in (t or "").lower() for m in premium)

    views = sorted(stream[-1].slurm.items())
    name = next(n for n, v in views if not is_premium(v.gpu_type))  # becomes premium by its GPU type
    other = next(v.gpu_type for _, v in views if is_premium(v.gpu_type))
    half = len(stream) // 2
    return stream[:half] + [
        replace(o, slurm={**o.slurm, name: replace(o.slurm[name], gpu_type=other)}) if name in o.slurm else o
        for o in stream[half:]
    ]


def _fresh(obs: Observations) -> Observations:
    samples = {n: replace(s, gpus=tuple(copy.deepcopy(g) for g in s.gpus)) for n, s in obs.samples.items()}
    return replace(obs, samples=samples)


def _spy_todo(monkeypatch, module, names_of, attr="_todo"):  # type: ignore[no-untyped-def]
    """Wrap ``module._todo`` (or ``attr``; its second argument holds the node names, read by ``names_of``):
    the list it returns gets (nodes listed, nodes in all) for every call that started from last tick's
    answer."""
    seen: list[tuple[int, int]] = []
    inner = getattr(module, attr)

    def spy(last, second, *args):  # type: ignore[no-untyped-def]
        todo = inner(last, second, *args)
        if todo is not None:
            names = set(names_of(second))
            seen.append((len(todo & names), len(names)))
        return todo

    monkeypatch.setattr(module, attr, spy)
    return seen


def _replay(stream: list[Observations], params: Params) -> TickResult:
    """Tick through ``stream`` from an empty state; the last tick's result."""
    state = ControllerState.empty()
    rng = random.Random(1)
    r = None
    for obs in stream:
        r = tick(state, obs, params, obs.time, rng)
        state = r.state
    assert r is not None
    return r


def test_reused_results_equal_recomputed_ones(monkeypatch) -> None:  # type: ignore[no-untyped-def]

    stream = _retyped(_record())
    params = Params()
    carried = []  # (nodes that may be assessed, nodes in all) of each risk stage that carried its answer
    inner = carry._risk_todo

    def spy(sensed, *args):  # type: ignore[no-untyped-def]
        todo = inner(sensed, *args)
        if todo is not None:
            carried.append((len(todo[0] | todo[1]), len(sensed.nodes)))
        return todo

    monkeypatch.setattr(carry, "_risk_todo", spy)
    from slurm_fleetyield.core import profile, route

    # (nodes done again, nodes in all) of each call of a stage that started from last tick's answer
    priced_again = _spy_todo(monkeypatch, carry_place, lambda keys: keys, "_price_todo")
    routed_again: list[tuple[int, int]] = []  # the carry routes only the nodes whose inputs changed
    inner_decide = route.decide

    def spy_decide(obs, *args, names=None, **kw):  # type: ignore[no-untyped-def]
        if names is not None:
            names = list(names)
            routed_again.append((len(names), len(obs.slurm)))
        return inner_decide(obs, *args, names=names, **kw)

    monkeypatch.setattr(route, "decide", spy_decide)
    profiled_again: list[tuple[int, int]] = []  # the loop profiles only the nodes whose inputs changed
    inner_profile = profile.profile

    def spy_profile(sensed, obs, pp, names=None):  # type: ignore[no-untyped-def]
        if names is not None:
            names = list(names)
            profiled_again.append((len(names), len(sensed.nodes)))
        return inner_profile(sensed, obs, pp, names)

    monkeypatch.setattr(profile, "profile", spy_profile)
    remembered_again: list[tuple[int, int]] = []  # the carry remembers only the nodes whose inputs changed
    inner_remember = memory.remember_nodes

    def spy_remember(state, sensed, decisions, *args):  # type: ignore[no-untyped-def]
        got = inner_remember(state, sensed, decisions, *args)
        if args[-1] is not state.memo["remember_names"].get("names"):
            remembered_again.append((len(got), len({*decisions, *sensed.nodes})))
        return got

    monkeypatch.setattr(memory, "remember_nodes", spy_remember)
    a, b = ControllerState.empty(), ControllerState.empty()
    rng_a, rng_b = random.Random(1), random.Random(1)
    reused = 0
    noted: dict[str, int] = {}  # ticks on which each stage noted its changes for the next stages
    # price carries a node's very answer, route leaves a reused node's memo entry as it was; remember keeps
    # a reused node's very memory
    stage_reused = {"price": 0, "route": 0, "remember": 0}
    for i, obs in enumerate(stream):
        before = dict(a.memo.get("risk_last", {}).get("out", {}))
        entries = {
            "price": dict(a.memo.get("price_last", {}).get("out", {})),
            "route": dict(a.memo.get("route_last", {}).get("out", {})),
        }
        ra = tick(a, obs, params, obs.time, rng_a)
        reused += sum(1 for n, r in ra.risks.items() if before.get(n) is r)
        now_entries = {
            "price": ra.state.memo["price_last"]["out"],
            "route": ra.state.memo["route_last"]["out"],
        }
        for k, old in entries.items():
            stage_reused[k] += sum(1 for n, e in now_entries[k].items() if old.get(n) is e)
        stage_reused["remember"] += sum(1 for n, m in ra.state.nodes.items() if a.nodes.get(n) is m)
        rb = tick(replace(b, memo={}), _fresh(obs), params, obs.time, rng_b)
        assert ra.plan == rb.plan, f"tick {i}: plans differ"
        assert dict(ra.nodes) == dict(rb.nodes), f"tick {i}: decisions differ"
        assert dict(ra.risks) == dict(rb.risks), f"tick {i}: risks differ"
        assert ra.sensed is not None and rb.sensed is not None
        assert dict(ra.sensed.nodes) == dict(rb.sensed.nodes), f"tick {i}: sensed nodes differ"
        assert ra.events == rb.events, f"tick {i}: events differ"
        assert ra.state == rb.state, f"tick {i}: states differ"
        assert ra.state.to_dict() == rb.state.to_dict(), f"tick {i}: persisted states differ"
        for stage, (new, old, keys) in ra.state.memo.get("changes", {}).items():
            # a stage's note is the very diff a consumer would have found (state.note_changes)
            assert set(keys) == changed_keys(new, old), f"tick {i}: {stage}'s noted changes"
            noted[stage] = noted.get(stage, 0) + 1
        a, b = ra.state, rb.state
    assert reused > len(stream), "the recorded stream must exercise the reuse"
    for stage in ("slurm", "risk", "profile", "price", "route", "remember"):
        assert noted.get(stage, 0) > len(stream) // 2, f"{stage} noted its changes on too few ticks: {noted}"
    # risk carried last tick's answer on most ticks, assessing only some of the nodes again
    assert len(carried) > len(stream) // 2 and any(k < n for k, n in carried), carried[:5]
    # so did price, route, profile and remember
    assert len(priced_again) > len(stream) // 2 and any(k < n for k, n in priced_again), priced_again[:5]
    assert len(routed_again) > len(stream) // 2 and any(k < n for k, n in routed_again), routed_again[:5]
    assert len(profiled_again) > len(stream) // 2 and any(k < n for k, n in profiled_again)
    assert len(remembered_again) > len(stream) // 2 and any(k < n for k, n in remembered_again)
    for k, n in stage_reused.items():
        assert n > len(stream), f"the recorded stream must exercise the {k} reuse ({n})"


def test_risk_follows_fatal_history_and_params() -> None:
    """The same readings, but a fatal history that changed (or other params) between two ticks: the risk
    carried from last tick follows them, equal to a tick from an empty memo."""
    from slurm_fleetyield.core import risk
    from slurm_fleetyield.core.state import NodeMemory

    stream = _record()[:7]
    params = Params()
    r = _replay(stream[:6], params)
    state = r.state
    obs, now = stream[6], stream[6].time
    assert risk.assess(r.sensed, (), state, params, now) == risk.assess(r.sensed, (), state, params, now)
    first = tick(state, obs, params, now, random.Random(2)).risks
    name = next(n for n in first if first[n].gpus)
    uuid = first[name].gpus[0].uuid
    old = state.nodes[name]
    assert isinstance(old, NodeMemory)
    hist = (*old.fatal_history, (now - 60.0, uuid), (now - 30.0, uuid + "x"))
    strict = Params(risk={"red_threshold": 0.01, "yellow_threshold": 0.001})
    for history, pa in ((hist, params), (None, strict)):
        st = _replay(stream[:6], params).state  # the memo follows one line of ticks: a fresh one per branch
        if history is not None:
            st = replace(st, nodes={**st.nodes, name: replace(st.nodes[name], fatal_history=history)})
        got = tick(st, obs, pa, now, random.Random(2))
        want = tick(replace(st, memo={}), _fresh(obs), pa, now, random.Random(2))
        assert dict(got.risks) == dict(want.risks) and got.plan == want.plan
        assert dict(got.risks) != dict(first)
        if history is not None:
            assert got.risks[name] != first[name]


def test_risk_follows_the_learned_multipliers(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """When only the signals' learned multipliers move between two ticks, risk starts from last tick's
    answer and scores again only the nodes that read one, which equals a fresh tick; a new base multiplier
    moves every quiet GPU: the nodes whose GPUs all sat at the old base are put at the new one, the rest
    scored again, which equals a fresh tick too."""

    stream = _record()
    params = Params()
    r = _replay(stream[:8], params)
    scored = [n for n, nr in r.risks.items() if any(g.contributions for g in nr.gpus)]
    assert scored, "the fault-heavy stream must leave nodes with signals"
    # a GPU's multiplier is its dominant signal's (the largest contribution)
    gpu = next(g for g in r.risks[scored[0]].gpus if g.contributions)
    signal = max(gpu.contributions, key=lambda c: c.weight).signal
    starts: list[bool] = []
    inner = carry._risk_todo

    def spy(*args):  # type: ignore[no-untyped-def]
        got = inner(*args)
        starts.append(got is not None)
        return got

    monkeypatch.setattr(carry, "_risk_todo", spy)
    obs = stream[8]
    before = tick(r.state, obs, params, obs.time, random.Random(2))
    carried = [starts[-1]]
    quiet = next(n for n, nr in r.risks.items() if nr.gpus and not any(g.contributions for g in nr.gpus))
    for mult in ({signal: 3.0}, {signal: 3.0, "base": 2.0}, {"base": 0.5}):
        r = _replay(stream[:8], params)  # the memo follows one line of ticks: a fresh one per branch
        learned = replace(r.state.learn, multipliers={**r.state.learn.multipliers, **mult})
        state = replace(r.state, learn=learned)
        got = tick(state, obs, params, obs.time, random.Random(2))
        carried.append(starts[-1])
        want = tick(replace(state, memo={}), _fresh(obs), params, obs.time, random.Random(2))
        assert dict(got.risks) == dict(want.risks) and got.plan == want.plan
        if signal in mult:
            assert got.risks[scored[0]] != before.risks[scored[0]]
        if "base" in mult:
            assert got.risks[quiet].probability != before.risks[quiet].probability
    # unchanged: carried; a signal's multiplier moved: carried too; the base moved: carried and rebased
    assert carried == [True, True, True, True], carried


def test_price_route_remember_reuse_follows_their_inputs() -> None:
    """Price, route and remember reuse a node's result for the very same inputs, and recompute it when the
    last memory, the drains or the loan changed (compared with the same call on an empty memo)."""
    from slurm_fleetyield.core import price, profile, route
    from slurm_fleetyield.core.model import Tier
    from slurm_fleetyield.core.plan import DrainNode, Hold
    from slurm_fleetyield.core.quarantine import Drains

    stream = _record()[:6]
    params = Params()
    r = _replay(stream, params)
    state = r.state
    obs, now, sensed = stream[-1], stream[-1].time, r.sensed
    assert sensed is not None
    envs = state.memo["profile_last"]["out"]  # the tick's very envelopes (the loop carries them)
    assert envs == profile.profile(sensed, obs, params.profile)
    none = Drains()

    def priced(st: ControllerState, risks=r.risks, drains=none):  # type: ignore[no-untyped-def]
        got = carry_place.price(obs, sensed, risks, envs, drains, st, params, now, Rehab(st.lifecycle))
        want = price.price(obs, sensed, risks, envs, drains, st, params, now)  # the rule, node by node
        assert repr(got) == repr(want)  # repr: an unknown node's risk is NaN
        return got

    before = state.memo["price_last"]["out"]
    p1 = priced(state)
    assert any(p1.nodes[n] is before[n] for n in p1.nodes), "last tick's very answer, carried"
    name = next(n for n, pn in p1.nodes.items() if pn.tier is Tier.GREEN and pn.managed)
    old = state.nodes[name]
    yellow = replace(state, nodes={**state.nodes, name: replace(old, tier=Tier.YELLOW)})
    assert priced(yellow).events
    assert priced(yellow).events, "a node whose pricing logged an event is priced again, event and all"
    # a lemon verdict moves with time alone: the same inputs an hour after the window hold no lemon (price
    # prices last tick's lemons again; remember's fatal-history index in the memo or not changes nothing)
    for index in (True, False):
        _lemon_follows_time(obs, sensed, r.risks, envs, state, params, now, name, index)
    dark = {n: v for n, v in r.risks.items() if n != name}  # no risk: UNKNOWN, keeps the last weight
    priced(state, dark)
    heavier = replace(state, nodes={**state.nodes, name: replace(old, weight=12_345)})
    assert priced(heavier, dark).nodes[name].weight == 12_345
    assert priced(state).nodes[name] is priced(state).nodes[name]  # the memo holds the same inputs again
    other = replace(obs.slurm[name], states=frozenset({"IDLE", "DRAIN"}), reason="admin: cabling")
    lc = state.lifecycle
    by_admin = carry_place.price(replace(obs, slurm={**obs.slurm, name: other}), sensed, r.risks, envs, none,
                           state, params, now, Rehab(lc))  # fmt: skip
    assert not by_admin.nodes[name].managed, "a Slurm view drained by someone else is priced anew"
    views = dict(obs.slurm)  # a shell that updates one Slurm mapping in place, as the simulator does
    in_place = replace(obs, slurm=views)
    assert (
        carry_place.price(in_place, sensed, r.risks, envs, none, state, params, now, Rehab(lc))
        .nodes[name]
        .managed
    )
    views[name] = other  # between two ticks: the next tick's Observations holds the very same mapping
    again = carry_place.price(replace(in_place), sensed, r.risks, envs, none, state, params, now, Rehab(lc))
    assert not again.nodes[name].managed, "the same mapping, updated in place, is priced anew too"
    drained = Drains(drains=(DrainNode(name, "fleetyield: test drain"),))
    assert priced(state, drains=drained).nodes[name].tier is Tier.QUARANTINED
    hold = Hold(name, "drain", "drain_cap", "test hold")  # one Hold object, fenced or not: priced apart
    kept = priced(state, drains=Drains(held={name: hold}))
    fenced = priced(state, drains=Drains(held={name: hold}, fenced=frozenset({name})))
    assert any(f.startswith("fy_ok_") for f in kept.nodes[name].keep_fy or ())
    assert not any(f.startswith("fy_ok_") for f in fenced.nodes[name].keep_fy or ())

    def routed(lent: frozenset[str], why: str = ""):  # type: ignore[no-untyped-def]
        got = carry_place.route(state, obs, p1, envs, lent=lent, lent_reason=why)
        assert got == route.route(obs, p1, envs, lent, why)  # the rule, node by node
        return got

    d1, _ = routed(frozenset())
    d2, _ = routed(frozenset())
    assert all(d2[n] is d1[n] for n in d1)
    assert "lent" in routed(frozenset({name}), "a")[0][name].reason
    assert "(premium widening: b)" in routed(frozenset({name}), "b")[0][name].reason
    assert d1[name] is r.nodes[name]  # the tick's own decision: its remembered memory is reusable
    views = dict(obs.slurm)  # a Slurm mapping updated in place between two calls, as the simulator does
    in_place = replace(obs, slurm=views)
    carry_place.route(state, in_place, p1, envs)
    views[name] = replace(views[name], states=frozenset({"ALLOCATED"}), weight=7)  # the next tick
    in_place = replace(in_place)  # its Observations: the very same mapping, updated in place
    moved, updates = carry_place.route(state, in_place, p1, envs)
    assert (moved, updates) == route.route(in_place, p1, envs)
    assert moved[name].slurm_state == "ALLOCATED" and any(name in u.nodes for u in updates)

    def remembered(drains: Drains) -> ControllerState:
        got = carry.remember(state, sensed, d1, p1, (), drains, params, now, Rehab({}))
        assert got == memory.remember(
            state, sensed, d1, p1, (), drains, params, now
        )  # the rule, node by node
        return got

    assert remembered(none).nodes[name] is state.nodes[name]  # reused: same sample time
    assert remembered(drained).nodes[name].drained_by_us


def _lemon_follows_time(obs, sensed, risks, envs, state, params, now, name, index):  # type: ignore[no-untyped-def]
    """Price a node whose only changing input is time, as its lemon verdict ends, with and without
    remember's fatal-history index in the memo (price carries its own lemons); each call equals the same
    call on an empty memo."""
    from slurm_fleetyield.core import price
    from slurm_fleetyield.core.quarantine import Drains

    none = Drains()
    lp = params.learn
    old = state.nodes[name]
    failures = tuple((now - 7200.0 * k, "GPU-x") for k in range(lp.lemon_failures, 0, -1))  # 2 h apart
    nodes = {**state.nodes, name: replace(old, fatal_history=failures)}
    lemony = replace(state, nodes=nodes, memo=dict(state.memo))
    if index:  # as memory.remember indexes the nodes it hands on: the fatal-history nodes, by name
        lemony.memo["fatal_history_index"] = (
            nodes,
            frozenset(n for n, m in nodes.items() if m.fatal_history),
        )
    lemons = []
    oldest = 7200.0 * lp.lemon_failures  # the verdict ends when the oldest failure leaves the window
    for t in (now, now + lp.lemon_window_s - oldest - 3600.0, now + lp.lemon_window_s - oldest + 3600.0):
        got = carry_place.price(obs, sensed, risks, envs, none, lemony, params, t, Rehab(lemony.lifecycle))
        want = price.price(obs, sensed, risks, envs, none, lemony, params, t)  # the rule, node by node
        assert repr(got) == repr(want), t
        lemons.append(got.nodes[name].lemon)
    assert lemons == [True, True, False], lemons


def test_remember_from_last_tick_follows_its_inputs() -> None:
    """remember starting from last tick's memories (``carry.remember``) equals the per-node rule when the
    decisions and priced nodes are the very same objects but a drain, acted-on fatal evidence, last tick's
    drain or the passing of time (fatal history leaving its window) changes a memory."""
    from slurm_fleetyield.core.plan import DrainNode
    from slurm_fleetyield.core.price import Priced
    from slurm_fleetyield.core.quarantine import Drains, Fatal

    stream = _record()
    params = Params()
    r = _replay(stream, params)
    assert r.sensed is not None
    state, sensed, now = r.state, r.sensed, stream[-1].time
    last = state.memo["remember_last"]
    assert last["out"] is state.nodes
    decisions, priced = last["decisions"], Priced(last["pnodes"])
    carried: list[int] = []
    inner = memory.remember_nodes

    def call(st: ControllerState, drains: Drains, t: float) -> ControllerState:
        calls: list[int] = []  # nodes remembered again by the carry; -1: every node

        def spy(*args):  # type: ignore[no-untyped-def]
            got = inner(*args)
            calls.append(-1 if args[-1] is st.memo["remember_names"].get("names") else len(got))
            return got

        memory.remember_nodes = spy  # type: ignore[assignment]
        try:
            got = carry.remember(st, sensed, decisions, priced, (), drains, params, t, Rehab({}))
        finally:
            memory.remember_nodes = inner  # type: ignore[assignment]
        carried.append(calls[0])
        want = memory.remember(st, sensed, decisions, priced, (), drains, params, t)  # the rule, node by node
        assert got == want and list(got.nodes) == list(want.nodes)
        return replace(got, memo=st.memo)  # as the loop hands the memo on

    name = next(n for n, d in decisions.items() if d.managed and not state.nodes[n].fatal_history)
    call(replace(state, memo=dict(state.memo)), Drains(), now)
    drain = DrainNode(name, "fleetyield: test drain")
    drained = call(replace(state, memo=dict(state.memo)), Drains(drains=(drain,)), now)
    assert drained.nodes[name].drained_by_us
    after = call(drained, Drains(), now + 60.0)  # the drained node was not memoized: remembered again
    assert after.nodes[name] == call(replace(state, memo=dict(state.memo)), Drains(), now + 60.0).nodes[name]
    fatal = Fatal(name, now, "xid", f"test:{name}", "push", 0, "GPU-test", 79)
    acted = call(replace(state, memo=dict(state.memo)), Drains(processed=(fatal,)), now)
    assert acted.nodes[name].fatal_history[-1] == (now, "GPU-test")
    history = [n for n, m in state.nodes.items() if m.fatal_history]
    assert history, "the fault-heavy stream must leave a fatal history"
    later = now + params.risk.fatal_history_days * 86_400.0 + 1.0  # every report has left the window
    aged = call(replace(state, memo=dict(state.memo)), Drains(), later)
    assert all(not aged.nodes[n].fatal_history for n in history)
    # none due before its earliest report leaves the window: carried, as the memories are unchanged
    assert call(replace(state, memo=dict(state.memo)), Drains(), now + 60.0).nodes == state.nodes
    assert all(k >= 0 for k in carried), f"every call must start from last tick's memories: {carried}"
