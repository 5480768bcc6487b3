"""Objects built at half the cost: the simulator's constructors of the views it builds by the million.

``fast_init`` gives a frozen, slotted dataclass an ``__init__`` that stores fields directly (no
``object.__setattr__`` per field); ``fast_new`` a positional constructor that skips ``__init__``. Both make
the same objects as the dataclass would (tests/sim/test_fast_new.py). The simulator is the shell: it builds
the core's ``JobView`` and ``SlurmNode`` views (sim/cluster.py) and its own trace jobs (sim/traces.py) this
way; the decision core builds its values with their plain constructors (issue #31).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

_T = TypeVar("_T")


def fast_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass a faster ``__init__`` (same signature, defaults and result).

    The generated frozen ``__init__`` goes through ``object.__setattr__`` by name for every field; this one
    calls each slot's descriptor directly, about twice as fast. The class stays frozen (assignment raises),
    hashable and equal by value. Used on the types a 100k-GPU tick builds hundreds of thousands of.
    """
    ns: dict[str, Any] = {f"_s_{f.name}": getattr(cls, f.name).__set__ for f in fields(cls)}  # type: ignore[arg-type]
    params, body = _field_code(cls, ns, "_s_{0}(self, {0})")
    src = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body) + "\n"
    exec(src, ns)
    init: Callable[..., None] = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


def _field_code(cls: type, ns: dict[str, Any], store: str) -> tuple[list[str], list[str]]:
    """The parameters (with the dataclass's defaults, which go into ``ns``) and body lines of a generated
    constructor of ``cls`` whose body stores each field with ``store`` (``{0}``: the field's name)."""
    ns["_MISSING"] = MISSING
    params, body = [], []
    for f in fields(cls):
        n = f.name
        if f.default is not MISSING:
            ns[f"_d_{n}"] = f.default
            params.append(f"{n}=_d_{n}")
        elif f.default_factory is not MISSING:
            ns[f"_f_{n}"] = f.default_factory
            params.append(f"{n}=_MISSING")
            body.append(f" if {n} is _MISSING: {n} = _f_{n}()")
        else:
            params.append(n)
        body.append(" " + store.format(n))
    return params, body


def fast_new(cls: type[_T]) -> Callable[..., _T]:
    """A constructor of ``cls`` (a frozen, slotted dataclass) for the hottest call sites: same signature,
    defaults and result as ``cls(...)``, about twice as fast as even ``fast_init``'s ``__init__``.

    The fields are stored with plain attribute stores into an instance of a twin class that has the very
    same slots and no frozen ``__setattr__``; the instance then becomes a ``cls`` by ``__class__``
    assignment, which CPython allows between classes of the same layout (checked here once). What comes
    back is an ordinary ``cls`` instance -- frozen, equal, hashable, picklable like any other;
    ``tests/core/test_fast_new.py`` checks each type it is used for against ``cls(...)``."""
    slots = tuple(cls.__slots__)  # type: ignore[attr-defined]
    names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    if sorted(slots) != sorted(names) or cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__}: fast_new needs a slotted dataclass whose slots are its fields")
    twin = type(f"_{cls.__name__}Fields", (object,), {"__slots__": slots})
    ns: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": cls}
    params, body = _field_code(cls, ns, "self.{0} = {0}")
    src = (
        f"def new_{cls.__name__}({', '.join(params)}):\n self = _new(_twin)\n"
        + "\n".join(body)
        + "\n self.__class__ = _cls\n return self\n"
    )
    exec(src, ns)
    make: Callable[..., _T] = ns[f"new_{cls.__name__}"]
    probe: Any = object.__new__(twin)
    probe.__class__ = cls  # raises TypeError now, not at the first call, if the layouts differ
    return make
