"""What every parameter model shares: strict, frozen, finite; workload class names checked.

core/params.py says how parameters are validated; this module holds the pieces its section modules use.
"""

from __future__ import annotations

from pydantic import ConfigDict, Strict

# Strict: a TOML string "0.5", a boolean or 1 is never a float, "yes" never a bool, "9402" never an int; an
# integer is still a float. Finite: inf/nan are refused (max_skew = inf would accept replays forever).
_FROZEN = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
_LAX = Strict(False)
"""On a container only: TOML gives lists where a tuple is kept (its items stay strict)."""


def _workload_classes(v: tuple[str, ...], where: str) -> tuple[str, ...]:
    """``v`` if every name is a ``WorkloadClass`` value, else a clear error naming ``where``."""
    from slurm_fleetyield.core.model import WorkloadClass

    known = {c.value for c in WorkloadClass}
    for c in v:
        if c not in known:
            raise ValueError(f"unknown workload class {c!r} in {where}; known: {sorted(known)}")
    return v
