"""The rehabilitation ladder's Redfish power cycle, end to end on the real docker Slurm cluster.

1. XID 79 on a node -> quarantine (DRAIN, our reason) -> the ladder's rung for XID 79 is a BMC power cycle
   (configured: a GPU off the bus needs a cold power cycle) -> the controller drives the real sushy-emulator
   (off the tick: the tick never waits on the BMC) -> the power bridge kills the node's container on Off
   and starts it on On (fake GPUs power-cycled, slurmd -b) -> the node re-registers with slurmctld -> canary
   jobs -> probation -> in service; timings and the controller's Redfish requests are printed;
2. bad BMCs, each end to end: wrong credentials, an unreachable BMC, a system that never powers back on ->
   a clear error in the audit log and the event log, the node stays quarantined (drained) throughout, and
   after ``max_remediation_attempts`` (2 here) the ladder parks it in needs_human.

Harness (``redfish_harness.py``): the emulator and the bridge run on the docker host; the controller reaches
the emulator through the compose network's gateway. The controller's config gets ``[redfish]`` and a
power-cycle ladder for the module and is restored afterwards (then ``reset_world``: a fresh controller and
clean nodes).
Every wait is a poll with a deadline.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redfish_harness import (
    NOPOST,
    PASSWORD,
    USER,
    Bmc,
    Bridge,
    container_ip,
    controller_config,
    free_port,
    gateway,
    toml_str,
)

pytestmark = pytest.mark.integration
pytest.importorskip("sushy_tools")
pytest.importorskip("bcrypt")

CTL = "fleetyield"
CONFIG = "/etc/fleetyield/fleetyield.toml"
SAVED = "/etc/fleetyield/fleetyield.toml.pre-redfish"  # the cluster's own config while this module runs
CREDS_DIR = "/var/lib/fleetyield/bmc"
GOOD_CREDS = f"{CREDS_DIR}/bmc.creds"
BAD_CREDS = f"{CREDS_DIR}/wrong.creds"
GATE_DB = "/var/lib/fleetyield/gate/gate.db"
NODE = "gpu-h100-2"
ATTEMPTS = 2
LIFECYCLE = {
    "power_cycle_enabled": "true",
    # NVIDIA's catalog: XID 79 (fallen off the bus) -> cold power cycle; a reboot through the node's own
    # slurmd is not what such a node needs (the default ladder tries it first).
    "ladders": '{xid_79 = ["power_cycle"]}',
    "max_remediation_attempts": str(ATTEMPTS),
    # the docker cycle takes ~10 s (off 1 s, dwell 3 s, on 1 s, container boot); fail fast if it does not
    "remediation_timeout_s": "{gpu_reset = 60.0, reboot = 120.0, power_cycle = 120.0}",
}
REDFISH = {
    "enabled": "true",
    "credentials_file": toml_str(GOOD_CREDS),
    "auth": '"basic"',  # sushy-emulator has no SessionService
    "connect_timeout_s": "2.0",
    "read_timeout_s": "5.0",
    "retries": "2",
    "backoff_initial_s": "0.5",
    "backoff_max_s": "2.0",
    "poll_interval_s": "0.5",
    "off_timeout_s": "15.0",
    "off_dwell_s": "3.0",
    "on_timeout_s": "15.0",
    "rate_limit_actions": "20",
    "rate_limit_window_s": "600.0",
}


# --- fixtures -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rig(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    nodes = tuple(n for n, _ in cluster.nodes)
    gw = gateway(cluster.docker)
    bmc = Bmc(tmp_path_factory.mktemp("bmc"), gw, nodes).start()
    bridge = Bridge(bmc, {n: n for n in nodes}, cluster.docker).start()
    cluster.sh(
        CTL,
        f"install -d -m 0700 {CREDS_DIR} && umask 077 && "
        f"printf '%s\\n%s\\n' {USER} '{PASSWORD}' > {GOOD_CREDS} && "
        f"printf '%s\\n%s\\n' {USER} 'not-the-password' > {BAD_CREDS} && "
        f"{{ [ -e {SAVED} ] || cp -p {CONFIG} {SAVED}; }}",
    )
    original = cluster.exec(CTL, "cat", SAVED).stdout
    rig = {"bmc": bmc, "bridge": bridge, "original": original, "ctl_ip": container_ip(cluster.docker, CTL)}
    try:
        yield rig
    finally:
        try:
            bridge.stop()
            _all_containers_running(cluster)
            cluster.sh(CTL, f"mv -f {SAVED} {CONFIG}")
            cluster.reset_world()
        finally:
            bmc.stop()


@pytest.fixture
def world(cluster: Any, rig: dict[str, Any]) -> Iterator[Any]:
    yield cluster
    rig["bridge"].map(NODE, NODE)  # a test may have pointed the node at its -nopost system
    rig["bmc"].set_power(NODE, "On")
    _all_containers_running(cluster)


def install(cluster: Any, rig: dict[str, Any], **node_overrides: str) -> None:
    """The module's controller config, with ``NODE``'s BMC entry overridden; restart the controller on it with
    an empty store and wait for a clean, labelled cluster."""
    bmc: Bmc = rig["bmc"]
    nodes = {
        n: {"address": toml_str(bmc.url), "system_id": toml_str(bmc.systems[n])} for n, _ in cluster.nodes
    }
    nodes[NODE].update({k: toml_str(v) for k, v in node_overrides.items()})
    text = controller_config(rig["original"], lifecycle=LIFECYCLE, redfish=REDFISH, nodes=nodes)
    cluster.write_file(CTL, f"{CONFIG}.new", text)
    cluster.exec(CTL, "fleetyield", "validate-config", f"{CONFIG}.new")
    cluster.exec(CTL, "mv", "-f", f"{CONFIG}.new", CONFIG)
    cluster.reset_world()  # stops the controller, cleans the nodes, restarts it (--wipe) on the new config


def _all_containers_running(cluster: Any) -> None:
    for n, _ in cluster.nodes:
        running = subprocess.run(
            [cluster.docker, "inspect", "-f", "{{.State.Running}}", n], capture_output=True, text=True
        ).stdout.strip()
        if running != "true":
            subprocess.run([cluster.docker, "start", n], capture_output=True, text=True, timeout=60)
    cluster.wait_no_reboot(180)


# --- helpers ------------------------------------------------------------------------------------------------


def fy_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.exec(CTL, "fleetyield", *args, "--config", CONFIG, "--json").stdout)


def stage(cluster: Any, name: str) -> str:
    text = cluster.api(f"/v1/nodes/{name}/explain")["text"]
    m = re.search(r"^lifecycle: (in service|\w+)", text, re.MULTILINE)
    return m.group(1).replace(" ", "_") if m else "in_service"


def drained_reason(cluster: Any, name: str) -> str | None:
    f = cluster.node_info()[name]
    return f.get("Reason") if "DRAIN" in f.get("State", "") else None


def power_audit(cluster: Any, name: str, since: float) -> list[dict[str, Any]]:
    """The gate's audit entries of kind power_action for ``name`` since ``since``: their data dicts."""
    code = (
        "import json, sqlite3, sys\n"
        f"c = sqlite3.connect('file:{GATE_DB}?mode=ro', uri=True)\n"
        "rows = c.execute(\"SELECT time, data FROM audit WHERE kind = 'power_action' AND subject = ? "
        'AND time >= ? ORDER BY seq", (sys.argv[1], float(sys.argv[2])))\n'
        "print(json.dumps([dict(json.loads(d), time=t) for t, d in rows]))\n"
    )
    out = cluster.exec(CTL, "/opt/fleetyield/bin/python", "-c", code, name, str(since)).stdout
    return json.loads(out)


