"""Core behaviours the docker closed-loop tests ran into, pinned down without the cluster.

Both were decision-core bugs found by the docker closed-loop tests (drain reason taken from whichever of two
simultaneous findings sorted first; a pushed XID seen again in the next scrape drained a resumed node a second
time); these regression tests pin the fixes without the cluster.
"""

from __future__ import annotations

import random

from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import FatalEvent, GpuReading, NodeSample, Observations, SlurmNode
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.plan import DrainNode
from slurm_fleetyield.core.state import ControllerState

NODE = "gpu-l40s-2"
MODEL = "NVIDIA L40S"


def slurm(states: str = "IDLE", reason: str = "") -> dict[str, SlurmNode]:
    return {NODE: SlurmNode(NODE, frozenset(states.split("+")), reason, ("l40s",), ("l40s",), 100, "l40s", 8)}


HOT = {
    "DCGM_FI_DEV_GPU_TEMP": 90.0,
    "DCGM_FI_DEV_SLOWDOWN_TEMP": 88.0,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0x48,
}
"""A GPU past its slowdown temperature, clocked down by the hardware: present-state evidence."""


def sample(
    t: float, missing: int | None = None, xid79_gpu: int | None = None, hot: int | None = None
) -> dict[str, NodeSample]:
    gpus = tuple(
        GpuReading(
            i,
            f"GPU-{i}",
            MODEL,
            fields=HOT if i == hot else {"DCGM_FI_DEV_GPU_TEMP": 40.0},
            xid_totals={79: 1.0} if i == xid79_gpu else {},
        )
        for i in range(8)
        if i != missing
    )
    return {NODE: NodeSample(NODE, t, gpus, expected_gpus=8)}


def drains(result: object) -> list[DrainNode]:
    return [a for a in result.plan.actions if isinstance(a, DrainNode)]  # type: ignore[attr-defined]


def test_xid_reason_wins_over_gpu_missing_pushed_at_the_same_time() -> None:
    params, rng, t = Params(), random.Random(0), 1000.0
    state = tick(ControllerState.empty(), Observations(t, slurm(), sample(t)), params, t, rng).state
    t += 2
    events = (  # ids chosen so that the gpu_missing event sorts first, as a uuid4 does half the time
        FatalEvent("0a", NODE, t, "gpu_missing", gpu=3, message="GPU fell off the bus (XID 79)"),
        FatalEvent("ff", NODE, t, "xid", gpu=3, xid=79, message="GPU has fallen off the bus"),
    )
    obs = Observations(t, slurm(), sample(t - 2), fatal_events=events)
    (drain,) = drains(tick(state, obs, params, t, rng))
    assert drain.reason.startswith("fleetyield: XID 79"), drain.reason


def test_scraped_xid_already_pushed_does_not_drain_again_after_resume() -> None:
    params, rng, t = Params(), random.Random(0), 1000.0
    state = tick(ControllerState.empty(), Observations(t, slurm(), sample(t)), params, t, rng).state
    # The push: drained at once (the tick reuses the last scrape, as the daemon does on a push).
    t += 1
    pushed = (FatalEvent("e1", NODE, t, "xid", gpu=3, xid=79, message="GPU has fallen off the bus"),)
    result = tick(state, Observations(t, slurm(), sample(t - 1), fatal_events=pushed), params, t, rng)
    assert drains(result)
    state = result.state
    # The admin clears the fault and resumes the node; the next scrape shows the XID 79 total grown.
    t += 1
    result = tick(state, Observations(t, slurm(), sample(t, xid79_gpu=3)), params, t, rng)
    assert not drains(result), [d.reason for d in drains(result)]


# --- Found by the docker rehabilitation tests (tests/integration/test_rehab_gate_ledger.py) ---


def _xid79_quarantine(
    params: Params, rng: random.Random, t: float, *, scrape_missing: int | None = 3
) -> tuple[ControllerState, float]:
    """A healthy node, then XID 79 pushed on GPU 3 (with the reused scrape showing GPU 3 gone, or not yet):
    drained."""
    state = tick(ControllerState.empty(), Observations(t, slurm(), sample(t)), params, t, rng).state
    t += 2
    events = (
        FatalEvent("0a", NODE, t, "gpu_missing", gpu=3, message="GPU fell off the bus (XID 79)"),
        FatalEvent("ff", NODE, t, "xid", gpu=3, xid=79, message="GPU has fallen off the bus"),
    )
    obs = Observations(t, slurm(), sample(t - 2, missing=scrape_missing), fatal_events=events)
    result = tick(state, obs, params, t, rng)
    assert drains(result)
    return result.state, t


