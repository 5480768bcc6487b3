"""Hot spares (core/spares.py): the sizing rule, the candidates, and the features route gives them."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core import spares
from slurm_fleetyield.core.model import JobView, WorkloadClass
from slurm_fleetyield.core.params import Params

CLASSES = {"fy_ok_train", "fy_ok_finetune", "fy_ok_decode", "fy_ok_batch"}


def on(**over: object) -> Params:
    return Params(spares={"enabled": True, **over})  # type: ignore[arg-type]


def gang(job_id: int, nodes: tuple[str, ...], qos: str = "normal", gpus_per_node: int = 8) -> JobView:
    gpus = gpus_per_node * len(nodes)
    return JobView(job_id, "RUNNING", nodes, True, WorkloadClass.PRETRAIN, gpus, qos=qos)


def test_poisson_tail() -> None:
    assert spares.poisson_tail(1.0, 0) == 1.0
    assert spares.poisson_tail(1.0, 1) == pytest.approx(1 - math.exp(-1))
    assert spares.poisson_tail(2.0, 3) == pytest.approx(1 - math.exp(-2) * (1 + 2 + 2))
    assert spares.poisson_tail(0.0, 1) == 0.0


def test_the_kth_spare_is_held_while_its_expected_saving_covers_its_idle_cost() -> None:
    p = on()  # restart_wait 3,600 s, refill 14,400 s: the k-th spare needs P(>= k) >= 8 x 4 / (G x 1)
    idle = 8 * p.spares.refill_s
    lam, g = 1.21, 15_360  # Llama 3's rate on a 1,920-node gang over 4 h (arXiv 2407.21783)
    k = spares.size(lam, g, 8, p)
    assert spares.poisson_tail(lam, k) * g * p.spares.restart_wait_s >= idle  # the k-th pays
    assert spares.poisson_tail(lam, k + 1) * g * p.spares.restart_wait_s < idle  # the next does not
    assert 3 <= k <= 8, k
    # a 2-node gang at the same per-node rate: a spare would stand idle for far more than it saves
    assert spares.size(lam * 2 / 1920, 16, 8, p) == 0
    assert spares.size(0.0, g, 8, p) == 0


def _fleet(n: int = 40) -> Fleet:
    return Fleet(n)


def test_disabled_holds_nothing_and_emits_no_spare_feature() -> None:
    f = _fleet(8)
    f.jobs = [gang(1, ("gpu000", "gpu001", "gpu002"))]
    r = Runner(f).tick()
    feats = {x for d in r.nodes.values() for x in d.fy_features}
    assert not feats & {"fy_spare", "fy_ok_gang", "fy_ok_preempt"}
    assert spares.choose(f.observe(0.0), _priced_of(r), {}, Params()).nodes == {}


def _priced_of(result):  # type: ignore[no-untyped-def]
    from slurm_fleetyield.core.price import Priced, PricedNode

    nodes = result.nodes.items()
    return Priced({n: PricedNode(n, d.tier, d.weight, d.reason, (), True, risk=d.risk) for n, d in nodes})


def test_no_gang_no_spare_but_the_twins_follow_the_class_features() -> None:
    f = _fleet(8)
    r = Runner(f, on(min=2)).tick()
    for d in r.nodes.values():
        fy = set(d.fy_features)
        assert "fy_spare" not in fy
        assert ("fy_ok_gang" in fy) == ("fy_ok_train" in fy)
        assert ("fy_ok_preempt" in fy) == ("fy_ok_batch" in fy)
        assert "fy_ok_gang" in fy and "fy_ok_preempt" in fy


def test_the_floor_holds_spares_off_the_gang_on_the_least_busy_green_nodes() -> None:
    f = _fleet(40)
    f.jobs = [
        gang(1, tuple(f"gpu{i:03d}" for i in range(10))),
        JobView(2, "RUNNING", ("gpu010",), True, WorkloadClass.FINETUNE, 8),  # busy: not preemptible
        JobView(3, "RUNNING", ("gpu011",), True, WorkloadClass.BATCH, 8, qos="fy_preemptible"),
    ]
    r = Runner(f, on(min=2)).tick()
    held = sorted(n for n, d in r.nodes.items() if "fy_spare" in d.fy_features)
    assert len(held) == 2 and not set(held) & {f"gpu{i:03d}" for i in range(11)}, held
    for n in held:
        fy = set(r.nodes[n].fy_features)
        assert {"fy_spare", "fy_ok_gang", "fy_ok_preempt"} <= fy and not fy & CLASSES, fy
        assert "spares.min" in r.nodes[n].reason and "hot spare" in r.nodes[n].reason
        assert r.nodes[n].features[:2] == ("rack1", "ib")  # the admin's features stay
    # the preemptible job's node is as good as an idle one: it sorts with them (by risk, then name)
    assert "gpu010" not in held


def test_spares_are_sticky_and_capped() -> None:
    f = _fleet(40)
    f.jobs = [gang(1, tuple(f"gpu{i:03d}" for i in range(30)))]
    run = Runner(f, on(min=5, max_fraction=0.05))  # 5% of 40 nodes: 2
    first = run.tick()
    held = {n for n, d in first.nodes.items() if "fy_spare" in d.fy_features}
    assert len(held) == 2
    # another node becomes a better candidate by name order; the spares stay where they are
    f.jobs = [gang(1, tuple(f"gpu{i:03d}" for i in range(1, 30)))]
    second = run.tick()
    assert {n for n, d in second.nodes.items() if "fy_spare" in d.fy_features} == held


def test_a_yellow_node_is_never_a_spare() -> None:
    f = _fleet(12)
    f.jobs = [gang(1, tuple(f"gpu{i:03d}" for i in range(8)))]
    f.set("gpu008", 0, s.REMAP_PENDING, 1)
    r = Runner(f, on(min=4, max_fraction=0.5)).tick()
    held = {n for n, d in r.nodes.items() if "fy_spare" in d.fy_features}
    assert held == {"gpu009", "gpu010", "gpu011"}, held


def test_a_frontier_fleet_at_llama_rate_holds_a_handful_from_the_rule_alone() -> None:
    f = _fleet(0)
    for i in range(256):
        f.add(f"n{i:04d}")
    f.jobs = [gang(1, tuple(f"n{i:04d}" for i in range(240)))]
    p = on(max_fraction=0.1)
    r = Runner(f, p).tick()
    held = [n for n, d in r.nodes.items() if "fy_spare" in d.fy_features]
    lam = spares.choose(f.observe(r.now), _priced_of(r), {}, p).expected_faults
    assert lam > 0
    assert len(held) == spares.size(lam, 240 * 8, 8, p), (len(held), lam)
    for n in held:
        assert "P(>= " in r.nodes[n].reason


def test_params_validate() -> None:
    with pytest.raises(ValidationError, match="gang_min_nodes"):
        Params(spares={"gang_min_nodes": 1})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="max_fraction"):
        Params(spares={"max_fraction": 0.9})  # type: ignore[arg-type]
