import inspect

from core.builders import Fleet, Runner
from slurm_fleetyield.core import loop
from slurm_fleetyield.core import signals as s


def test_tick_is_short_and_the_only_place_of_stage_order():
    body = inspect.getsource(loop.tick)
    assert len(body.splitlines()) <= 30
    assert body.index("sense.sense") < body.index("carry.risk(") < body.index("carry.profile(")
    assert body.index("carry_place.price") < body.index("_widen(") < body.index("_route(")  # route, keep open


def test_tick_twice_on_same_observations_second_plan_empty():
    f = Fleet(10)
    f.set("gpu002", 0, s.REMAP_PENDING, 1)
    f.push("gpu005", 79, 1, 1_000_000.0)
    r = Runner(f)
    first = r.tick()
    assert not first.plan.empty
    # same clock, same samples, Slurm already updated: the only news is that gpu005 is now drained and
    # empty, which starts its remediation (lifecycle: DRAINED -> reason re-asserted + reboot)
    second = r.tick(advance=False)
    assert [(a.kind, a.node) for a in second.plan.actions] == [("drain", "gpu005"), ("reboot", "gpu005")]
    third = r.tick(advance=False)
    assert third.plan.empty and third.plan.holds == ()


def test_every_decision_has_reason():
    f = Fleet(5)
    f.nodes["gpu000"].sampled = False
    f.set("gpu001", 0, s.REMAP_PENDING, 1)
    res = Runner(f).tick()
    assert all(d.reason for d in res.nodes.values())
    assert res.nodes["gpu001"].evidence
