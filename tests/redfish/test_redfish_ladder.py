"""What the lead wires: the lifecycle's power_cycle rung, and failing BMCs escalating to NEEDS_HUMAN.

The Redfish executor reports a failed power cycle as ``ActionResult(ok=False)`` of kind ``power_cycle``; the
daemon feeds it back as a ``FailedAction`` and ``core/rehab.py`` turns it into REMEDIATION_FAILED. These
tests drive ``lifecycle.step`` with those events, the way the tick does.
"""

from __future__ import annotations

from slurm_fleetyield.core.lifecycle import (
    DRAINED_STAGES,
    Event,
    EventKind,
    LifecycleMemory,
    LifecycleParams,
    Remediation,
    Stage,
    step,
)
from slurm_fleetyield.core.plan import DrainNode, PowerCycle, RebootNode
from slurm_fleetyield.core.rehab import REMEDIATION_KINDS

NODE = "gpu-01"


def run(p: LifecycleParams, failures: int) -> list[tuple[Stage, tuple[str, ...]]]:
    t = 1000.0
    m = step(LifecycleMemory(NODE), Event.fatal("xid", xid=79, gpu=3), t, p).memory
    tr = step(m, Event(EventKind.DRAINED), t + 30, p)
    trail = [(tr.memory.stage, tuple(a.kind for a in tr.actions))]
    for i in range(failures):
        detail = "power_cycle: BmcUnreachable: power_cycle on gpu-01 via https://gpu-01-bmc: refused"
        tr = step(tr.memory, Event(EventKind.REMEDIATION_FAILED, detail=detail), t + 60 * (i + 2), p)
        trail.append((tr.memory.stage, tuple(a.kind for a in tr.actions)))
    return trail


def test_power_cycle_rung_follows_the_reboot_when_enabled() -> None:
    p = LifecycleParams(power_cycle_enabled=True)
    trail = run(p, 3)
    assert trail == [
        (Stage.REMEDIATING, ("drain", "reboot")),
        (Stage.REMEDIATING, ("drain", "power_cycle")),  # reboot failed: the BMC's turn
        (Stage.REMEDIATING, ("drain", "power_cycle")),  # last rung repeated
        (Stage.NEEDS_HUMAN, ("drain",)),  # max_remediation_attempts (3) spent
    ]
    assert all(stage in DRAINED_STAGES for stage, _ in trail)  # never resumed on a failing BMC


def test_disabled_power_cycle_never_emits_one() -> None:
    trail = run(LifecycleParams(power_cycle_enabled=False), 3)
    assert all("power_cycle" not in kinds for _, kinds in trail)
    assert trail[-1][0] is Stage.NEEDS_HUMAN


def test_needs_human_reason_names_every_failed_rung() -> None:
    p = LifecycleParams(power_cycle_enabled=True, max_remediation_attempts=2)
    t = 0.0
    m = step(LifecycleMemory(NODE), Event.fatal("xid", xid=79), t, p).memory
    m = step(m, Event(EventKind.DRAINED), t, p).memory
    m = step(m, Event(EventKind.REMEDIATION_FAILED), t, p).memory
    tr = step(m, Event(EventKind.REMEDIATION_FAILED), t, p)
    assert tr.memory.stage is Stage.NEEDS_HUMAN
    drain = tr.actions[-1]
    assert isinstance(drain, DrainNode) and "reboot: failed, power_cycle: failed" in drain.reason


def test_system_that_never_comes_back_times_out_into_escalation() -> None:
    p = LifecycleParams(power_cycle_enabled=True, ladders={"xid_79": ("power_cycle",)})
    m = step(LifecycleMemory(NODE), Event.fatal("xid", xid=79), 0.0, p).memory
    tr = step(m, Event(EventKind.DRAINED), 0.0, p)
    assert isinstance(tr.actions[-1], PowerCycle)
    deadline = tr.memory.attempts[-1].deadline
    assert deadline == p.remediation_timeout_s[Remediation.POWER_CYCLE] == 1200.0
    tr = step(tr.memory, Event(EventKind.TICK), deadline, p)  # the BMC said On, the node never re-registered
    assert tr.memory.stage is Stage.REMEDIATING and tr.memory.attempts[0].outcome == "timeout"
    assert isinstance(tr.actions[-1], PowerCycle)


def test_failed_power_cycles_are_remediation_failures() -> None:
    assert "power_cycle" in REMEDIATION_KINDS
    assert PowerCycle(NODE, "r").kind == "power_cycle" and RebootNode(NODE, "r").kind == "reboot"