def events(cluster: Any, name: str) -> list[dict[str, Any]]:
    return fy_json(cluster, "events", "--node", name, "--limit", "500")


def controller_ticks(cluster: Any, since: float) -> tuple[list[float], float | None]:
    """From the controller's JSON log since ``since``: every tick's duration_s, and the duration of the BMC
    power action (its 'BMC power action done' line), if one finished."""
    out = subprocess.run(
        [cluster.docker, "logs", "--since", f"{since:.3f}", CTL], capture_output=True, text=True, timeout=60
    )
    ticks: list[float] = []
    cycle: float | None = None
    for line in (out.stdout + out.stderr).splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("msg") == "tick":
            ticks.append(float(doc["duration_s"]))
        elif doc.get("msg") == "BMC power action done" and doc.get("node") == NODE:
            cycle = float(doc["duration_s"])
    return ticks, cycle


def registered_after(cluster: Any, name: str, t: float) -> bool:
    """slurmd on ``name`` started after ``t`` and slurmctld shows the node responding."""
    f = cluster.node_info()[name]
    state = f.get("State", "")
    start = f.get("SlurmdStartTime", "")
    if not start or start in {"None", "Unknown"} or any(w in state for w in ("NOT_RESPONDING", "DOWN", "*")):
        return False
    return time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S")) >= int(t)


