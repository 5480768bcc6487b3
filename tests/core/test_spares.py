"""Hot spares (core/spares.py): the Poisson sizing rule, its cap and floor, stickiness, and the features
route gives spares and their twins (fy_ok_gang, fy_ok_preempt)."""

from __future__ import annotations

import math

from core.builders import H100, Fleet, Runner
from slurm_fleetyield.core import spares, stake
from slurm_fleetyield.core.model import Envelope, JobView, Tier, WorkloadClass
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import Priced, PricedNode

HORIZON = Params().risk.horizon_days * 86_400.0
NVL = Envelope(nvlink=True, nvlink_full=True, hbm_full=True, known=True)


def _fleet(n: int) -> Fleet:
    f = Fleet(0)
    for i in range(n):
        f.add(f"n{i:02d}", H100)
    return f


def _priced(n: int, p: float = 0.01, tier: Tier = Tier.GREEN) -> Priced:
    return Priced({f"n{i:02d}": PricedNode(f"n{i:02d}", tier, 100, "", (), True, risk=p) for i in range(n)})


def _params(**over: object) -> Params:
    return Params(spares={"enabled": True, **over})


def _gang(nodes: int, first: int = 0, job_id: int = 1) -> JobView:
    names = tuple(f"n{i:02d}" for i in range(first, first + nodes))
    return JobView(job_id, "RUNNING", names, True, WorkloadClass.PRETRAIN, 8 * nodes)


def _run(f: Fleet, priced: Priced, params: Params) -> spares.Spares:
    envs = dict.fromkeys(priced.nodes, NVL)
    return spares.spares(f.observe(0.0), priced, envs, stake.Withheld({}), params, 0.0)


def _p_for_lambda(lam: float, gang_nodes: int, refill_s: float) -> float:
    """The per-node risk over the horizon at which ``gang_nodes`` nodes give ``lam`` faults per refill."""
    return -math.expm1(-lam / gang_nodes / refill_s * HORIZON)


def test_poisson_tail():
    assert spares.poisson_tail(2.0, 0) == 1.0
    assert math.isclose(spares.poisson_tail(2.0, 1), 1 - math.exp(-2))
    assert math.isclose(spares.poisson_tail(2.0, 2), 1 - 3 * math.exp(-2))
    assert spares.poisson_tail(0.0, 1) == 0.0


def test_the_kth_spare_is_held_exactly_when_its_expected_saving_reaches_its_idle_cost():
    # gang 512 GPUs, wait 3600 s, node 8 GPUs x refill 14400 s: hold k iff P(N >= k) >= 8*14400/(512*3600)
    need = 8 * 14_400 / (512 * 3_600)  # 0.0625
    lo = -math.log1p(-need)  # P(N >= 1) == need exactly at this Lambda
    assert spares.wanted(lo * 1.01, 512, 8, 3_600, 14_400, 10) == 1
    assert spares.wanted(lo * 0.99, 512, 8, 3_600, 14_400, 10) == 0
    assert spares.wanted(5.0, 512, 8, 3_600, 14_400, 3) == 3  # the cap binds


def test_a_large_gang_at_high_hazard_gets_spares_and_no_gang_gets_none():
    f = _fleet(100)
    f.jobs = [_gang(64)]
    p = _params()
    sp = _run(f, _priced(100, _p_for_lambda(1.0, 64, 14_400)), p)
    assert math.isclose(sp.lam, 1.0, rel_tol=1e-6)
    assert math.isclose(sp.gang_gpus, 512)
    # P(N>=k) for Lambda 1: .63 .26 .08 .019 -> k=3 (>= 0.0625); cap 5 % of 100 = 5
    assert len(sp.nodes) == 3 and sp.cap == 5
    assert all(int(n[1:]) >= 64 for n in sp.nodes)  # never a node running the gang
    assert "hot spare (1 of 3: P(>= k gang-node faults" in sp.nodes[min(sp.nodes)]
    f.jobs = []
    assert not _run(f, _priced(100, 0.5), p).nodes


def test_small_gangs_at_low_hazard_get_none_and_the_floor_applies_while_a_gang_runs_or_pends():
    f = _fleet(64)
    f.jobs = [_gang(2, 2 * i, i + 1) for i in range(10)]  # openb-like: 2-node gangs
    assert not _run(f, _priced(64, 0.01), _params()).nodes
    assert len(_run(f, _priced(64, 0.01), _params(min=2)).nodes) == 2
    # a requeued gang (Slurm's restart count > 0) is about to restart: it keeps the floor
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 16, restarts=1)]  # two 8-GPU nodes
    assert len(_run(f, _priced(64, 0.01), _params(min=2)).nodes) == 2
    # a gang that never ran cannot lose a node: a deep queue of them holds no spare
    f.jobs = [JobView(i, "PENDING", (), True, WorkloadClass.PRETRAIN, 512) for i in range(1, 200)]
    assert not _run(f, _priced(64, 0.01), _params(min=2)).nodes
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 8, restarts=1)]  # fits one node
    assert not _run(f, _priced(64, 0.01), _params(min=2)).nodes


