"""Rehabilitation effects as data: the actions the lifecycle decides besides drains and resumes.

Input: nothing (types only). Output: frozen action dataclasses, each with a ``kind`` like the actions of
``core/plan.py``, that an executor turns into commands. Unlike ``UpdateNodes`` these are NOT safe to repeat
(a second reboot is a second outage), so the lifecycle emits each of them once, on the transition that
decides it, and never re-asserts them; an executor failure comes back as an event (REMEDIATION_FAILED).

How an executor runs them (the core never does):

| action         | command                                                                              |
|----------------|--------------------------------------------------------------------------------------|
| ResetGpu       | agent request ``reset`` per GPU (``fleetyield-agent reset --gpu N``; nvml: ``nvidia-smi |
|                | --gpu-reset -i N``); ``gpus == ()`` means every GPU of the node                        |
| RebootNode     | ``scontrol reboot Reason=<reason> <node>``: no ``ASAP``, no ``nextstate``, see below    |
| PowerCycle     | Redfish ``ComputerSystem.Reset`` ``PowerCycle`` (Redfish issue; disabled until then)    |
| SubmitCanary   | ``count`` x ``sbatch -w <node> --constraint=fy_canary --exclusive --time=<limit>``      |
|                | ``--job-name=fy_canary_<token> --comment=fy:canary fleetyield-agent check``            |
| CancelCanaries | ``scancel --name=fy_canary_<token>`` (pending or running canaries of an abandoned round) |

Why ``RebootNode`` has no ``ASAP`` and no ``nextstate=RESUME``: the lifecycle only reboots a node that
Slurm already shows DRAINED (by us, no jobs left), so ASAP's extra drain buys nothing, and both ASAP (whose
default ``nextstate`` is UNDRAIN since Slurm 23.x) and ``nextstate=RESUME`` clear the drain when the node
comes back, at a moment we do not choose, with our reason erased: the node would then look exactly like one an
admin resumed. A plain reboot of a drained node keeps DRAIN and our reason; the lifecycle resumes the node
itself, as the CANARY entry, after the agent is fresh again. (To verify on the docker cluster, 22.05.)
"""

from __future__ import annotations

# The classes live in core/plan.py (``Plan.actions`` holds them next to drains and updates); this module is
# their documented home and keeps the names the lifecycle imports.
from slurm_fleetyield.core.plan import (
    CancelCanaries,
    DrainNode,
    PowerCycle,
    RebootNode,
    ResetGpu,
    ResumeNode,
    SubmitCanary,
)

__all__ = [
    "CancelCanaries",
    "LifecycleAction",
    "PowerCycle",
    "RebootNode",
    "RehabAction",
    "ResetGpu",
    "SubmitCanary",
]

RehabAction = ResetGpu | RebootNode | PowerCycle | SubmitCanary | CancelCanaries
LifecycleAction = RehabAction | DrainNode | ResumeNode
"""Everything ``lifecycle.step`` may emit."""
