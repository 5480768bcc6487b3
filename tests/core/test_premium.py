"""Premium widening (core/premium.py) through ``tick``: decode borrows premium nodes only when stuck."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.builders import Fleet, Runner, mixed_fleet
from core.builders import tier_params as Params  # the tier rule's mechanisms (builders.TIER_RULE)
from slurm_fleetyield.core.model import Envelope, JobView, Observations, SlurmNode, Tier, WorkloadClass
from slurm_fleetyield.core.premium import best_fit, decode_eligible, out_of_service, widen
from slurm_fleetyield.core.premium_supply import decode_home as _decode_home
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.state import ControllerState, PremiumMemory

D, P = WorkloadClass.DECODE, WorkloadClass.PRETRAIN


pytestmark = pytest.mark.usefixtures("tier_rule")  # Runner() runs builders.TIER_RULE


def fleet(h: int = 4, l: int = 1) -> Fleet:  # noqa: E741
    return mixed_fleet(h, l)


def busy(f: Fleet, node: str, job: int, gpus: int = 8, wl: WorkloadClass = D) -> None:
    f.jobs.append(JobView(job, "RUNNING", (node,), True, wl, gpus))
    f.slurm_update(node, states=frozenset({"ALLOCATED" if gpus >= 8 else "MIXED"}))


def pend(f: Fleet, job: int, gpus: int, wl: WorkloadClass = D) -> None:
    f.jobs.append(JobView(job, "PENDING", (), True, wl, gpus))


def lent(r: Runner) -> set[str]:
    assert r.last is not None
    return {n for n, d in r.last.nodes.items() if "fy_ok_decode" in d.fy_features and d.envelope.premium}


def run(f: Fleet, ticks: int, step: float = 120.0, params: Params | None = None) -> Runner:
    r = Runner(f, params, step=step)
    r.ticks(ticks)
    return r


def test_no_lending_while_decode_fits_on_nonpremium():
    f = fleet()
    pend(f, 1, 4)  # l0 is idle: fits, the next scheduling pass places it
    assert lent(run(f, 10)) == set()


def test_all_premium_fleet_keeps_decode_open_on_one_node():
    """No non-premium node: without a loan no node carries fy_ok_decode and Slurm would refuse every decode
    submission outright, so one premium node is lent with no decode waiting; never beyond the reserve."""
    f = fleet(h=4, l=0)
    r = run(f, 2)
    assert len(lent(r)) == 1
    (node,) = lent(r)
    assert "decode jobs are accepted" in r.last.nodes[node].reason
    r.ticks(3)
    assert lent(r) == {node}  # sticky
    off = Params(premium={"keep_decode_open": False})
    assert lent(run(fleet(h=4, l=0), 2, params=off)) == set()
    alone = Params(premium={"reserve_nodes": 4})
    assert lent(run(fleet(h=4, l=0), 2, params=alone)) == set()  # the reserve wins


def test_decode_home_back_returns_the_open_loan():
    f = fleet(h=2, l=1)
    f.drain_by_admin("l0")  # the only non-premium node is out: decode has no home
    r = run(f, 2)
    assert len(lent(r)) == 1
    f.slurm_update("l0", states=frozenset({"IDLE"}), reason="")
    r.tick()
    assert lent(r) == set()  # decode never waited: nothing holds the loan once l0 is back


def test_stuck_decode_borrows_one_premium_node_after_lend_after_s_and_keeps_a_reserve():
    f = fleet(h=4)
    busy(f, "l0", 100)
    for j in range(1, 30):
        pend(f, j, 8)  # far more than the premium nodes could hold
    r = Runner(f, step=120.0)
    r.tick()
    assert lent(r) == set()  # not yet: decode must wait lend_after_s (300 s)
    r.ticks(3)
    assert len(lent(r)) == 3  # 4 eligible, reserve max(1, ceil(0.4)) = 1
    assert "lent" in r.last.nodes[sorted(lent(r))[0]].reason
    assert any(e.kind == "premium_lend" for e in r.last.events) or r.state.premium.lent


def test_premium_work_that_can_start_elsewhere_keeps_the_loan_and_lending_is_sticky():
    f = fleet(h=4)
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5)
    first = lent(r)
    assert len(first) == 1
    r.ticks(5)
    assert lent(r) == first  # sticky: same node tick after tick
    pend(f, 2, 16, P)  # a 2-node gang: two unlent premium nodes are idle, it starts there
    r.tick()
    assert lent(r) == first


def test_premium_work_that_needs_the_lent_node_withdraws_it_at_once():
    f = fleet(h=2)
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5, params=Params(premium={"reserve_nodes": 0, "reserve_fraction": 0}))
    assert lent(r) == {"h0"}
    busy(f, "h1", 101, wl=P)  # premium work takes the unlent node; another premium job must use h0
    pend(f, 2, 8, WorkloadClass.FINETUNE)
    r.tick()
    assert lent(r) == set()  # claimed: withdrawn at once, no hysteresis
    ret = [e for e in r.last.events if e.kind == "premium_return"]
    assert ret and "premium work can start here" in ret[0].message
    assert r.state.premium.claims and r.state.premium.claims[0][0] == 2


def test_a_blocked_gang_does_not_stop_lending():
    """The openb case: a gang waits for more premium nodes than are idle; decode may use the idle ones
    beyond the reserve (the old rule lent nothing while any premium-needing job was pending)."""
    f = fleet(h=6)
    busy(f, "l0", 100)
    busy(f, "h0", 101, wl=P)
    busy(f, "h1", 102, wl=P)
    pend(f, 1, 48, P)  # a 6-node gang: 4 premium nodes idle, it cannot start now whoever uses them
    for j in range(2, 10):
        pend(f, j, 8)
    r = run(f, 5, params=Params(premium={"gang_reserve_max_fraction": 0.5}))
    assert r.state.premium.gang_nodes == 6
    assert len(lent(r)) == 3  # 6 eligible - reserve min(6 gang, floor(0.5 x 6)) = 3
    r2 = run(f, 5, params=Params(premium={"gang_reserve_max_fraction": 1.0}))
    assert lent(r2) == set()  # the whole premium fleet reserved for the gang: the wall


def test_a_claim_lapses_when_slurm_does_not_start_the_job():
    f = fleet(h=4)
    busy(f, "l0", 100)
    for n in ("h0", "h1", "h2"):
        busy(f, n, 200 + int(n[1]), wl=P)
    pend(f, 1, 8, WorkloadClass.FINETUNE)  # fits h3, but Slurm keeps it pending (deep queue, say)
    for j in range(2, 6):
        pend(f, j, 8)
    p = Params(premium={"reserve_nodes": 0, "reserve_fraction": 0, "gang_reserve_max_fraction": 0})
    r = Runner(f, p, t0=0.0, step=120.0)
    r.ticks(3)  # t = 0, 120, 240: decode has not waited lend_after_s (300 s) yet, the claim is fresh
    assert lent(r) == set()
    r.tick()  # t = 360: decode has waited 360 s and the claim is 360 s old >= claim_grace_s: lapsed
    assert lent(r) == {"h3"}
    assert r.state.premium.claims == ((1, 0.0),)  # remembered while pending, so it stays lapsed
    assert ControllerState.from_dict(r.state.to_dict()) == r.state  # the daemon's store keeps it
    r2 = Runner(f, Params(premium={**p.premium.model_dump(), "claim_grace_s": 3600.0}), t0=0.0, step=120.0)
    r2.ticks(10)
    assert lent(r2) == set()  # within the grace the finetune keeps its claim on h3


def test_return_after_hysteresis_when_decode_stops_waiting():
    f = fleet(h=4)
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5)
    assert len(lent(r)) == 1
    f.jobs = [j for j in f.jobs if j.state != "PENDING"]
    r.tick()
    assert len(lent(r)) == 1  # within hysteresis_s (1800 s)
    r.ticks(16)
    assert lent(r) == set()


def test_reserve_covers_largest_gang_seen():
    f = fleet(h=4)
    busy(f, "l0", 100)
    f.jobs.append(JobView(50, "RUNNING", ("h0", "h1", "h2"), True, P, 24))
    for n in ("h0", "h1", "h2"):
        f.slurm_update(n, states=frozenset({"ALLOCATED"}))
    for j in range(1, 10):
        pend(f, j, 8)
    # default: the gang term covers at most half the premium nodes: reserve min(3, floor(0.5 x 4)) = 2,
    # but h0-h2 run the gang, so only h3 is idle to lend
    assert lent(run(f, 5)) == {"h3"}
    whole = Params(premium={"gang_reserve_max_fraction": 1.0})
    r = run(f, 5, params=whole)
    assert lent(r) == {"h3"}  # 4 eligible - reserve 3 (the running 3-node gang) = 1
    f.jobs = [j for j in f.jobs if j.job_id != 50]
    for n in ("h0", "h1", "h2"):
        f.slurm_update(n, states=frozenset({"IDLE"}))
    r.ticks(3)
    assert lent(r) == {"h3"}  # the gang is remembered (gang_memory_s): three nodes stay unlent
    assert r.state.premium.gang_nodes == 3
    r = run(f, 5, params=whole)  # a fresh controller that never saw the gang: reserve max(1, ceil(0.4)) = 1
    assert len(lent(r)) == 3


def test_disabled_is_the_old_wall():
    f = fleet()
    busy(f, "l0", 100)
    pend(f, 1, 8)
    assert lent(run(f, 10, params=Params(premium={"enabled": False}))) == set()


def test_state_round_trip_and_old_states_load():
    f = fleet()
    busy(f, "l0", 100)
    pend(f, 1, 8)
    r = run(f, 5)
    d = r.state.to_dict()
    assert ControllerState.from_dict(d) == r.state
    d.pop("premium")
    assert ControllerState.from_dict(d).premium.lent == ()


def test_best_fit():
    assert best_fit([8, 4, 4], [8, 4]) == [4]
    assert best_fit([2, 2, 2], [3, 3]) == [2]
    assert best_fit([1], []) == [1]


def _best_fit_plain(chunks: list[int], free: list[int]) -> list[int]:
    """The rule written plainly: each chunk in turn goes to the node with the fewest free GPUs that fit it."""
    bins = sorted(f for f in free if f > 0)
    unfit = []
    for c in chunks:
        i = next((i for i, f in enumerate(bins) if f >= c), None)
        if i is None:
            unfit.append(c)
            continue
        bins[i] -= c
        bins.sort()
    return unfit


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(1, 8), max_size=40),
    st.lists(st.integers(-1, 8), max_size=16),
    st.booleans(),
)
def test_best_fit_equals_the_plain_rule(chunks: list[int], free: list[int], largest_first: bool) -> None:
    """best_fit's histogram with its running maximum (chunks larger than any free count, or nothing free at
    all, fail without a search) places exactly what the plain rule places."""
    if largest_first:
        chunks = sorted(chunks, reverse=True)
    assert best_fit(chunks, free) == _best_fit_plain(chunks, free)


# ---- invariants of core.premium.widen on random fleets, queues and memories (hypothesis) -----------------


_CLASSES = (D, P, WorkloadClass.FINETUNE, WorkloadClass.BATCH)


@st.composite
def _scene(draw: st.DrawFn) -> tuple[Observations, Priced, dict[str, Envelope], PremiumMemory, Params, float]:
    n_prem = draw(st.integers(1, 6))
    n_other = draw(st.integers(0, 3))
    names = [f"h{i}" for i in range(n_prem)] + [f"l{i}" for i in range(n_other)]
    slurm, priced, envs = {}, {}, {}
    for n in names:
        prem = n.startswith("h")
        state = draw(st.sampled_from(("IDLE", "MIXED", "ALLOCATED", "DRAIN", "DOWN")))
        states = frozenset({state}) if state not in ("DRAIN",) else frozenset({"IDLE", "DRAIN"})
        slurm[n] = SlurmNode(n, states, "", (), (), 1, "h100" if prem else "l40s", 8)
        tier = draw(st.sampled_from((Tier.GREEN, Tier.GREEN, Tier.YELLOW)))
        priced[n] = PricedNode(n, tier, 100, "", (), True, lemon=draw(st.booleans()) and draw(st.booleans()))
        envs[n] = Envelope("H100" if prem else "L40S", prem, prem, prem, draw(st.integers(0, 4)) > 0, True)
    jobs = []
    for jid in range(1, draw(st.integers(0, 12)) + 1):
        wl = draw(st.sampled_from(_CLASSES))
        if draw(st.booleans()):
            on = tuple(sorted(draw(st.sets(st.sampled_from(names), min_size=1, max_size=3))))
            jobs.append(JobView(jid, "RUNNING", on, True, wl, 8 * len(on)))
        else:
            jobs.append(JobView(jid, "PENDING", (), True, wl, draw(st.sampled_from((1, 4, 8, 16, 24)))))
    prem_names = [n for n in names if n.startswith("h")]
    now = 10_000.0
    since = draw(st.one_of(st.none(), st.floats(now - 2000, now)))
    claims = tuple(sorted((j.job_id, draw(st.floats(now - 1000, now))) for j in jobs if draw(st.booleans())))
    mem = PremiumMemory(
        tuple(sorted(draw(st.sets(st.sampled_from(prem_names))))),
        since,
        None if since is None else draw(st.floats(since, now)),
        draw(st.integers(0, 6)),
        draw(st.one_of(st.none(), st.floats(0, now))),
        claims,
    )
    params = Params(
        premium={
            "reserve_nodes": draw(st.integers(0, 3)),
            "reserve_fraction": draw(st.sampled_from((0.0, 0.1, 0.5))),
            "gang_reserve_max_fraction": draw(st.sampled_from((0.0, 0.5, 1.0))),
            "lend_after_s": draw(st.sampled_from((0.0, 300.0, 5000.0))),
            "claim_grace_s": draw(st.sampled_from((0.0, 300.0, 5000.0))),
            "keep_decode_open": draw(st.booleans()),
        }
    )
    obs = Observations(now, slurm, {}, jobs=tuple(jobs))
    return obs, Priced(priced), envs, mem, params, now


def _eligible(obs: Observations, priced: Priced, envs: dict[str, Envelope]) -> set[str]:
    return {
        n
        for n, e in envs.items()
        if e.premium and decode_eligible(priced.nodes[n], e) and not out_of_service(obs.slurm[n])
    }


@settings(max_examples=400, deadline=None)
@given(_scene())
def test_widen_invariants(scene) -> None:  # type: ignore[no-untyped-def]
    obs, priced, envs, mem, params, now = scene
    w = widen(obs, priced, envs, mem, params, now)
    eligible = _eligible(obs, priced, envs)
    pp = params.premium
    # withdraw when ineligible, and never lend a node premium work can start on now
    assert w.lent <= eligible
    assert not (w.lent & w.claimed) and w.claimed <= eligible
    # never lend below the reserve (nodes still running decode count as lent)
    held = {
        n for j in obs.jobs if j.state == "RUNNING" and j.workload is D for n in j.nodes if envs[n].premium
    }  # fmt: skip
    if w.lent:
        assert w.reserve_nodes >= max(pp.reserve_nodes, math.ceil(pp.reserve_fraction * len(eligible)))
        assert len(w.lent | held) <= len(eligible) - w.reserve_nodes
    # a new loan needs decode to have waited lend_after_s; a lent node's loan is remembered
    if w.lent - set(mem.lent):
        if w.kept_open:  # rule 6: one node, only while no non-premium node can carry fy_ok_decode
            assert pp.keep_decode_open and len(w.lent) == 1 and not _decode_home(obs, priced, envs)
        else:
            assert w.decode_waiting_gpus > 0 and w.memory.waiting_since is not None
            assert now - w.memory.waiting_since >= pp.lend_after_s
    assert w.memory.lent == tuple(sorted(w.lent))
    # claims are remembered only for pending premium-needing jobs, and only lapsed ones are older than grace
    pending = {j.job_id for j in obs.jobs if j.state == "PENDING"}
    assert {j for j, _ in w.memory.claims} <= pending
    # deterministic, whatever order squeue and scontrol list jobs and nodes in
    again = widen(
        replace(obs, jobs=tuple(reversed(obs.jobs)), slurm=dict(reversed(list(obs.slurm.items())))),
        priced,
        envs,
        mem,
        params,
        now,
    )
    assert again == w
    # off: nothing lent, and every earlier loan returned
    off = widen(obs, priced, envs, mem, Params(premium={"enabled": False}), now)
    assert off.lent == frozenset() and {e.node for e in off.events} == set(mem.lent)


def test_earlier_loans_are_returned_when_decode_holders_already_fill_the_cap():
    """Found by test_widen_invariants: two lent nodes both still run one decode service and the reserve is 1.

    Keeping either loan would put loans + holders (2) over the cap (2 eligible - 1 reserve); both go back.
    """
    names = ("h0", "h1", "l0")
    slurm = {
        n: SlurmNode(n, frozenset({"IDLE"}), "", (), (), 1, "h100" if n[0] == "h" else "l40s", 8)
        for n in names
    }
    priced = Priced({n: PricedNode(n, Tier.GREEN, 100, "", (), True) for n in names})
    envs = {n: Envelope("H100" if n[0] == "h" else "L40S", *(4 * (n[0] == "h",)), True) for n in names}
    jobs = (JobView(1, "RUNNING", ("h0", "h1"), True, D, 16), JobView(2, "PENDING", (), True, D, 1))
    params = Params(premium={"reserve_nodes": 0, "reserve_fraction": 0.1, "lend_after_s": 0.0})
    mem = PremiumMemory(("h0", "h1"))
    w = widen(Observations(10_000.0, slurm, {}, jobs=jobs), priced, envs, mem, params, 10_000.0)
    assert w.reserve_nodes == 1
    assert w.lent == frozenset()


# --- premium.batch: batch treated like decode on premium nodes -----------------------------------------

WALL = Params(premium={"batch": True})
B = WorkloadClass.BATCH


def batch_on(r: Runner) -> set[str]:
    assert r.last is not None
    return {n for n, d in r.last.nodes.items() if "fy_ok_batch" in d.fy_features}


def test_batch_wall_keeps_green_premium_nodes_off_batch_until_batch_waits():
    f = fleet(h=4, l=1)
    f.set("h3", 0, "DCGM_FI_DEV_ROW_REMAP_PENDING", 1)  # yellow H100: marginal hardware takes batch
    r = run(f, 2, params=WALL)
    assert batch_on(r) == {"l0", "h3"}  # green H100s: no fy_ok_batch
    assert batch_on(run(fleet(h=4, l=1), 2)) == {"h0", "h1", "h2", "h3", "l0"}  # default: unchanged
    busy(f, "l0", 100, wl=B)
    busy(f, "h3", 101, wl=B)
    for j in range(1, 4):
        pend(f, j, 8, B)  # three whole-node batch jobs with no batch home free
    r = Runner(f, WALL, step=120.0)
    r.tick()
    assert batch_on(r) == {"l0", "h3"}  # not yet: batch must wait lend_after_s
    r.ticks(3)
    lent_batch = batch_on(r) - {"l0", "h3"}
    assert len(lent_batch) == 2  # 3 eligible green H100s, reserve 1
    assert lent(r) == lent_batch  # a lent node carries fy_ok_decode and fy_ok_batch
    d = r.last.nodes[sorted(lent_batch)[0]]
    assert "fy_ok_decode and fy_ok_batch lent" in d.reason and "batch GPUs no fy_ok_batch node" in d.reason
    busy(f, "h2", 102, wl=P)  # the unlent H100 is taken by premium work
    pend(f, 9, 8, P)  # premium work that fits only a lent node claims it: withdrawn at once
    r.tick()
    assert len(batch_on(r) - {"l0", "h3"}) == 1


def test_batch_wall_on_an_all_premium_fleet_keeps_batch_submittable():
    r = run(fleet(h=3, l=0), 2, params=WALL)
    assert len(batch_on(r)) == 1 and batch_on(r) == lent(r)  # rule 6: one node lent for decode and batch
    assert "decode/batch jobs are accepted" in r.last.nodes[next(iter(lent(r)))].reason


def test_supply_from_last_call_equals_a_fresh_count() -> None:
    """``carry_place.premium_supply`` started from the last call's shares (only nodes whose idle count,
    envelope or priced node changed are looked at again) gives the histograms and eligible nodes of a fresh
    count, call after call, as nodes come and go, idle counts move and nodes turn premium, yellow, lemon or
    unmanaged."""
    from slurm_fleetyield.core.carry_place import premium_supply
    from slurm_fleetyield.core.premium_supply import supply as _supply

    names = [f"n{i}" for i in range(6)]
    envs = [
        Envelope("H100", premium=True, hbm_full=True),
        Envelope("L40S", premium=False, hbm_full=True),
        Envelope("L40S", premium=False, hbm_full=False),
    ]
    pns = [
        PricedNode("x", tier, 1, "", (), managed, lemon=lemon, keep_fy=keep)
        for tier in (Tier.GREEN, Tier.YELLOW)
        for managed in (True, False)
        for lemon in (False, True)
        for keep in (None, ("fy_ok_batch",))
    ]
    node = st.tuples(
        st.none() | st.integers(0, 8), st.none() | st.sampled_from(envs), st.none() | st.sampled_from(pns)
    )
    fleet_ = st.fixed_dictionaries({n: node for n in names})

    @settings(max_examples=150, deadline=None)
    @given(st.lists(fleet_, min_size=1, max_size=8), st.randoms(use_true_random=False))
    def check(steps: list[dict[str, tuple]], rnd) -> None:  # type: ignore[no-untyped-def,type-arg]
        memo: dict[str, object] = {}
        envelopes: dict[str, Envelope] = {}
        pnodes: dict[str, PricedNode] = {}
        for step in steps:
            idle = {n: v[0] for n, v in step.items() if v[0] is not None}
            # the next tick's maps: the same objects where a stage carried a node, others where it did not
            envelopes = {n: (v[1] if rnd.random() < 0.5 else envelopes.get(n, v[1])) for n, v in step.items()
                         if v[1] is not None}  # fmt: skip
            pnodes = {n: (v[2] if rnd.random() < 0.5 else pnodes.get(n, v[2])) for n, v in step.items()
                      if v[2] is not None}  # fmt: skip
            got = premium_supply(memo, idle, envelopes, pnodes)  # type: ignore[arg-type]
            assert got == _supply(idle, envelopes, pnodes)
            assert all(c > 0 for h in got[:2] for c in h.values())

    check()
