"""kill -9 at every action boundary: no GPU reset, reboot or power cycle happens twice (issue 27 item 3).

A daemon with the real store, core and executor drives three nodes through quarantine into remediation: XID
48 (ladder: GPU reset through the agent), XID 79 (ladder: ``scontrol reboot``) and XID 119 (ladder: a power
cycle through the BMC, the real ``RedfishExecutor`` over ``Bmc``). The world (Slurm's answers, the agent, the
BMCs) outlives the controller: ``World`` answers ``scontrol`` like Slurm 22.05 (a drain sets DRAIN and the
reason, a reboot sets REBOOT_REQUESTED, then the node comes back with a new BootTime; a power cycle shows a
new BootTime only once the node has booted, ``BOOT_S`` later: a controller restarted before that sees no
sign of it) and ``Agent`` resets GPUs, refusing a request id it has executed (409), as
``node_agent/remote.py`` does. The crash seam raises ``Crash`` (a BaseException, as a kill -9 is no
exception the daemon may catch) before or after each boundary: recording an intent, each agent request,
each Slurm write, each BMC power cycle, recording a result, the tick's commit. The store is then dropped
without a commit (what SQLite keeps of a killed process) and a new daemon starts on it. Every boundary of a
clean run is a crash point, each crash point once before and once after its call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rig import FakeCommands, node_line

from slurm_fleetyield.adapters.agent_control import AgentControlError
from slurm_fleetyield.adapters.redfish import RedfishExecutor
from slurm_fleetyield.adapters.slurm import CommandResult, SlurmCli
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.config import from_mapping
from slurm_fleetyield.core.model import FatalEvent, GpuReading, NodeSample
from slurm_fleetyield.daemon import Daemon

T0 = 1_800_000_000.0
STEP_S = 60.0
TICKS = 20
NODES = ("gpu-a", "gpu-b", "gpu-c")  # XID 48 -> GPU reset; XID 79 -> reboot; XID 119 -> BMC power cycle
BOOT_S = 3 * STEP_S  # a power-cycled node's new BootTime shows in Slurm this long after the cycle


class Crash(BaseException):
    """A kill -9 at a boundary: nothing after it runs, nothing catches it."""


class Seam:
    """Counts boundaries; raises ``Crash`` at boundary number ``at`` (0: never)."""

    def __init__(self, at: int = 0) -> None:
        self.at, self.count, self.crashed = at, 0, ""

    def __call__(self, where: str) -> None:
        self.count += 1
        if self.count == self.at:
            self.crashed = where
            raise Crash(where)

    def around(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self(f"before {name}")
            out = fn(*args, **kwargs)
            self(f"after {name}")
            return out

        return wrapped


class World(FakeCommands):
    """Slurm as it acts on the commands: drains, resumes, reboots (REBOOT_REQUESTED, then back with a later
    BootTime once the controller has read it twice)."""

    def __init__(self, clock: Callable[[], float], seam: Seam) -> None:
        super().__init__()
        self.clock, self.seam = clock, seam
        self.state = {n: ("IDLE", "") for n in NODES}
        self.boot = {n: T0 - 86_400 for n in NODES}
        self.reboots: list[str] = []
        self.rebooting: dict[str, int] = {}
        self.power_cycles: list[str] = []
        self.booting: dict[str, float] = {}  # power-cycled node -> when Slurm shows its new BootTime

    def power_cycle(self, node: str) -> None:
        self.power_cycles.append(node)
        self.booting[node] = self.clock() + BOOT_S

    def _line(self, n: str) -> str:
        state, reason = self.state[n]
        boot = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.boot[n]))
        line = node_line(n, state) + f" BootTime={boot}"
        return line + (f" Reason={reason} [root@2026-01-12T10:00:00]" if reason else "")

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = tuple(argv)
        if argv[:3] == ("scontrol", "show", "node"):
            for n, reads in list(self.rebooting.items()):
                if reads >= 2:  # back: flags gone, drain and reason kept, a new boot time
                    del self.rebooting[n]
                    self.boot[n] = self.clock()
                    self.state[n] = ("IDLE+DRAIN", self.state[n][1])
                else:
                    self.rebooting[n] = reads + 1
            for n, at in list(self.booting.items()):
                if self.clock() >= at:
                    del self.booting[n]
                    self.boot[n] = at
            self.nodes = {n: self._line(n) for n in NODES}
        if argv[:2] == ("scontrol", "reboot"):
            self.seam("before scontrol reboot")
            node = argv[-1]
            self.reboots.append(node)
            self.state[node] = ("IDLE+DRAIN+REBOOT_REQUESTED", self.state[node][1])
            self.rebooting[node] = 0
            out = super().__call__(argv, timeout_s)
            self.seam("after scontrol reboot")
            return out
        if argv[:1] == ("sbatch",) or argv[0].endswith("sbatch"):
            return CommandResult(0, "4242\n", "")
        return super().__call__(argv, timeout_s)

    def on_update(self, argv: tuple[str, ...]) -> None:
        node = argv[2].removeprefix("NodeName=")
        if node not in self.state:
            return
        if "State=DRAIN" in argv:
            reason = next(a for a in argv if a.startswith("Reason=")).removeprefix("Reason=")
            self.state[node] = ("IDLE+DRAIN", reason)
        elif "State=RESUME" in argv:
            self.state[node] = ("IDLE", "")


class Agent:
    """The agent's side of ``AgentControl``: resets, refusing an executed request id a second time."""

    def __init__(self, seam: Seam) -> None:
        self.seam = seam
        self.executed: list[tuple[str, str]] = []

    def request(self, node: str, gpus: Sequence[int], request_id: str | None = None) -> tuple[str, bytes]:
        return f"http://{node}:9400/v1/control/reset", f'{{"request_id": "{request_id}"}}'.encode()

    def reset(self, node: str, gpus: Sequence[int], request_id: str | None = None) -> dict[str, Any]:
        self.seam("before agent reset")
        if (node, request_id) in self.executed:
            raise AgentControlError(node, "url", f"HTTP 409: request_id {request_id} was already used", 409)
        self.executed.append((node, str(request_id)))
        self.seam("after agent reset")
        return {"gpus": list(gpus)}