def test_a_node_certain_to_fail_under_a_gang_is_one_fault_not_an_infinite_rate():
    f = _fleet(100)
    f.jobs = [_gang(4)]
    nodes = dict(_priced(100, 0.0).nodes)
    nodes["n00"] = PricedNode("n00", Tier.GREEN, 100, "", (), True, risk=1.0)  # a known fatal fault
    sp = _run(f, Priced(nodes), _params())
    # one certain fault: P(N >= 1) = 1, 32 gang GPUs x 1 h >= 8 GPUs x 4 h -> one spare, not the cap (5)
    assert sp.certain == 1 and sp.lam == 0.0 and math.isclose(sp.gang_gpus, 32)
    assert len(sp.nodes) == 1 and sp.cap == 5
    assert "1 certain + expected 0.00" in next(iter(sp.nodes.values()))


def test_the_cap_and_the_stake_breaker_bound_the_spares():
    f = _fleet(100)
    f.jobs = [_gang(64)]
    assert len(_run(f, _priced(100, 0.9), _params(max_fraction=0.02)).nodes) == 2
    obs = f.observe(0.0)
    priced = _priced(100, 0.9)
    envs = dict.fromkeys(priced.nodes, NVL)
    # the stake rule withholds from 18 of 100 nodes (144 of 800 GPUs); its cap is 20 %: room for 2 spares
    held = {f"n{i:02d}": frozenset({"fy_ok_train"}) for i in range(64, 82)}
    wh = stake.Withheld(held, gpus=dict.fromkeys(priced.nodes, 8), service_gpus=800)
    sp = spares.spares(obs, priced, envs, wh, _params(max_fraction=0.2), 0.0)
    assert len(sp.nodes) == 2 and not set(sp.nodes) & set(held)


def test_candidates_prefer_the_spares_of_last_tick_then_the_emptiest_then_the_safest():
    f = _fleet(100)
    f.jobs = [
        _gang(64),
        JobView(2, "RUNNING", ("n64",), True, WorkloadClass.BATCH, 8),  # busy: last
        JobView(3, "RUNNING", ("n65",), True, WorkloadClass.BATCH, 8, qos="fy_preemptible"),  # evictable
    ]
    pr = _priced(100, _p_for_lambda(1.0, 64, 14_400))
    nodes = dict(pr.nodes)
    nodes["n66"] = PricedNode("n66", Tier.GREEN, 100, "", (), True, risk=0.5)  # riskier: after the others
    nodes["n67"] = PricedNode("n67", Tier.YELLOW, 100, "", (), True, risk=0.01)  # not green: never
    nodes["n68"] = PricedNode("n68", Tier.GREEN, 100, "", (), True, risk=0.01, lemon=True)  # never
    pr = Priced(nodes)
    assert sorted(_run(f, pr, _params()).nodes) == ["n65", "n69", "n70"]
    f.slurm_update("n99", available_features=("fy_spare",), active_features=("fy_spare",))  # stays one
    assert sorted(_run(f, pr, _params()).nodes) == ["n65", "n69", "n99"]


def test_route_gives_spares_gang_and_preempt_features_and_twins_elsewhere():
    f = _fleet(100)
    f.jobs = [_gang(64)]
    base = Runner(f).tick()
    r = Runner(f, _params(min=2)).tick()  # the base rate alone over 64 nodes x 4 h: ~0.04 faults, the floor
    spare_nodes = [n for n, d in r.nodes.items() if "fy_spare" in d.fy_features]
    assert len(spare_nodes) == 2
    for n, d in r.nodes.items():
        fy = set(d.fy_features)
        if n in spare_nodes:
            assert {"fy_spare", "fy_ok_gang", "fy_ok_preempt"} <= fy
            assert not fy & {"fy_ok_train", "fy_ok_finetune", "fy_ok_decode", "fy_ok_batch"}
            assert "hot spare (" in d.reason
        else:
            assert ("fy_ok_gang" in fy) == ("fy_ok_train" in fy)
            assert ("fy_ok_preempt" in fy) == ("fy_ok_batch" in fy)
            assert "fy_spare" not in fy
            assert fy - {"fy_ok_gang", "fy_ok_preempt"} == set(base.nodes[n].fy_features)


def test_disabled_spares_leave_every_output_identical():
    def runs(params: Params) -> list[tuple[object, ...]]:
        f = _fleet(40)
        f.jobs = [_gang(16), JobView(2, "PENDING", (), True, WorkloadClass.PRETRAIN, 64)]
        r = Runner(f, params)
        out = []
        for _ in range(3):
            t = r.tick()
            out.append((repr(t.plan), repr(sorted(t.nodes.items())), repr(t.events)))
        return out

    assert runs(Params()) == runs(Params(spares={"enabled": False, "min": 3}))


def test_a_change_of_spare_set_reaches_the_memoised_routing():
    f = _fleet(100)
    f.jobs = [_gang(64)]
    r = Runner(f, _params(min=3))
    first = {n for n, d in r.tick().nodes.items() if "fy_spare" in d.fy_features}
    r.params = _params(min=3, max_fraction=0.01)  # same memo, fewer spares allowed
    second = {n for n, d in r.tick().nodes.items() if "fy_spare" in d.fy_features}
    assert len(second) == 1 and second < first
    gone = first - second
    assert all("fy_ok_train" in r.last.nodes[n].fy_features for n in gone if r.last)


def test_bad_spare_params_name_the_field():
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match="max_fraction"):
        Params(spares={"max_fraction": 1.5})
    with pytest.raises(pydantic.ValidationError, match="gang_min_nodes"):
        Params(spares={"gang_min_nodes": 1})