def test_lifecycle_cause_is_the_xid_not_the_gpu_missing_seen_with_it() -> None:
    params, rng = Params(), random.Random(0)
    state, _ = _xid79_quarantine(params, rng, 1000.0)
    cause = state.lifecycle[NODE].cause
    assert cause is not None and (cause.kind, cause.xid, cause.gpu) == ("xid", 79, 3), cause
    assert state.lifecycle[NODE].reason.startswith("fleetyield: XID 79 gpu 3"), state.lifecycle[NODE].reason


def test_gpu_missing_seen_when_the_reboot_starts_does_not_block_remediation_ok() -> None:
    from slurm_fleetyield.core.plan import RebootNode, ResumeNode, SubmitCanary

    params, rng = Params(), random.Random(0)
    # The push tick reuses a scrape from before the fault (as the daemon does on a push) ...
    state, t = _xid79_quarantine(params, rng, 1000.0, scrape_missing=None)
    reason = state.lifecycle[NODE].reason
    # ... so the next tick's scrape is the first to show GPU 3 gone: new fatal evidence, recorded at this
    # tick's time, which is also the start of the reboot this tick decides (Slurm shows it drained, empty).
    t += 2
    result = tick(state, Observations(t, slurm("IDLE+DRAIN", reason), sample(t, missing=3)), params, t, rng)
    assert any(isinstance(a, RebootNode) for a in result.plan.actions), result.plan.actions
    state = result.state
    reason = state.lifecycle[NODE].reason
    # Back after the reboot: responding, drained by us, all 8 GPUs in a sample taken after the settle time.
    t += params.lifecycle.reboot_settle_s + 5
    result = tick(state, Observations(t, slurm("IDLE+DRAIN", reason), sample(t)), params, t, rng)
    kinds = {type(a) for a in result.plan.actions}
    assert {ResumeNode, SubmitCanary} <= kinds, result.plan.actions
    assert result.state.lifecycle[NODE].stage.value == "canary"


# --- Found by the chaos A/B smoke run on the docker cluster (slurm_fleetyield/chaos) ---


def test_incident_in_the_tick_the_canary_starts_leaves_the_node_drained_not_resumed() -> None:
    """Back from the reboot after an XID 79, REMEDIATION_OK (resume + canary) and INCIDENT (risk >= red:
    drain) fold in the same tick when the node is red on evidence of the present (a GPU at its slowdown
    temperature, clocked down by the hardware; fault history alone is no incident since issue 27 item 9).
    The resume must not survive the drain (the plan applies drains before lifecycle actions), or the next
    tick reads our own resume as an admin's and puts a red node back in service."""
    from slurm_fleetyield.core.plan import ResumeNode, SubmitCanary

    params = Params.model_validate({"risk": {"red_threshold": 0.03, "yellow_threshold": 0.01}})
    rng = random.Random(0)
    state, t = _xid79_quarantine(params, rng, 1000.0)
    t += 2  # drained and empty: the reboot starts
    obs = Observations(t, slurm("IDLE+DRAIN", state.lifecycle[NODE].reason), sample(t, missing=3))
    result = tick(state, obs, params, t, rng)
    assert result.state.lifecycle[NODE].stage.value == "remediating", result.state.lifecycle[NODE]
    state, reason = result.state, result.state.lifecycle[NODE].reason
    t += params.lifecycle.reboot_settle_s + 5
    result = tick(state, Observations(t, slurm("IDLE+DRAIN", reason), sample(t, hot=5)), params, t, rng)
    assert any(e.message.startswith("remediation_ok") for e in result.events), result.events
    assert result.risks[NODE].probability >= params.risk.red_threshold  # the premise: red
    kinds = [type(a) for a in result.plan.actions if getattr(a, "node", NODE) == NODE]
    assert result.state.lifecycle[NODE].stage.value == "quarantined", result.state.lifecycle[NODE]
    assert DrainNode in kinds and ResumeNode not in kinds and SubmitCanary not in kinds, kinds
    # next tick: still drained by us (the drain applied), so no "admin resumed", no return to service
    state, reason = result.state, result.state.lifecycle[NODE].reason
    t += 2
    result = tick(state, Observations(t, slurm("IDLE+DRAIN", reason), sample(t)), params, t, rng)
    assert result.state.lifecycle[NODE].stage.value != "in_service", result.state.lifecycle[NODE]