class Bmc:
    """What ``RedfishExecutor`` drives (``PowerController``'s admit and perform): a power cycle reboots the
    node in ``World``. Run in the tick's thread (``spawn``), so a kill -9 ends it with the tick."""

    def __init__(self, world: World, seam: Seam) -> None:
        self.world, self.seam = world, seam
        self.config = SimpleNamespace(enabled=True, bmc_for=lambda n: SimpleNamespace(address=f"{n}-bmc"))

    def admit(self, node: str, op: Any, *, reason: str = "") -> tuple[str, Any]:
        return (node, op)

    def perform(self, admitted: tuple[str, Any]) -> Any:
        self.seam("before bmc power cycle")
        self.world.power_cycle(admitted[0])
        self.seam("after bmc power cycle")
        return SimpleNamespace(duration_s=42.0, power_state="On")


class Sense:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def sample(self, nodes: Sequence[str], now: float) -> Mapping[str, NodeSample]:
        temp = {"DCGM_FI_DEV_GPU_TEMP": 40.0}
        gpus = tuple(GpuReading(i, f"GPU-{i}", "h100", fields=temp) for i in range(8))
        return {n: NodeSample(n, now, gpus, expected_gpus=8) for n in nodes}


def run(tmp: Path, at: int) -> tuple[World, Agent, Seam, Store]:
    clock_now = [T0]

    def clock() -> float:
        return clock_now[0]

    seam = Seam(at)
    world, agent, sense = World(clock, seam), Agent(seam), Sense(clock)
    cfg = from_mapping(
        {
            "store": {"path": str(tmp / "fy.db")},
            "loop": {"interval_s": STEP_S, "seed": 1},
            "api": {"enabled": False},
            "core": {
                "quarantine": {"drain_cap_min_nodes": len(NODES)},
                "lifecycle": {"power_cycle_enabled": True, "ladders": {"xid_119": ["power_cycle"]}},
            },
            "redfish": {  # the BMCs are ``Bmc``: never read
                "enabled": True,
                "address_template": "https://{node}-bmc",
                "credentials_file": str(tmp / "bmc.cred"),
            },
        }
    )
    first = Store(cfg.store.path)
    first.put_events(
        [
            FatalEvent("ev-a", "gpu-a", T0, "xid", gpu=2, xid=48, message="double-bit ECC"),
            FatalEvent("ev-b", "gpu-b", T0, "xid", gpu=1, xid=79, message="fell off the bus"),
            FatalEvent("ev-c", "gpu-c", T0, "xid", gpu=0, xid=119, message="GSP timeout"),
        ],
        received_at=T0,
    )
    first.close()
    daemon: Daemon | None = None
    ticks = 0
    while ticks < TICKS or daemon is None:  # a crash in the last tick: restart and tick once more
        ticks += 1
        clock_now[0] += STEP_S
        if daemon is None:  # (re)start from what the store holds
            store = Store(cfg.store.path)
            for name in ("record_intent", "mark_intent", "finish_intent", "commit_tick"):
                if hasattr(store, name):  # (the intents are the fix: today's store has none)
                    setattr(store, name, seam.around(name, getattr(store, name)))
            redfish = RedfishExecutor(Bmc(world, seam), spawn=lambda fn: fn())  # type: ignore[arg-type]
            slurm = SlurmCli(runner=world)
            daemon = Daemon(cfg, slurm, sense, store, clock=clock, control=agent, redfish=redfish)  # type: ignore[arg-type]
        try:
            daemon.tick_once()
        except Crash:
            daemon.store.close()  # uncommitted work is lost, as SQLite loses it for a killed process
            daemon = None
    return world, agent, seam, daemon.store


