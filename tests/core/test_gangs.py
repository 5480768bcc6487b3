"""Gang widening (core/gangs.py): a training job that idle green nodes cannot hold borrows yellow ones."""

from __future__ import annotations

import dataclasses

import pytest

from core.builders import H100, L40S, Fleet, Runner
from core.builders import tier_params as Params  # the tier rule's mechanisms (builders.TIER_RULE)
from slurm_fleetyield.core import gangs, route
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import (
    Contribution,
    Envelope,
    GpuRisk,
    Health,
    JobView,
    NodeRisk,
    Observations,
    SlurmNode,
    Tier,
    WorkloadClass,
)
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.state import NodeMemory

P, D, B = WorkloadClass.PRETRAIN, WorkloadClass.DECODE, WorkloadClass.BATCH
TRAIN = "fy_ok_train"
SPARE = Params(gangs={"lend_degrading": False})  # degrading yellow nodes are not lent


pytestmark = pytest.mark.usefixtures("tier_rule")  # Runner() runs builders.TIER_RULE


def fleet(green: int = 2, yellow: int = 2, l40s: int = 1) -> Fleet:
    """``green`` healthy H100 nodes g*, ``yellow`` H100 nodes y* with a pending row remap (yellow tier; a
    level, not a counter growing now: lendable), and healthy L40S nodes l*."""
    f = Fleet(0)
    for i in range(green):
        f.add(f"g{i}", H100, gpu_type="h100")
    for i in range(yellow):
        f.add(f"y{i}", H100, gpu_type="h100")
        f.set(f"y{i}", 0, s.REMAP_PENDING, 1)
    for i in range(l40s):
        f.add(f"l{i}", L40S, gpu_type="l40s")
    return f


def pend(f: Fleet, job: int, gpus: int, wl: WorkloadClass = P) -> None:
    f.jobs.append(JobView(job, "PENDING", (), True, wl, gpus))


def trains(r: Runner) -> set[str]:
    assert r.last is not None
    return {n for n, d in r.last.nodes.items() if TRAIN in d.fy_features}


def test_yellow_nodes_get_no_train_feature_while_no_training_job_waits():
    f = fleet()
    pend(f, 1, 8, D)  # decode and batch do not need fy_ok_train
    pend(f, 2, 4, B)
    r = Runner(f)
    r.ticks(3)
    assert r.last is not None and r.last.nodes["y0"].tier is Tier.YELLOW
    assert trains(r) == {"g0", "g1", "l0"}  # green H100s, and the L40S (no NVLink board)


def test_a_waiting_gang_borrows_yellow_nodes_for_its_shortfall_only():
    f = fleet(green=2, yellow=3)
    pend(f, 1, 24)  # 3 whole nodes; 2 idle green premium nodes: short by 1
    r = Runner(f)
    r.tick()
    lent = trains(r) - {"g0", "g1", "l0"}
    assert lent == {"y0"}  # equal risk: by name
    assert r.last is not None
    d = r.last.nodes["y0"]
    assert d.tier is Tier.YELLOW and d.weight == r.last.nodes["y1"].weight  # keeps its yellow weight
    why = "(gang widening: a pending training job needs 3 node(s), 2 fit on idle premium green GPUs; 1 yellow"
    assert why in d.reason
    assert [e.node for e in r.last.events if e.kind == "gang_lend"] == ["y0"]
    assert any(u.nodes == ("y0",) and TRAIN in u.features for u in r.last.plan.of_kind("update"))


def test_busy_green_nodes_are_no_supply_and_the_largest_job_sets_the_need():
    f = fleet(green=2, yellow=3)
    f.jobs.append(JobView(9, "RUNNING", ("g1",), True, D, 2))
    f.slurm_update("g1", states=frozenset({"MIXED"}))
    pend(f, 1, 8)
    pend(f, 2, 32)  # 4 nodes; one green idle: short by 3
    r = Runner(f)
    r.tick()
    assert trains(r) - {"g0", "g1", "l0"} == {"y0", "y1", "y2"}


