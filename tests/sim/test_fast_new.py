"""``sim.fast.fast_new``: the simulator's constructors build what the classes' own constructors build."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from slurm_fleetyield.core.model import (
    Envelope,
    GpuReading,
    Health,
    JobView,
    NodeDecision,
    NodeSample,
    SlurmNode,
    Tier,
    WorkloadClass,
)
from slurm_fleetyield.core.sense import SensedGpu, SensedNode
from slurm_fleetyield.sim.fast import fast_new

_READING = GpuReading(0, "GPU-a", "H100", fields={"DCGM_FI_DEV_GPU_TEMP": 40.0})
_SENSED_GPU = SensedGpu(_READING, (1.0, None), (0.5, 0.0), None, ((79, 1.0),))

CASES: list[tuple[type, tuple[Any, ...], dict[str, Any]]] = [
    (NodeSample, ("n1", 12.5), {}),
    (NodeSample, ("n1", 12.5, (_READING,), 8), {"error": "timeout", "source": "prometheus"}),
    (SensedNode, ("n1", Health.OK, "fresh sample", (_SENSED_GPU,), 8), {}),
    (SensedNode, ("n1", Health.UNKNOWN, "no sample"), {}),
    (SlurmNode, ("n1", frozenset({"MIXED", "DRAIN"}), "fleetyield: x", ("a",), ("a",), 7, "h100", 8), {}),
    (SlurmNode, ("n1", frozenset({"IDLE"})), {}),
    (JobView, (3, "RUNNING", ("n1", "n2"), True, WorkloadClass.PRETRAIN, 16), {}),
    (JobView, (4, "PENDING"), {"gpu_index": (("n1", (0, 1)),)}),
    (NodeDecision, ("n1", Tier.GREEN, Health.OK, 0.01, ("fy_tier_green",), ("a", "fy_tier_green"), 100,
                    "IDLE", "ok"), {}),
    (NodeDecision, ("n1", Tier.YELLOW, Health.WARN, 0.2, (), (), 5, "", "r", ("e",), Envelope("H100", True)),
     {"managed": False}),
]  # fmt: skip


def _hash(x: object) -> int | str:
    try:
        return hash(x)
    except TypeError as e:
        return str(e)


@pytest.mark.parametrize(("cls", "args", "kwargs"), CASES)
def test_fast_new_builds_what_the_class_builds(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    made, want = fast_new(cls)(*args, **kwargs), cls(*args, **kwargs)
    assert type(made) is cls
    assert made == want and repr(made) == repr(want)
    assert _hash(made) == _hash(want)  # a reading holds its fields in a dict: then neither is hashable
    assert dataclasses.astuple(made) == dataclasses.astuple(want)  # every field, defaults included
    assert pickle.loads(pickle.dumps(made)) == want and copy.deepcopy(made) == want
    name = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, name, None)
    assert dataclasses.replace(made) == want


def test_fast_new_keeps_the_signature_and_refuses_what_it_cannot_build() -> None:
    make = fast_new(NodeSample)
    with pytest.raises(TypeError):
        make("n1")  # time is required, as for NodeSample(...)
    assert make(node="n1", time=1.0) == NodeSample("n1", 1.0)
    # an implicit default_factory field gets a fresh value per object, as the dataclass does
    a, b = fast_new(NodeDecision), next(args for cls, args, _ in CASES if cls is NodeDecision)
    assert a(*b).envelope == Envelope() and a(*b).envelope is not a(*b).envelope

    @dataclasses.dataclass(frozen=True)
    class Unslotted:
        x: int

    with pytest.raises((TypeError, AttributeError)):
        fast_new(Unslotted)
