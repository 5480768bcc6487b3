"""The decision core keeps no state between calls in its modules: a stage's answer is a function of its
arguments. What a tick reads once for several stages lives on the tick's values (``Observations.job_index``,
``Observations.idle``); what the simulator carries from tick to tick lives in ``ControllerState.memo``.

The check reads each core module's source: no ``global`` statement, and no function that changes a name
bound at module level (an item or slice assigned or deleted, a mutating method called) unless the function
binds that name itself. (A closure's ``nonlocal`` is state of one call, not of the module.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import slurm_fleetyield.core as core

CORE = Path(core.__file__).parent
MUTATORS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "pop",
        "popitem",
        "clear",
        "update",
        "setdefault",
        "add",
        "discard",
        "remove",
        "sort",
        "reverse",
    }
)


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for t in targets:
            names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def _bound_in(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Names a function binds itself: its arguments and every name it stores."""
    args = fn.args
    bound = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    bound.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
    bound.update(n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return bound


def _changed_names(fn: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of every name whose value ``fn`` changes in place."""
    out = []
    for n in ast.walk(fn):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            for t in targets:
                if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name):
                    out.append((t.value.id, n.lineno))
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in MUTATORS
            and isinstance(n.func.value, ast.Name)
        ):
            out.append((n.func.value.id, n.lineno))
    return out


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    module = _module_names(tree)
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Global):
            found.append(f"{path.name}:{n.lineno}: global {', '.join(n.names)}")
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            own = _bound_in(n)
            for name, line in _changed_names(n):
                if name in module and name not in own:
                    found.append(f"{path.name}:{line}: changes module-level {name!r}")
    return sorted(set(found))


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_keeps_no_state(path: Path) -> None:
    assert _findings(path) == []


def test_the_check_finds_module_state(tmp_path: Path) -> None:
    """The check can fail: the module-level cache this file was written against, and a ``global``."""
    src = tmp_path / "cached.py"
    src.write_text(
        "_LAST: list[tuple[object, int]] = []\n"
        "_ONE = None\n"
        "def count(obs):\n"
        "    if _LAST and _LAST[0][0] is obs:\n"
        "        return _LAST[0][1]\n"
        "    _LAST[:] = [(obs, 1)]\n"
        "    return 1\n"
        "def one():\n"
        "    global _ONE\n"
        "    _ONE = 1\n"
        "def local(xs):\n"
        "    _LAST = []\n"
        "    _LAST.append(xs)\n"
        "    return _LAST\n"
    )
    assert _findings(src) == [
        "cached.py:6: changes module-level '_LAST'",
        "cached.py:9: global _ONE",
    ]