def assert_secret_free(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text


# --- 1. the ladder through the BMC --------------------------------------------------------------------------


def test_xid79_power_cycle_through_the_bmc_back_in_service(world: Any, rig: dict[str, Any]) -> None:
    bmc: Bmc = rig["bmc"]
    bridge: Bridge = rig["bridge"]
    install(world, rig)
    calls_before = len(bmc.requests_from(rig["ctl_ip"]))
    t_start = time.time()
    world.agent(NODE, "fault", "inject", "--gpu", "3", "--xid", "79")
    t0 = time.time()
    world.poll(lambda: drained_reason(world, NODE), timeout=20, interval=0.1, what=f"{NODE} quarantined")
    t_drain = time.time()
    assert drained_reason(world, NODE).startswith("fleetyield: XID 79 gpu 3")
    t_off = world.poll(
        lambda: (ts := bridge.times(NODE, "kill", since=t_start)) and ts[0],
        timeout=60,
        interval=0.1,
        what=f"{NODE} powered off through its BMC",
    )
    # Drained the whole time it was off (no job could land on a node the BMC is cycling).
    assert drained_reason(world, NODE), world.node_info()[NODE]
    t_on = world.poll(
        lambda: (ts := bridge.times(NODE, "start", since=t_off)) and ts[0],
        timeout=60,
        interval=0.1,
        what=f"{NODE} powered on again",
    )
    t_registered = world.poll(
        lambda: registered_after(world, NODE, t_on) and time.time(),
        timeout=90,
        interval=0.2,
        what=f"{NODE}'s slurmd registered again after the power-on",
    )
    still_drained = drained_reason(world, NODE)  # ours until the lifecycle resumes it into canary
    seen: list[str] = []
    times: dict[str, float] = {}

    def watch(target: str) -> bool:
        s = stage(world, NODE)
        if not seen or seen[-1] != s:
            seen.append(s)
            times.setdefault(s, time.time())
        return s == target

    world.poll(lambda: watch("probation"), timeout=150, interval=0.25, what=f"{NODE} in probation")
    world.poll(lambda: watch("in_service"), timeout=90, interval=0.25, what=f"{NODE} in service")
    t_green = time.time()
    calls = bmc.requests_from(rig["ctl_ip"])[calls_before:]
    ticks, cycle_s = controller_ticks(world, t_start)
    row = world.rows()[NODE]
    info = world.node_info()[NODE]
    print(
        f"\nXID 79 -> DRAIN {t_drain - t0:.1f} s, -> power off (container killed) {t_off - t0:.1f} s, "
        f"-> power on {t_on - t0:.1f} s, -> slurmd registered {t_registered - t0:.1f} s, "
        f"-> canary {times.get('canary', float('nan')) - t0:.1f} s, "
        f"-> probation {times['probation'] - t0:.1f} s, -> in service ({row['tier']}) {t_green - t0:.1f} s; "
        f"stages {seen}; controller Redfish requests {len(calls)}: {calls}; BMC cycle {cycle_s} s; "
        f"{len(ticks)} ticks meanwhile, longest {max(ticks):.2f} s"
    )
    # Off the tick: the cycle alone dwells off_dwell_s (3 s) and took cycle_s; no tick waited for it.
    assert cycle_s is not None and cycle_s >= 3.0, cycle_s
    assert max(ticks) < 3.0, sorted(ticks)[-5:]
    assert still_drained and still_drained.startswith("fleetyield:"), still_drained
    assert "canary" in seen, seen
    assert "DRAIN" not in info["State"] and row["tier"] in {"green", "yellow"}, (info, row)
    feats = set(info["AvailableFeatures"].split(","))
    assert "fy_canary" not in feats and any(f.startswith("fy_ok_") for f in feats), feats
    # The power cycle, not a reboot: the BMC did it, audited before and after; Slurm was never asked.
    audit = power_audit(world, NODE, t_start)
    assert [(a["operation"], a["result"]) for a in audit] == [
        ("power_cycle", "started"),
        ("power_cycle", "ok"),
    ]
    assert audit[0]["bmc"] == bmc.url and "remediation 1/2 (power_cycle)" in audit[0]["reason"]
    slurmctld_log = subprocess.run(
        [world.docker, "logs", "--since", f"{t_start:.3f}", "slurmctld"], capture_output=True, text=True
    ).stderr
    assert f"reboot request queued for nodes {NODE}" not in slurmctld_log
    print("slurmctld on " + NODE + ":\n" + "\n".join(ln for ln in slurmctld_log.splitlines() if NODE in ln))
    reboot_log = world.exec(NODE, "cat", "/var/log/fleetyield/reboot.log", check=False).stdout
    assert "after a power cut by the BMC" in reboot_log, reboot_log
    sacct = world.ctl("sacct", "-n", "-X", "-P", "-a", "-S", "now-10minutes", "-o", "JobName,State,NodeList")
    canaries = [ln.split("|") for ln in sacct.splitlines() if ln.startswith("fy_canary_")]
    assert len([c for c in canaries if c[1] == "COMPLETED" and c[2] == NODE]) >= 2, canaries
    # The controller's requests: one cycle = connect + ForceOff + polls + On + polls; never a retry storm.
    resets = [c for c in calls if c.startswith("POST ") and c.endswith("Actions/ComputerSystem.Reset 204")]
    assert len(resets) == 2, calls  # ForceOff, On
    assert not bridge.errors, bridge.errors


# --- 2. bad BMCs --------------------------------------------------------------------------------------------


def _escalates_to_needs_human(world: Any, error: str, t_start: float) -> dict[str, Any]:
    """Inject XID 79; the node must stay drained at every look until the lifecycle parks it in needs_human
    after ATTEMPTS power cycles that failed with ``error``. Returns what was seen."""
    world.agent(NODE, "fault", "inject", "--gpu", "3", "--xid", "79")
    t0 = time.time()
    world.poll(lambda: drained_reason(world, NODE), timeout=20, interval=0.1, what=f"{NODE} quarantined")

    def parked() -> bool:
        assert drained_reason(world, NODE), f"{NODE} not drained: {world.node_info()[NODE]}"
        return stage(world, NODE) == "needs_human"

    world.poll(parked, timeout=150, interval=0.5, what=f"{NODE} in needs_human")
    t_parked = time.time()
    world.wait_ticks(3)
    reason = drained_reason(world, NODE)
    assert reason and reason.startswith("fleetyield: needs a human"), reason
    assert f"{ATTEMPTS} remediations failed" in reason and "power_cycle: failed" in reason, reason
    audit = power_audit(world, NODE, t_start)
    results = [a["result"] for a in audit]
    assert results == ["started", f"error:{error}"] * ATTEMPTS, audit
    assert all(a["operation"] == "power_cycle" and a.get("detail") for a in audit if a["result"] != "started")
    log = events(world, NODE)
    failed = [e for e in log if e.get("kind") == "apply_failed" and error in json.dumps(e)]
    assert len(failed) == ATTEMPTS, [e for e in log if e.get("kind") == "apply_failed"]
    assert any("remediation_failed -> needs_human" in e.get("message", "") for e in log), log[:10]
    assert_secret_free(json.dumps(audit), json.dumps(log))
    print(
        f"\n{error}: XID 79 -> needs_human in {t_parked - t0:.1f} s; reason {reason!r}; "
        f"audit detail: {audit[1].get('detail')!r}"
    )
    return {"audit": audit, "events": log, "reason": reason}


def test_wrong_credentials_escalate_to_needs_human(world: Any, rig: dict[str, Any]) -> None:
    install(world, rig, credentials_file=BAD_CREDS)
    t_start = time.time()
    seen = _escalates_to_needs_human(world, "BmcAuthError", t_start)
    assert "credentials refused (401)" in seen["audit"][1]["detail"], seen["audit"]
    # Authentication errors are never retried (BMCs lock accounts), and nothing was powered off.
    assert rig["bridge"].times(NODE, "kill", since=t_start) == []


def test_unreachable_bmc_escalates_to_needs_human(world: Any, rig: dict[str, Any]) -> None:
    closed = free_port(rig["bmc"].host)  # nothing listens there: connection refused
    install(world, rig, address=f"http://{rig['bmc'].host}:{closed}")
    t_start = time.time()
    seen = _escalates_to_needs_human(world, "BmcUnreachable", t_start)
    assert f":{closed}" in seen["audit"][1]["bmc"], seen["audit"]
    assert rig["bridge"].times(NODE, "kill", since=t_start) == []


def test_system_that_never_powers_back_escalates_to_needs_human(world: Any, rig: dict[str, Any]) -> None:
    bmc: Bmc = rig["bmc"]
    install(world, rig, system_id=bmc.systems[NODE + NOPOST])
    rig["bridge"].map(NODE + NOPOST, NODE)  # this board's power is the node's now
    t_start = time.time()
    seen = _escalates_to_needs_human(world, "BmcTimeout", t_start)
    assert "did not reach power On" in seen["audit"][1]["detail"], seen["audit"]
    # It really went off (container killed) and never came back while the ladder ran.
    bridge: Bridge = rig["bridge"]
    assert bridge.times(NODE, "kill", since=t_start) and not bridge.times(NODE, "start", since=t_start)
    state = world.node_info()[NODE]["State"]
    assert "DRAIN" in state and ("DOWN" in state or "NOT_RESPONDING" in state), state
