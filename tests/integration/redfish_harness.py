"""The BMC side of the docker cluster for ``test_redfish_ladder.py``: a real Redfish server, a power bridge.

Where they run: on the docker host, beside the cluster. ``Bmc`` starts sushy-tools' sushy-emulator
(``contrib/redfish/fake_bmc.py``: the fake systems driver, HTTP basic auth from a bcrypt htpasswd) bound to
the compose network's gateway address, so the controller in the ``fleetyield`` container reaches it as
``http://<gateway>:<port>`` and nothing outside the host does. One emulated system per docker node (named
after it), plus ``<node>-nopost`` systems that accept power-on but never come back On (a board that does not
POST). Every request is in the emulator's log with its client address: ``calls_from(ip)`` counts the
controller's Redfish requests.

``Bridge`` is ``contrib/redfish/power_bridge.py``'s ``PowerBridge`` in a thread of the test process, polling
the emulator over Redfish (as any client would): a system that is Off gets its node's container killed
(``docker kill``: slurmd and the agent die, nothing shuts down cleanly; the bridge leaves the power-lost
marker the entrypoint reads), a system that is On again gets it started. Every kill/start is recorded with
its time.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from rig import free_port, start_fake_bmc, stop_group, system_uuid

REPO_ROOT = Path(__file__).resolve().parents[2]
REDFISH_DIR = REPO_ROOT / "contrib" / "redfish"
USER = "fy-bmc"
PASSWORD = "s3cret:BMC/pass@word"  # odd characters on purpose: basic auth and the redaction must cope
NETWORK = "fleetyield-cluster"  # docker-compose.yml networks.cluster.name
NOPOST = "-nopost"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def load_bridge_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("power_bridge", REDFISH_DIR / "power_bridge.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gateway(docker: str) -> str:
    """The host's address on the cluster network (what the containers reach the host by)."""
    out = subprocess.run(
        [docker, "network", "inspect", NETWORK, "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    if not out:
        raise RuntimeError(f"docker network {NETWORK} has no gateway address")
    return out[0]


def container_ip(docker: str, name: str) -> str:
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"
    return subprocess.run(
        [docker, "inspect", "-f", fmt, name], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()[0]


@dataclass
class Bmc:
    """sushy-emulator on ``host``: one fake system per node, and a ``-nopost`` twin of each."""

    workdir: Path
    host: str
    nodes: tuple[str, ...]
    delay_s: int = 1
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    systems: dict[str, str] = field(default_factory=dict)  # system name -> uuid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "emulator.log"

    def start(self) -> Bmc:
        import bcrypt

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        htpasswd = self.workdir / "htpasswd"
        digest = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{USER}:{digest}\n")
        names = [*self.nodes, *(n + NOPOST for n in self.nodes)]
        self.systems = {n: system_uuid(i) for i, n in enumerate(names, start=1)}
        fake = [{"uuid": u, "name": n, "power_state": "On", "nics": []} for n, u in self.systems.items()]
        config = self.workdir / "emulator.conf.py"
        config.write_text(
            f"SUSHY_EMULATOR_LISTEN_IP = {self.host!r}\n"
            f"SUSHY_EMULATOR_LISTEN_PORT = {self.port}\n"
            "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
            f"SUSHY_EMULATOR_FAKE_SYSTEMS = {fake!r}\n"
            f"SUSHY_EMULATOR_STATE_DIR = {str(self.workdir / 'state')!r}\n"
            f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}\n"
            f"FLEETYIELD_FAKE_DELAY_S = {self.delay_s}\n"
            f"FLEETYIELD_FAKE_STUCK = {[n + NOPOST for n in self.nodes]!r}\n"
        )
        self.proc = start_fake_bmc(config, self.log_path, self.url)
        return self

    def stop(self) -> None:
        stop_group(self.proc)

    def requests_from(self, ip: str) -> list[str]:
        """The request lines of client ``ip`` so far ('GET /redfish/v1/Systems/... 200')."""
        pat = re.compile(rf'^{re.escape(ip)} - - \[[^\]]+\] "([A-Z]+ \S+) HTTP/[0-9.]+" (\d+)')
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            m = pat.match(ANSI.sub("", line))  # werkzeug colours some request lines (POST, errors)
            if m:
                out.append(f"{m.group(1)} {m.group(2)}")
        return out

    def set_power(self, system: str, state: str, creds: tuple[str, str] = (USER, PASSWORD)) -> None:
        """Force a system On/Off through Redfish (test setup/teardown; not the controller's path)."""
        import sushy
        from sushy import auth

        root = sushy.Sushy(self.url, auth=auth.BasicAuth(username=creds[0], password=creds[1]))
        sysobj = root.get_system(f"/redfish/v1/Systems/{self.systems[system]}")
        reset = sushy.ResetType.ON if state == "On" else sushy.ResetType.FORCE_OFF
        if str(getattr(sysobj.power_state, "value", sysobj.power_state)) != state:
            sysobj.reset_system(reset)


class Bridge:
    """``PowerBridge`` polling in a thread; ``events``: (time, container, 'kill'|'start')."""

    def __init__(self, bmc: Bmc, mapping: dict[str, str], docker: str, interval_s: float = 0.3) -> None:
        mod = load_bridge_module()
        self.interval_s = interval_s
        self.bridge = mod.PowerBridge(
            {bmc.systems[system]: container for system, container in mapping.items()},
            mod.sushy_reader(bmc.url, USER, PASSWORD),
            mod.docker_cli(docker),
        )
        self.bmc = bmc
        self.events: list[tuple[float, str, str]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="power-bridge", daemon=True)

    def start(self) -> Bridge:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def map(self, system: str, container: str) -> None:
        """Make ``system`` the one that powers ``container`` (replacing the container's previous one)."""
        with self._lock:
            mapping = {s: c for s, c in self.bridge.mapping.items() if c != container}
            mapping[self.bmc.systems[system]] = container
            self.bridge.mapping = mapping

    def times(self, container: str, verb: str, *, since: float = 0.0) -> list[float]:
        with self._lock:
            return [t for t, c, v in self.events if c == container and v == verb and t > since]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    done = self.bridge.sync_once()
                    now = time.time()
                    self.events.extend((now, c, v) for c, v in done)
            except Exception as exc:  # keep bridging; the test reports what went wrong
                self.errors.append(repr(exc))
            self._stop.wait(self.interval_s)


def controller_config(
    original: str,
    *,
    lifecycle: dict[str, str],
    redfish: dict[str, str],
    nodes: dict[str, dict[str, str]],
) -> str:
    """``original`` (the cluster's fleetyield.toml) with ``[core.lifecycle]`` keys replaced/added and
    ``[redfish]`` + ``[redfish.nodes.<node>]`` tables appended. Values are TOML literals."""
    out: list[str] = []
    section = None
    seen_lifecycle = False
    for line in original.splitlines():
        head = re.match(r"^\s*\[([^\]]+)\]\s*$", line)
        if head:
            section = head.group(1).strip()
        key = re.match(r"^\s*([A-Za-z0-9_]+)\s*=", line)
        if section == "core.lifecycle" and key and key.group(1) in lifecycle:
            continue
        if section and section.startswith("redfish"):
            raise ValueError("the original config already has a [redfish] table")
        out.append(line)
        if head and section == "core.lifecycle":
            seen_lifecycle = True
            out.append("# --- test_redfish_ladder.py ---")
            out.extend(f"{k} = {v}" for k, v in lifecycle.items())
    if not seen_lifecycle:
        out += ["", "[core.lifecycle]", *(f"{k} = {v}" for k, v in lifecycle.items())]
    out += ["", "# --- test_redfish_ladder.py ---", "[redfish]", *(f"{k} = {v}" for k, v in redfish.items())]
    for node, table in nodes.items():
        out += ["", f'[redfish.nodes."{node}"]', *(f"{k} = {v}" for k, v in table.items())]
    return "\n".join(out) + "\n"


def toml_str(value: Any) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
