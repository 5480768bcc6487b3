#!/usr/bin/env python3
"""Power bridge: emulated BMC power state -> node container, for the docker Slurm cluster.

Input: a sushy-emulator (``contrib/redfish/fake_bmc.py``) with one fake system per node, a map system id ->
container name, a ``docker`` command. Output: ``docker kill`` of a node's container when its system is Off
(a power cut: slurmd and the agent die with it, nothing shuts down cleanly) and ``docker start`` when it is
On again (the entrypoint brings munge, slurmd and the agent back, the node re-registers with slurmctld).

What the cut does to the GPUs: right after the kill the bridge copies a marker (``POWER_LOST``, the
system's power state and the time) into the stopped container; the cluster's entrypoint finds it at the next
start and power-cycles every fake GPU before the agent starts (a GPU that fell off the bus is back after a
cold boot), and starts slurmd with ``-b`` so that slurmctld sees a new boot time, as after a real power cycle.

Polling, not notification: the fake driver applies a power change only when the system is read, so the
bridge's reads are also what moves the emulated hardware along. A restart shows Off for the driver's delay
(``FLEETYIELD_FAKE_DELAY_S``): poll faster than that or the bridge never sees it.

    python3 contrib/redfish/power_bridge.py --url http://127.0.0.1:8000 --credentials-file creds \
        --map 27946b59-...=slurm-c1 --map 5cc4...=slurm-c2 --interval 0.5 [--docker /usr/bin/docker]
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger("fleetyield.power_bridge")

Docker = Callable[[Sequence[str]], tuple[int, str]]
"""``docker(args) -> (returncode, stdout)``: the seam tests replace."""
POWER_LOST = "/var/spool/fleetyield/power-lost"
"""Marker the cluster's entrypoint reads at start (docker/entrypoint.sh): the node lost power."""


def docker_cli(binary: str = "docker") -> Docker:
    def run(args: Sequence[str]) -> tuple[int, str]:
        proc = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)
        return proc.returncode, proc.stdout.strip() or proc.stderr.strip()

    return run


run_docker = docker_cli()


class PowerBridge:
    def __init__(
        self,
        mapping: Mapping[str, str],
        read_power: Callable[[str], str],
        docker: Docker = run_docker,
        *,
        marker: str | None = POWER_LOST,
    ) -> None:
        self.mapping = dict(mapping)  # system id -> container
        self.read_power = read_power
        self.docker = docker
        self.marker = marker  # None: the containers are not told (plain kill/start)

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
                if verb == "kill" and self.marker:
                    self._mark_power_lost(system, container)
            else:
                log.error("docker %s %s failed: %s", verb, container, out)
        return done

    def _mark_power_lost(self, system: str, container: str) -> None:
        fd, path = tempfile.mkstemp(prefix="power-lost-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"system {system} off at {time.time():.3f}\n")
            os.chmod(path, 0o644)
            rc, out = self.docker(["cp", path, f"{container}:{self.marker}"])
            if rc != 0:  # the node then boots with the GPUs as they were: the ladder will see it
                log.error("cannot mark %s as powered off: %s", container, out)
        finally:
            os.unlink(path)

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
    ap.add_argument("--docker", default="docker", help="docker client binary")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with open(args.credentials_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    mapping = dict(m.split("=", 1) for m in args.map)
    reader = sushy_reader(args.url, lines[0].strip(), lines[1])
    PowerBridge(mapping, reader, docker_cli(args.docker)).run(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
