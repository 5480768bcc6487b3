"""The decision core never changes a value after building it, frozen or not.

Three per-GPU values are plain slotted dataclasses, not frozen ones: ``SensedGpu``, ``GpuRisk`` and
``GpuTrack``. A 100k-GPU tick builds about 230,000 of them, and a frozen dataclass's constructor stores each
field through ``object.__setattr__``, which cost about a tenth of the tick (docs/results.md). They stay
values by this check instead: in the core, an attribute is only ever stored on ``self`` inside a method of a
working object's class (a sense pass, a tick's drain budget), never on one of these values and never
through ``setattr``; so an object the core handed on (kept across ticks, shared between nodes) is never
changed by the core."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import slurm_fleetyield.core as core
from slurm_fleetyield.core.history import GpuTrack
from slurm_fleetyield.core.model import GpuRisk
from slurm_fleetyield.core.trends import SensedGpu

CORE = Path(core.__file__).parent


VALUES = frozenset({"SensedGpu", "GpuRisk", "GpuTrack"})
WORKING = frozenset({"DrainBudget"})  # a tick's drain caps as a budget, spent drain by drain


def _is_dataclass(cls: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in cls.decorator_list)


def _is_frozen(cls: ast.ClassDef) -> bool:
    return any("frozen=True" in ast.unparse(d) for d in cls.decorator_list)


def attribute_stores(source: str) -> list[tuple[int, str]]:
    """Every attribute store the rule forbids: (line, code)."""
    tree = ast.parse(source)
    bad: list[tuple[int, str]] = []

    def visit(node: ast.AST, cls: ast.ClassDef | None, in_method: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child, False)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, cls, cls is not None and node is cls)
                continue
            if isinstance(child, ast.Attribute) and isinstance(child.ctx, (ast.Store, ast.Del)):
                on_self = isinstance(child.value, ast.Name) and child.value.id == "self"
                if not (on_self and in_method and cls is not None and cls.name not in VALUES):
                    bad.append((child.lineno, ast.unparse(child)))
            if isinstance(child, ast.Call) and ast.unparse(child.func).split(".")[-1] in (
                "setattr",
                "__setattr__",
                "delattr",
            ):
                bad.append((child.lineno, ast.unparse(child)))
            visit(child, cls, in_method)

    visit(tree, None, False)
    return bad


def test_the_core_stores_attributes_only_on_its_own_working_objects() -> None:
    found = {
        f"{p.name}:{line}": code
        for p in sorted(CORE.glob("*.py"))
        for line, code in attribute_stores(p.read_text())
    }
    assert found == {}


def test_the_check_finds_a_changed_value() -> None:
    sample = """
from dataclasses import dataclass

@dataclass(slots=True)
class GpuRisk:
    x: int
    def bump(self):
        self.x += 1

class Pass:
    def __init__(self):
        self.n = 0

def stage(v, run):
    run.n = 1
    v.x = 2
    setattr(v, "x", 3)
    object.__setattr__(v, "x", 4)
"""
    assert [line for line, _ in attribute_stores(sample)] == [8, 15, 16, 17, 18]


def test_the_unfrozen_values_are_the_three_named() -> None:
    unfrozen = {
        name
        for p in sorted(CORE.glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and _is_dataclass(node)
        for name in [node.name]
        if not _is_frozen(node)
    }
    assert unfrozen == VALUES | WORKING
    for cls in (SensedGpu, GpuRisk, GpuTrack):
        assert dataclasses.is_dataclass(cls) and "__slots__" in vars(cls)