def test_a_small_training_job_that_fits_on_a_partly_busy_green_node_borrows_nothing():
    f = fleet(green=1, yellow=2)
    f.jobs.append(JobView(9, "RUNNING", ("g0",), True, D, 2))
    f.slurm_update("g0", states=frozenset({"MIXED"}))
    pend(f, 1, 4)  # fits on g0's 6 free GPUs
    r = Runner(f)
    r.tick()
    assert trains(r) & {"y0", "y1"} == set()
    pend(f, 2, 8)  # a whole node: g0 cannot hold it
    r.tick()
    assert trains(r) & {"y0", "y1"} == {"y0"}


def test_the_loan_is_sticky_and_ends_when_no_training_job_waits():
    f = fleet(green=2, yellow=3)
    pend(f, 1, 24)
    r = Runner(f)
    r.tick()
    assert trains(r) & {"y0", "y1", "y2"} == {"y0"}
    f.nodes["y0"].gpus[1].fields[s.REMAP_PENDING] = 1  # y0 now riskier than y1 and y2, still yellow
    r.tick()
    assert r.last is not None and r.last.nodes["y0"].risk > r.last.nodes["y1"].risk
    assert r.last.nodes["y0"].tier is Tier.YELLOW
    assert trains(r) & {"y0", "y1", "y2"} == {"y0"}  # lent last tick: it keeps the loan
    f.jobs.clear()  # the job started elsewhere, or was cancelled
    r.tick()
    assert trains(r) & {"y0", "y1", "y2"} == set()
    assert [e.node for e in r.last.events if e.kind == "gang_return"] == ["y0"]
    assert TRAIN not in r.last.nodes["y0"].fy_features


def test_a_job_without_a_class_counts_unless_switched_off():
    f = fleet(green=0, yellow=1, l40s=0)
    f.jobs.append(JobView(1, "PENDING", (), True, None, 8))  # job_submit: class default -> fy_ok_train
    r = Runner(f)
    r.tick()
    assert trains(r) == {"y0"}
    r = Runner(f, Params(gangs={"unclassified": False}, keep_open={"enabled": False}))
    r.tick()
    assert trains(r) == set()


def test_disabled_lends_nothing():
    f = fleet(green=0, yellow=2)
    pend(f, 1, 16)
    r = Runner(f, Params(gangs={"enabled": False}))
    r.ticks(2)
    assert trains(r) == {"l0"}  # the L40S carries fy_ok_train: nothing needs keeping open


def _node(name: str, tier: Tier, risk: float, **kw: object) -> PricedNode:
    return PricedNode(name, tier, 10, "r", (), True, risk=risk, **kw)  # type: ignore[arg-type]


def _risk(name: str, signal: str = "gpu_repeat_offender") -> NodeRisk:
    """A yellow node's risk: moved by one signal (the default: its fatal history, i.e. repaired)."""
    g = GpuRisk(name, 0, f"{name}-0", "H100", Health.WARN, 0.06, (Contribution(signal, 1.0, 2.5),))
    return NodeRisk(name, Health.WARN, 0.06, (g,))


def _obs(names: list[str], jobs: tuple[JobView, ...]) -> Observations:
    slurm = {n: SlurmNode(n, frozenset({"IDLE"}), "", (), (), 1, "h100", 8) for n in names}
    return Observations(0.0, slurm, {}, (), jobs)