MAYBE_SENT = ("after mark_intent", "before bmc power cycle")
"""Crash points between recording that a power cycle goes to the BMC and the BMC acting: whether it acted
cannot be known (a request in flight), so it is done at most once: never repeated, maybe never done."""


def check(world: World, agent: Agent, store: Store, at: int, crashed: str = "") -> None:
    where = f"crash point {at} ({crashed})"
    assert world.reboots == ["gpu-b"], f"{where}: reboots {world.reboots}"
    cycles = (["gpu-c"], []) if crashed in MAYBE_SENT else (["gpu-c"],)
    assert world.power_cycles in cycles, f"{where}: power cycles {world.power_cycles}"
    assert [n for n, _ in agent.executed] == ["gpu-a"], f"{where}: resets {agent.executed}"
    assert all(rid.startswith("rst-") for _, rid in agent.executed)
    assert store.pending() == [], f"{where}: inbox events not processed"
    rows = store.events(limit=10_000)
    for kind in ("reset_gpu", "reboot", "power_cycle"):  # 0 lost rows: each action's applied row is logged
        assert any(r["kind"] == "applied" and r["data"].get("action") == kind for r in rows), (where, kind)
    state = store.load_state()
    assert state is not None
    for node in NODES:  # the remediations took effect and were judged: both nodes are past REMEDIATING
        stage = state.state.lifecycle[node].stage.value
        assert stage in ("canary", "probation", "in_service"), f"{where}: {node} in {stage}"


def test_clean_run_resets_reboots_and_power_cycles_once(tmp_path: Path) -> None:
    world, agent, _seam, store = run(tmp_path, 0)
    check(world, agent, store, 0)
    store.close()


