"""contrib/redfish/power_bridge.py: emulated power state -> docker kill/start, through a fake docker seam."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

from bmc_rig import PASSWORD, ROOT, USER, Emulator, make_config, make_controller

from slurm_fleetyield.adapters.redfish import PowerOp


def load_bridge():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "power_bridge", ROOT / "contrib" / "redfish" / "power_bridge.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeDocker:
    def __init__(self, running: dict[str, bool]) -> None:
        self.running = running
        self.calls: list[tuple[str, ...]] = []
        self.copied: dict[str, str] = {}  # "container:path" -> content

    def __call__(self, args: Sequence[str]) -> tuple[int, str]:
        self.calls.append(tuple(args))
        verb, name = args[0], args[-1]
        if verb == "cp":  # docker cp SRC CONTAINER:PATH, into a stopped container
            if self.running.get(name.split(":", 1)[0]) is not False:
                return 1, f"Error: No such container or not stopped: {name}"
            self.copied[name] = Path(args[1]).read_text()
            return 0, ""
        if name not in self.running:
            return 1, f"Error: No such container: {name}"
        if verb == "inspect":
            return 0, "true" if self.running[name] else "false"
        self.running[name] = verb == "start"
        return 0, name


def test_off_kills_on_starts_transitions_wait() -> None:
    bridge_mod = load_bridge()
    power = {"sys-1": "On", "sys-2": "On", "sys-3": "PoweringOff"}
    docker = FakeDocker({"c1": True, "c2": True, "c3": True})
    bridge = bridge_mod.PowerBridge({"sys-1": "c1", "sys-2": "c2", "sys-3": "c3"}, power.__getitem__, docker)
    assert bridge.sync_once() == []
    power["sys-1"] = "Off"
    assert bridge.sync_once() == [("c1", "kill")]
    # the node's entrypoint reads it at the next start: GPUs power-cycled, slurmd -b
    (marker,) = docker.copied
    assert marker == f"c1:{bridge_mod.POWER_LOST}"
    assert docker.copied[marker].startswith("system sys-1 off at ")
    assert bridge.sync_once() == []  # idempotent: already stopped
    power["sys-1"] = "PoweringOn"
    assert bridge.sync_once() == []
    power["sys-1"] = "On"
    assert bridge.sync_once() == [("c1", "start")]
    assert docker.running == {"c1": True, "c2": True, "c3": True}


def test_missing_container_and_unreadable_bmc_are_skipped() -> None:
    bridge_mod = load_bridge()

    def read(system: str) -> str:
        if system == "sys-down":
            raise ConnectionError("emulator down")
        return "Off"

    docker = FakeDocker({"c1": True})
    bridge = bridge_mod.PowerBridge({"sys-down": "c1", "sys-2": "ghost"}, read, docker)
    assert bridge.sync_once() == []
    assert docker.running == {"c1": True}


def test_against_the_emulator(emulator: Emulator, creds_file: Path) -> None:
    bridge_mod = load_bridge()
    node = "gpu-12"
    docker = FakeDocker({"slurm-gpu-12": True})
    read = bridge_mod.sushy_reader(emulator.url, USER, PASSWORD)
    bridge = bridge_mod.PowerBridge({emulator.systems[node]: "slurm-gpu-12"}, read, docker)
    pc = make_controller(make_config(emulator, creds_file))
    pc.act(node, PowerOp.POWER_OFF)
    assert bridge.sync_once() == [("slurm-gpu-12", "kill")]
    pc.act(node, PowerOp.POWER_ON)
    assert bridge.sync_once() == [("slurm-gpu-12", "start")]