def test_never_lends_red_lemons_rehab_nonpremium_or_broken_nvlink_and_picks_the_lowest_risk():
    prem = Envelope(premium=True, nvlink=True, nvlink_full=True, hbm_full=True)
    nodes = {
        "a-red": _node("a-red", Tier.RED, 0.9),
        "b-lemon": _node("b-lemon", Tier.YELLOW, 0.06, lemon=True),
        "c-probation": _node("c-probation", Tier.PROBATION, 0.06),
        "d-nonpremium": _node("d-nonpremium", Tier.YELLOW, 0.06),
        "e-nvlink": _node("e-nvlink", Tier.YELLOW, 0.06),
        "f-dark": _node("f-dark", Tier.UNKNOWN, float("nan"), keep_fy=("fy_tier_yellow",)),
        "g-risky": _node("g-risky", Tier.YELLOW, 0.2),
        "h-safe": _node("h-safe", Tier.YELLOW, 0.07),
        "i-safer": _node("i-safer", Tier.YELLOW, 0.06),
        "j-degrading": _node("j-degrading", Tier.YELLOW, 0.05),
    }
    risks = {n: _risk(n) for n in nodes}
    risks["j-degrading"] = _risk("j-degrading", "remap_growth")  # rows remapped within the window: degrading
    risks["i-safer"] = _risk("i-safer", "remap_pending")  # a level (rows pending a reset): lendable
    envs = dict.fromkeys(nodes, prem)
    envs["d-nonpremium"] = Envelope(premium=False, nvlink=True, nvlink_full=True, hbm_full=True)
    envs["e-nvlink"] = Envelope(premium=True, nvlink=True, nvlink_full=False, hbm_full=True)
    obs = _obs(list(nodes), (JobView(1, "PENDING", (), True, P, 16),))
    got = gangs.widen(obs, Priced(nodes), envs, risks, {}, Params(), 0.0)
    assert got.need_nodes == 2 and got.fitting_nodes == 0
    assert got.lent == {"j-degrading", "i-safer"}  # the two lowest risks (the default lends degrading ones)
    spare = gangs.widen(obs, Priced(nodes), envs, risks, {}, SPARE, 0.0)
    assert spare.lent == {"i-safer", "h-safe"}  # not j-degrading: rows remapped just now
    no_risk = {n: r for n, r in risks.items() if n != "i-safer"}  # no risk known: treated as degrading
    assert gangs.widen(obs, Priced(nodes), envs, no_risk, {}, SPARE, 0.0).lent == {"h-safe", "g-risky"}
    assert (
        gangs.widen(obs, Priced(nodes), envs, risks, {}, Params(gangs={"enabled": False}), 0.0).lent == set()
    )
    # a non-premium-needing class borrows from every node, premium or not
    wide = Params(settle={"premium_needing_classes": ("finetune",)})
    assert "d-nonpremium" in gangs.widen(obs, Priced(nodes), envs, risks, {}, wide, 0.0).lent
    # the node lent last tick (remembered yellow with fy_ok_train) keeps its loan before a safer one
    before = {"g-risky": NodeMemory(Tier.YELLOW, 0.0, "r", fy_features=("fy_ok_batch", TRAIN))}
    sticky = gangs.widen(obs, Priced(nodes), envs, risks, before, Params(), 0.0)
    assert sticky.lent == {"g-risky", "j-degrading"} and not [e for e in sticky.events if e.node == "g-risky"]


def test_route_carry_follows_the_loan():
    f = fleet(green=0, yellow=1, l40s=0)
    r = Runner(f, Params(keep_open={"enabled": False}))  # else y0 carries fy_ok_train already (keep open)
    r.tick()
    assert r.last is not None and r.last.sensed is not None
    obs = f.observe(r.now)
    from slurm_fleetyield.core import carry_place, price, profile
    from slurm_fleetyield.core.quarantine import Drains

    envs = profile.profile(r.last.sensed, obs, r.params.profile)
    priced = price.price(obs, r.last.sensed, r.last.risks, envs, Drains(), r.state, r.params, r.now)
    plain, _ = carry_place.route(r.state, obs, priced, envs, service=False, reserve=True)
    lent, updates = carry_place.route(
        r.state,
        obs,
        priced,
        envs,
        service=False,
        reserve=True,
        train_lent=frozenset({"y0"}),
        train_reason="x",
    )
    assert TRAIN not in plain["y0"].fy_features and TRAIN in lent["y0"].fy_features
    assert "(gang widening: x)" in lent["y0"].reason and updates
    again, _ = carry_place.route(r.state, obs, priced, envs, service=False, reserve=True)
    assert again["y0"] == plain["y0"]
    assert (again, _) == route.route(obs, priced, envs, service=False, reserve=True)  # the rule, node by node
    for tier in Tier:  # only a yellow node can be lent the feature
        has = TRAIN in route.fy_features(
            tier, Envelope(premium=True, nvlink=True, nvlink_full=True), False, False, True
        )
        assert has is (tier in (Tier.GREEN, Tier.YELLOW))


def test_an_unknown_class_is_a_clear_config_error():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"unknown workload class 'training' in gangs\.classes"):
        Params(gangs={"classes": ("training",)})
    assert Params(gangs={"classes": ("pretrain", "finetune")}).gangs.classes == ("pretrain", "finetune")


