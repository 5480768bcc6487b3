"""Scenario tables: (fleet, faults, expected plan) run through ``tick`` on a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from core.builders import L40S, Fleet, Runner

from slurm_fleetyield.core import signals as s


@dataclass
class Scenario:
    name: str
    nodes: int
    faults: Callable[[Fleet, float], None]  # applied after the first (baseline) tick
    drains: tuple[str, ...] = ()
    holds: tuple[str, ...] = ()
    tiers: tuple[tuple[str, str], ...] = ()
    lacks: tuple[tuple[str, str], ...] = ()  # (node, feature) that must be absent after the faults
    has: tuple[tuple[str, str], ...] = ()


def _xid79(f: Fleet, t: float) -> None:
    f.run_job(1, ("gpu002",), requeue=True)
    f.push("gpu002", 79, 3, t)


def _storm(f: Fleet, t: float) -> None:
    for i in range(18):
        f.push(f"gpu{i:03d}", 79, 0, t + i)


def _nvlink(f: Fleet, t: float) -> None:
    f.bump("gpu001", 0, s.NVLINK_CRC_FLIT, 5000)


def _hbm(f: Fleet, t: float) -> None:
    f.set("gpu001", 2, s.ROWS_CORR, 12)
    f.bump("gpu001", 2, s.ROWS_CORR, 2)


def _stale(f: Fleet, t: float) -> None:
    f.nodes["gpu001"].sample_time = t - 3600
    f.nodes["gpu001"].hidden_gpus = {0, 1, 2}


def _admin(f: Fleet, t: float) -> None:
    f.drain_by_admin("gpu001", "maintenance")
    f.push("gpu001", 48, 0, t)


SCENARIOS = [
    Scenario("quiet fleet", 10, lambda f, t: None, has=(("gpu000", "fy_ok_train"),)),
    Scenario("xid79 drains one node", 10, _xid79, drains=("gpu002",), tiers=(("gpu002", "quarantined"),)),
    Scenario(
        "storm capped by rate",
        20,
        _storm,
        drains=("gpu000", "gpu001"),
        holds=tuple(f"gpu{i:03d}" for i in range(2, 18)),
    ),
    Scenario("nvlink crc", 4, _nvlink, lacks=(("gpu001", "fy_nvlink_full"), ("gpu001", "fy_ok_train"))),
    Scenario(
        "hbm rows",
        4,
        _hbm,
        tiers=(("gpu001", "yellow"),),
        has=(("gpu001", "fy_ok_batch"), ("gpu001", "fy_ok_finetune")),  # stake rule: nothing pending to lose
    ),
    Scenario(
        "stale node with missing gpus",
        10,
        _stale,
        tiers=(("gpu001", "unknown"),),
        has=(("gpu001", "fy_ok_train"),),
    ),
    Scenario("admin drained left alone", 10, _admin),
]


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: sc.name)
def test_scenario(sc: Scenario) -> None:
    f = Fleet(sc.nodes)
    r = Runner(f)
    r.tick()
    sc.faults(f, r.now)
    res = r.tick()
    assert tuple(d.node for d in res.plan.of_kind("drain")) == sc.drains
    assert tuple(h.node for h in res.plan.holds) == sc.holds
    for node, tier in sc.tiers:
        assert res.nodes[node].tier.value == tier
    for node, feat in sc.lacks:
        assert feat not in res.nodes[node].features
    for node, feat in sc.has:
        assert feat in res.nodes[node].features


def test_decode_class_lands_on_nonpremium_green_only_under_the_tier_rule():
    from core.builders import tier_params

    f = Fleet(2)
    f.add("l40s-0", L40S)
    f.add("l40s-1", L40S)
    f.set("l40s-1", 0, s.REMAP_PENDING, 1)
    res = Runner(f, tier_params()).tick()
    ok = sorted(n for n, d in res.nodes.items() if "fy_ok_decode" in d.features)
    assert ok == ["l40s-0"]