def test_kill_9_at_every_action_boundary_repeats_no_reset_reboot_or_power_cycle(tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    clean.mkdir()
    _, _, seam, store = run(clean, 0)
    store.close()
    boundaries = seam.count
    assert boundaries >= 50, f"{boundaries} boundaries: fewer than the 50 crash points required"
    crashed_at: set[str] = set()
    for at in range(1, boundaries + 1):
        tmp = tmp_path / f"at{at}"
        tmp.mkdir()
        world, agent, seam, store = run(tmp, at)
        crashed_at.add(seam.crashed)
        check(world, agent, store, at, seam.crashed)
        store.close()
    acts = ("agent reset", "scontrol reboot", "bmc power cycle")
    for where in ("record_intent", "mark_intent", *acts, "finish_intent", "commit_tick"):
        assert {f"before {where}", f"after {where}"} <= crashed_at, (where, sorted(crashed_at))


def test_the_reset_request_id_is_the_intent_s() -> None:
    from slurm_fleetyield.executor import reset_request_id

    assert reset_request_id("n/1.0/1/gpu_reset") == reset_request_id("n/1.0/1/gpu_reset")
    assert reset_request_id("n/1.0/1/gpu_reset") != reset_request_id("n/1.0/2/gpu_reset")


@pytest.mark.parametrize("flags", ["REBOOT_REQUESTED", "REBOOT_ISSUED"])
def test_an_unfinished_reboot_intent_is_not_repeated_when_slurm_shows_it(tmp_path: Path, flags: str) -> None:
    from slurm_fleetyield.core.plan import Plan, RebootNode
    from slurm_fleetyield.executor import Executor

    world = World(lambda: T0, Seam())
    world.state["gpu-b"] = (f"IDLE+DRAIN+{flags}", "fleetyield: XID 79")
    store = Store(tmp_path / "fy.db")
    action = RebootNode("gpu-b", "fleetyield: XID 79", intent="gpu-b/1.0/1/reboot")
    store.record_intent(action.intent, "gpu-b", "reboot", T0 - 5)  # recorded, then the kill -9
    world.nodes = {n: world._line(n) for n in NODES}
    report = Executor(SlurmCli(runner=world), store).apply(Plan((action,)), T0)
    assert world.reboots == [] and report.results[0].ok and flags in report.results[0].detail
    again = Executor(SlurmCli(runner=world), store).apply(Plan((action,)), T0 + 60)
    assert world.reboots == [] and again.results[0].detail.startswith("not repeated: done at")
    store.close()


@pytest.mark.parametrize("sent", [True, False])
def test_an_unfinished_power_cycle_intent_is_started_only_if_it_never_reached_the_bmc(
    tmp_path: Path, sent: bool
) -> None:
    """Marked sent: the BMC may have cycled the node, which Slurm shows only once it has booted; reported
    ok (outcome unknown: the node's samples judge it), not repeated. Not marked: started now."""
    from slurm_fleetyield.core.plan import Plan, PowerCycle
    from slurm_fleetyield.executor import POWER_CYCLE_SENT, Executor

    seam = Seam()
    world = World(lambda: T0, seam)
    world.state["gpu-c"] = ("IDLE+DRAIN", "fleetyield: XID 119")
    world.nodes = {n: world._line(n) for n in NODES}
    store = Store(tmp_path / "fy.db")
    action = PowerCycle("gpu-c", "fleetyield: XID 119", "gpu-c/1.0/1/power_cycle")
    store.record_intent(action.intent, "gpu-c", "power_cycle", T0 - 5)  # recorded, then the kill -9
    if sent:
        store.mark_intent(action.intent, POWER_CYCLE_SENT)
    redfish = RedfishExecutor(Bmc(world, seam), spawn=lambda fn: fn())  # type: ignore[arg-type]
    report = Executor(SlurmCli(runner=world), store, redfish=redfish).apply(Plan((action,)), T0)
    (result,) = report.results
    assert world.power_cycles == ([] if sent else ["gpu-c"]) and result.ok, result.detail
    assert ("outcome unknown" in result.detail) is sent
    store.close()