def test_with_lend_degrading_off_a_repaired_yellow_node_is_lent_a_degrading_one_is_not():
    """Both yellow; r0 through its fatal history only (one fault 5 days ago, repaired: the decaying
    repeat-offender signal), d0 because its correctable remapped rows grow (degrading now). The default
    lends both."""
    from dataclasses import replace

    f = Fleet(0)
    for n in ("r0", "d0"):
        f.add(n, H100, gpu_type="h100")
    pend(f, 1, 16)  # two whole nodes, no green one
    r = Runner(f, SPARE)
    r.tick()
    uuid = f.nodes["r0"].gpus[0].uuid
    repaired = NodeMemory(Tier.GREEN, r.now, "r", fatal_history=((r.now - 5 * 86_400.0, uuid),))
    r.state = replace(r.state, nodes={**r.state.nodes, "r0": repaired})
    f.set("d0", 0, s.ROWS_CORR, 3)  # three rows remapped since the last sample
    r.tick()
    assert r.last is not None
    assert {n: r.last.nodes[n].tier for n in ("r0", "d0")} == {"r0": Tier.YELLOW, "d0": Tier.YELLOW}
    moved = {c.signal for g in r.last.risks["r0"].gpus for c in g.contributions}
    assert moved == {"gpu_repeat_offender", "node_repeat_offender"}
    assert "remap_growth" in {c.signal for g in r.last.risks["d0"].gpus for c in g.contributions}
    assert trains(r) == {"r0"}
    assert "1 yellow lent" in r.last.nodes["r0"].reason
    lend = Runner(f)
    lend.state, lend.now, lend.last = r.state, r.now, r.last
    lend.tick()
    assert trains(lend) == {"r0", "d0"}


def test_the_lowest_risk_yellow_node_is_lent_even_while_busy():
    """Deliberate (8898c74 tried the opposite and was reverted, docs/results.md "Gang widening"): the loan
    goes to the lowest-risk yellow node, busy or not, and the gang starts when it frees up, rather than on
    an idle, riskier one (in a fleet where repaired GPUs fail again, often the one just back from repair)."""
    from dataclasses import replace

    prem = Envelope(premium=True, nvlink=True, nvlink_full=True, hbm_full=True)
    nodes = {n: _node(n, Tier.YELLOW, r) for n, r in (("y0", 0.05), ("y1", 0.07))}
    envs = dict.fromkeys(nodes, prem)
    running = (JobView(7, "RUNNING", ("y0",), True, B, 8),)
    obs = _obs(list(nodes), (JobView(1, "PENDING", (), True, P, 8), *running))
    states = {"y0": frozenset({"ALLOCATED"}), "y1": frozenset({"IDLE"})}
    obs = Observations(0.0, {n: replace(s, states=states[n]) for n, s in obs.slurm.items()}, {}, (), obs.jobs)
    got = gangs.widen(obs, Priced(nodes), envs, {n: _risk(n) for n in nodes}, {}, Params(), 0.0)
    assert got.lent == {"y0"} and got.need_nodes == 1


def test_lent_before_from_last_tick_equals_a_fresh_scan() -> None:
    """``carry_place.gangs_lent_before`` from last tick's answer (reading again only memories that are other
    objects) equals a scan of every memory, tick after tick, as nodes come, go and change tier or features."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from slurm_fleetyield.core.carry_place import gangs_lent_before
    from slurm_fleetyield.core.gangs import OK_TRAIN, lent_before
    from slurm_fleetyield.core.model import Tier
    from slurm_fleetyield.core.state import NodeMemory

    kinds = [
        NodeMemory(tier, 0.0, "", fy_features=fy)
        for tier in (Tier.GREEN, Tier.YELLOW)
        for fy in ((), (OK_TRAIN,), ("fy_tier_yellow", OK_TRAIN))
    ]
    # per node: which memory, and whether it is a copy (another object of equal value) or the shared one
    names = st.sampled_from(["a", "b", "c", "d"])
    step = st.dictionaries(names, st.tuples(st.sampled_from(kinds), st.booleans()))

    @settings(max_examples=200, deadline=None)
    @given(st.lists(step, min_size=1, max_size=8))
    def check(steps: list[dict[str, tuple[NodeMemory, bool]]]) -> None:
        memo: dict[str, object] = {}
        for picks in steps:
            memories = {n: dataclasses.replace(m) if copy else m for n, (m, copy) in picks.items()}
            assert gangs_lent_before(memo, memories) == lent_before(memories)  # type: ignore[arg-type]

    check()
