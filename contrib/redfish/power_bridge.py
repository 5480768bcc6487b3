#!/usr/bin/env python3
"""Power bridge: emulated BMC power state -> node container, for the docker Slurm cluster.

Input: a sushy-emulator (``contrib/redfish/fake_bmc.py``) with one fake system per node, a map system id ->
container name, a ``docker`` command. Output: ``docker kill`` of a node's container when its system is Off
(a power cut: slurmd and the agent die with it, nothing shuts down cleanly) and ``docker start`` when it is
On again (the entrypoint brings munge, slurmd and the agent back, the node re-registers with slurmctld).

Polling, not notification: the fake driver applies a power change only when the system is read, so the
bridge's reads are also what moves the emulated hardware along. A restart shows Off for the driver's delay
(``FLEETYIELD_FAKE_DELAY_S``): poll faster than that or the bridge never sees it.

    python3 contrib/redfish/power_bridge.py --url http://127.0.0.1:8000 --credentials-file creds \
        --map 27946b59-...=slurm-c1 --map 5cc4...=slurm-c2 --interval 0.5
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("fleetyield.power_bridge")

Docker = Callable[[Sequence[str]], tuple[int, str]]
"""``docker(args) -> (returncode, stdout)``: the seam tests replace."""


def run_docker(args: Sequence[str]) -> tuple[int, str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60, check=False)
    return proc.returncode, proc.stdout.strip() or proc.stderr.strip()


class PowerBridge:
    def __init__(
        self, mapping: Mapping[str, str], read_power: Callable[[str], str], docker: Docker = run_docker
    ) -> None:
        self.mapping = dict(mapping)  # system id -> container
        self.read_power = read_power
        self.docker = docker

    def running(self, container: str) -> bool | None:
        rc, out = self.docker(["inspect", "-f", "{{.State.Running}}", container])
        return None if rc != 0 else out.strip() == "true"

    def sync_once(self) -> list[tuple[str, str]]:
        """Make every container match its system's power state; returns the (container, verb) done."""
        done: list[tuple[str, str]] = []
        for system, container in sorted(self.mapping.items()):
            try:
                power = self.read_power(system)
            except Exception as exc:  # emulator down: leave the containers as they are
                log.warning("cannot read power of %s: %s", system, exc)
                continue
            running = self.running(container)
            if running is None:
                log.warning("container %s not found", container)
                continue
            verb = None
            if power == "Off" and running:
                verb = "kill"
            elif power == "On" and not running:
                verb = "start"
            if verb is None:
                continue  # PoweringOn/PoweringOff and matching states: nothing to do
            rc, out = self.docker([verb, container])
            if rc == 0:
                log.info("system %s is %s: docker %s %s", system, power, verb, container)
                done.append((container, verb))
            else:
                log.error("docker %s %s failed: %s", verb, container, out)
        return done

    def run(self, interval_s: float, should_stop: Callable[[], bool] = lambda: False) -> None:
        while not should_stop():
            self.sync_once()
            time.sleep(interval_s)


def sushy_reader(url: str, username: str, password: str) -> Callable[[str], str]:
    import sushy
    from sushy import auth

    root = sushy.Sushy(url, auth=auth.BasicAuth(username=username, password=password), read_timeout=10)

    def read(system: str) -> str:
        s = root.get_system(f"/redfish/v1/Systems/{system}")
        return str(getattr(s.power_state, "value", s.power_state))

    return read


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="emulator base URL")
    ap.add_argument("--credentials-file", required=True, help="line 1 user, line 2 password (0600)")
    ap.add_argument("--map", action="append", default=[], metavar="SYSTEM=CONTAINER", required=True)
    ap.add_argument("--interval", type=float, default=0.5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with open(args.credentials_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    mapping = dict(m.split("=", 1) for m in args.map)
    PowerBridge(mapping, sushy_reader(args.url, lines[0].strip(), lines[1])).run(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
