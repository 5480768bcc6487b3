"""The simulator and the live controller decide the same thing for the same observations.

One observation stream is recorded from a simulated fleet with faults and precursors; it is then fed (a)
through ``sim.runner.controller_step`` as the simulator runs it and (b) through ``Daemon.tick_once`` of
``slurm_fleetyield.daemon`` (real SQLite store, pending events through its inbox, the same clock and rng). The
plans, decisions and states must be identical tick by tick.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path

from sim.fleets import fault_heavy
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.config import from_mapping
from slurm_fleetyield.core.model import FatalEvent, JobView, NodeSample, SlurmNode
from slurm_fleetyield.core.plan import Plan
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.daemon import Daemon
from slurm_fleetyield.ports import ApplyReport
from slurm_fleetyield.sim import runner


class Replay:
    """A SlurmPort + SensePort that replays recorded frames and records the plans it is given."""

    def __init__(
        self,
        frames: Sequence[
            tuple[
                float,
                Mapping[str, SlurmNode],
                tuple[JobView, ...],
                Mapping[str, NodeSample],
                tuple[FatalEvent, ...],
            ]
        ],
    ) -> None:
        self.frames = frames
        self.i = 0
        self.plans: list[Plan] = []

    def read_nodes(self) -> Mapping[str, SlurmNode]:
        return self.frames[self.i][1]

    def read_jobs(self) -> Sequence[JobView]:
        return self.frames[self.i][2]

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]:
        return {n: self.frames[self.i][3][n] for n in nodes if n in self.frames[self.i][3]}

    def apply(self, plan: Plan) -> ApplyReport:
        self.plans.append(plan)
        return ApplyReport()


def record_steps(sim: runner.Simulation) -> list:
    """Run ``sim`` and return (now, nodes, jobs, samples, pending fatal events, gate decisions) of every
    controller step it made."""
    frames: list = []
    original = runner.controller_step

    def spy(state, slurm, samples, pending, params, now, rng, gate_decisions=()):  # type: ignore[no-untyped-def]
        frames.append(
            (
                now,
                dict(slurm.read_nodes()),
                tuple(slurm.read_jobs()),
                dict(samples),
                tuple(pending),
                tuple(gate_decisions),
            )
        )
        return original(state, slurm, samples, pending, params, now, rng, gate_decisions)

    runner.controller_step = spy  # type: ignore[assignment]
    try:
        sim.run()
    finally:
        runner.controller_step = original  # type: ignore[assignment]
    return frames


def record(n_frames: int = 40) -> list:
    frames = [f[:5] for f in record_steps(fault_heavy(nodes=12, days=6, seed=3))]
    assert any(f[4] for f in frames), "the recorded stream must contain pushed fatal events"
    return frames[:n_frames] + [f for f in frames[n_frames:] if f[4]][:5]


class ReplayAgents:
    """The agents of the replayed world: the simulator's cluster applies GPU resets as part of the plan and
    they always take effect, so the daemon's agent-control client must see them succeed as well (otherwise
    the daemon feeds a FailedAction back into the next tick and the two runs legitimately diverge)."""

    def __init__(self) -> None:
        self.resets: list[tuple[str, tuple[int, ...]]] = []

    def request(self, node: str, gpus: Sequence[int], request_id: str | None = None) -> tuple[str, bytes]:
        return f"replay://{node}/v1/control/reset", repr((node, tuple(gpus))).encode()

    def reset(self, node: str, gpus: Sequence[int], request_id: str | None = None) -> dict[str, object]:
        self.resets.append((node, tuple(gpus)))
        return {"ok": True, "gpus": list(gpus)}


def test_sim_step_and_daemon_tick_decide_the_same(tmp_path: Path) -> None:
    frames = record()
    # (a) as the simulator runs it
    port_a = Replay(frames)
    state = ControllerState.empty()
    rng_a = random.Random(11)
    sim_results = []
    for i, (now, _n, _j, samples, pending) in enumerate(frames):
        port_a.i = i
        r = runner.controller_step(state, port_a, samples, pending, runner.Params(), now, rng_a)
        state = r.state
        sim_results.append(r)
    # (b) as the daemon runs it
    port_b = Replay(frames)
    config = from_mapping({"sense": {"gpu_nodes_only": False}, "loop": {"push_reuse_samples_s": 0}})
    store = Store(tmp_path / "fy.db")
    clock = {"t": 0.0}
    agents = ReplayAgents()
    daemon = Daemon(
        config,
        port_b,
        port_b,
        store,
        clock=lambda: clock["t"],
        monotonic=lambda: 0.0,
        rng=random.Random(11),
        control=agents,  # type: ignore[arg-type]
    )
    for i, (now, _n, _j, _s, pending) in enumerate(frames):
        port_b.i = i
        clock["t"] = now
        store.put_events(list(pending), received_at=now)
        out = daemon.tick_once(push=bool(pending))
        a = sim_results[i]
        assert out.result.plan == a.plan, f"tick {i} at {now}: plans differ"
        assert dict(out.result.nodes) == dict(a.nodes), f"tick {i}: decisions differ"
        assert out.result.state == a.state, f"tick {i}: states differ"
    assert port_a.plans == port_b.plans
    assert any(p.of_kind("drain") for p in port_a.plans), "the stream must exercise a drain"
