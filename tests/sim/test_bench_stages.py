"""bench/bench_sim.py ``--stages`` times every stage ``core.loop.tick`` calls.

The list is written by hand, so it goes stale when a rule is added: the hot-spare and stake rules were
missing from it until the seventeenth session, while spares alone was a fifth of a simulated run. This test
reads the calls of ``tick`` and of the loop helpers it routes through, and fails on a core stage the list
does not time (a few small reads are exempt, each with its reason)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import types
from pathlib import Path

from slurm_fleetyield.core import loop

_spec = importlib.util.spec_from_file_location(
    "bench_sim", Path(__file__).parents[2] / "bench" / "bench_sim.py"
)
assert _spec and _spec.loader
bench_sim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_sim)

EXEMPT = {
    ("rehab", "out_of_service"): "a set of the lifecycle's canary nodes",
    ("price", "base_multiplier"): "one number from the learned memory",
    (
        "carry_place",
        "gangs_lent_before",
    ): "the carry's read of last tick's loans, inside gang widening's time",
}


def _stage_calls(*functions: types.FunctionType) -> set[tuple[str, str]]:
    """(module, function) of every ``module.function(...)`` call in these loop functions whose module is a
    core module."""
    out = set()
    for fn in functions:
        for node in ast.walk(ast.parse(inspect.getsource(fn))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and isinstance(
                    getattr(loop, owner.id, None), types.ModuleType
                ):
                    module = getattr(loop, owner.id)
                    if module.__name__.startswith("slurm_fleetyield.core."):
                        out.add((module.__name__.rsplit(".", 1)[-1], node.func.attr))
    return out


def test_every_stage_tick_calls_is_timed() -> None:
    calls = _stage_calls(loop.tick, loop._widen, loop._route)
    assert ("spares", "spares") in calls and ("carry", "risk") in calls  # the reader finds the stages
    timed = {(owner.__name__.rsplit(".", 1)[-1], name) for owner, name in bench_sim.STAGES}
    missing = sorted(calls - timed - set(EXEMPT))
    assert not missing, f"bench/bench_sim.py STAGES does not time {missing}"


def test_the_reader_sees_a_stage_the_list_lacks() -> None:
    timed = {(owner.__name__.rsplit(".", 1)[-1], name) for owner, name in bench_sim.STAGES}
    calls = _stage_calls(loop.tick, loop._widen, loop._route)
    assert calls - (timed - {("stake", "withhold")}) - set(EXEMPT) == {("stake", "withhold")}
