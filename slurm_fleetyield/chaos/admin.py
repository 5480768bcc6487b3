"""An emulated on-call admin for the A/B's FleetYield arm: approves drain proposals after a fixed delay.

Why: a pre-emptive drain is the one step of the loop that needs a human (the gate, core/gate.py). Without
one the live A/B never drains a degrading node before its fault: the proposal waits, the fault quarantines
the node, the proposal is withdrawn (docs/results.md, "With precursor faults"). The simulator models the
admin as an approval ``human_delay_h`` after the proposal; this is the live counterpart, through the real
gate: a key made with ``fleetyield keygen`` in the controller's container, its public key in the gate's
``authorized_keys``, and every approval a signed envelope submitted by ``fleetyield approve`` to the
controller's listener, exactly as an admin would.

``Admin.step`` (called every ``poll_s`` by ``run``, a thread beside the chaos runner): list the open proposals
(``fleetyield pending --json``), remember when each was first seen, and approve the ones seen at least
``delay_s`` ago. Everything is logged to the chaos log (``admin_seen``, ``admin_approve``), so a run shows
what the admin did and when. The bare arm has no controller and no admin (its drains are the NHC
emulation's, after a job fails).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slurm_fleetyield.chaos.log import ChaosLog
from slurm_fleetyield.chaos.runner import Exec

CONTROLLER = "fleetyield"  # the controller's container
CONFIG = "/etc/fleetyield/fleetyield.toml"
ADMIN_DIR = "/root/fy-chaos-admin"  # the private key: in the controller container, never in the image
AUTHORIZED_KEYS = "/var/lib/fleetyield/admin/authorized_keys"  # [gate] authorized_keys of the cluster config
NAME = "chaos-admin"


def setup_commands() -> list[tuple[str, ...]]:
    """Make the admin's key pair (once) and trust its public key (the gate reads the file per approval)."""
    script = (
        f"set -e; install -d -m 0700 {ADMIN_DIR}; install -d -m 0755 $(dirname {AUTHORIZED_KEYS}); "
        f"[ -s {ADMIN_DIR}/{NAME}.key ] || fleetyield keygen {NAME} --dir {ADMIN_DIR} >/dev/null; "
        f'touch {AUTHORIZED_KEYS}; grep -qxF "$(cat {ADMIN_DIR}/{NAME}.pub)" {AUTHORIZED_KEYS} || '
        f"cat {ADMIN_DIR}/{NAME}.pub >> {AUTHORIZED_KEYS}; chmod 0644 {AUTHORIZED_KEYS}"
    )
    return [("docker", "exec", CONTROLLER, "sh", "-c", script)]


def teardown_commands() -> list[tuple[str, ...]]:
    """Stop trusting the admin's key (the cluster as ``make up`` leaves it: no chaos key in the gate)."""
    script = (
        f"[ -s {ADMIN_DIR}/{NAME}.pub ] && [ -f {AUTHORIZED_KEYS} ] || exit 0; "
        f'grep -vxF "$(cat {ADMIN_DIR}/{NAME}.pub)" {AUTHORIZED_KEYS} > {AUTHORIZED_KEYS}.tmp; '
        f"chmod 0644 {AUTHORIZED_KEYS}.tmp; mv {AUTHORIZED_KEYS}.tmp {AUTHORIZED_KEYS}"
    )
    return [("docker", "exec", CONTROLLER, "sh", "-c", script)]


@dataclass
class Admin:
    exec: Exec
    delay_s: float
    clock: Callable[[], float]
    log: ChaosLog | None = None
    seen: dict[str, float] = field(default_factory=dict)  # proposal id -> first seen (unix time)
    done: set[str] = field(default_factory=set)

    def pending(self) -> list[dict[str, Any]]:
        rc, out = self.exec(
            ("docker", "exec", CONTROLLER, "fleetyield", "pending", "--json", "--config", CONFIG)
        )
        if rc != 0:
            return []  # the controller restarting: nothing to decide on this round
        try:
            rows = json.loads(out)
        except ValueError:
            return []
        return [r for r in rows if isinstance(r, dict) and r.get("status") == "pending" and r.get("id")]

    def step(self) -> list[str]:
        """One round; returns the ids approved in it."""
        now = self.clock()
        approved = []
        for p in self.pending():
            pid = str(p["id"])
            if pid in self.done:
                continue
            if pid not in self.seen:
                self.seen[pid] = now
                self._write({"type": "admin_seen", "t": now, "proposal": pid, "node": p.get("node"),
                             "risk": p.get("risk")})  # fmt: skip
            if now - self.seen[pid] < self.delay_s:
                continue
            argv = ("docker", "exec", CONTROLLER, "fleetyield", "approve", pid, "--key",
                    f"{ADMIN_DIR}/{NAME}.key", "--note", f"chaos ab admin, delay {self.delay_s:g} s",
                    "--config", CONFIG, "--json")  # fmt: skip
            rc, out = self.exec(argv)
            self.done.add(pid)
            if rc == 0:
                approved.append(pid)
            self._write({"type": "admin_approve", "t": self.clock(), "proposal": pid, "node": p.get("node"),
                         "after_s": round(now - self.seen[pid], 1), "rc": rc, "out": out[-300:]})  # fmt: skip
        return approved

    def run(self, stop: threading.Event, poll_s: float = 1.0) -> None:
        while not stop.wait(poll_s):
            self.step()

    def _write(self, rec: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(rec)
