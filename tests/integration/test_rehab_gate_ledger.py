"""The human gate, the rehabilitation ladder and the goodput ledger on the real docker Slurm cluster.

1. gradual degradation -> a drain proposal; the node keeps working until a trusted admin approves; forged,
   replayed, expired, other-node and already-settled approvals are refused with their reason code and change
   nothing; the audit chain verifies;
2. XID 79 -> quarantine -> reboot (RebootProgram = the docker stand-in) -> canary jobs -> probation -> back in
   service, with no human;
3. quiet corruption that a reboot does not fix -> the canary job fails -> back to quarantine;
4. the ledger: a job killed by a fault is wasted GPU time since its last checkpoint, a completed job useful;
5. kill -9 of the controller at 20 seeded random points during these flows: nothing lost, nothing drained
   twice, the flows finish.

Controller config: contrib/slurm-docker-cluster/fleetyield/fleetyield.toml (probation 20 s, settle 3 s).
Every wait is a poll with a deadline; ``world`` restores the cluster after each test.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import subprocess
import time
import uuid
from typing import Any

import pytest

pytestmark = pytest.mark.integration

CTL = "fleetyield"  # the controller's container
CONFIG = "/etc/fleetyield/fleetyield.toml"
ADMIN_DIR = "/root/fy-admin"  # private keys: in the controller container, never in the image
AUTHORIZED_KEYS = "/var/lib/fleetyield/admin/authorized_keys"  # [gate] authorized_keys of the cluster config
H100 = ("gpu-h100-1", "gpu-h100-2")
PROPOSAL_ID = re.compile(r"^p-[0-9a-f]{12}$")


@pytest.fixture(scope="session")
def admins(cluster: Any) -> dict[str, str]:
    """Key pairs made with ``fleetyield keygen`` in the controller container: alice and bob are trusted (their
    public keys in the gate's authorized_keys), mallory is not. Returns {name: private key path}."""
    script = f"""
set -e
install -d -m 0700 {ADMIN_DIR} "$(dirname {AUTHORIZED_KEYS})"
for n in alice bob mallory; do
  [ -s {ADMIN_DIR}/$n.key ] || fleetyield keygen $n --dir {ADMIN_DIR} >/dev/null
done
umask 022
cat {ADMIN_DIR}/alice.pub {ADMIN_DIR}/bob.pub > {AUTHORIZED_KEYS}.tmp
chmod 0644 {AUTHORIZED_KEYS}.tmp && mv {AUTHORIZED_KEYS}.tmp {AUTHORIZED_KEYS}
"""
    cluster.sh(CTL, script)
    return {n: f"{ADMIN_DIR}/{n}.key" for n in ("alice", "bob", "mallory")}


# --- helpers ----------------------------------------------------------------------------------------------


def fy(cluster: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.exec(CTL, "fleetyield", *args, "--config", CONFIG, check=check)


def fy_json(cluster: Any, *args: str) -> Any:
    return json.loads(fy(cluster, *args, "--json").stdout)


def node(cluster: Any, name: str) -> dict[str, str]:
    return cluster.node_info()[name]


def stage(cluster: Any, name: str) -> str:
    """The lifecycle stage of ``name`` from the controller's explain text ('in_service' when it has none)."""
    text = cluster.api(f"/v1/nodes/{name}/explain")["text"]
    m = re.search(r"^lifecycle: (in service|\w+)", text, re.MULTILINE)
    return m.group(1).replace(" ", "_") if m else "in_service"


def sbatch(cluster: Any, *args: str, script: str, gpus: int = 1) -> str:
    out = cluster.ctl(
        "sbatch",
        "--parsable",
        f"--gres=gpu:{gpus}",
        f"--job-name=fy-rgl-{uuid.uuid4().hex[:6]}",
        "-o",
        "/dev/null",
        *args,
        "--wrap",
        script,
    )
    return out.strip().split(";")[0]


def job_state(cluster: Any, job: str) -> str:
    out = cluster.exec("slurmctld", "squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()
    if out:
        return out
    sacct = cluster.ctl("sacct", "-n", "-X", "-P", "-j", job, "-o", "State").strip().splitlines()
    return sacct[-1] if sacct else ""


def wait_running(cluster: Any, job: str, timeout: float = 60) -> None:
    cluster.poll(lambda: job_state(cluster, job) == "RUNNING", timeout=timeout, what=f"job {job} RUNNING")


def pending_for(cluster: Any, name: str) -> list[dict[str, Any]]:
    return [p for p in fy_json(cluster, "pending") if p["node"] == name]


def submit(cluster: Any, envelope: str) -> dict[str, Any]:
    """POST an envelope with ``fleetyield submit-approval`` in the controller container; the JSON answer."""
    path = f"/tmp/env-{uuid.uuid4().hex[:8]}.json"
    cluster.write_file(CTL, path, envelope, private=True)
    proc = fy(cluster, "submit-approval", path, "--json", check=False)
    return json.loads(proc.stdout)


def signed(cluster: Any, key: str, proposal_id: str, *extra: str) -> str:
    """An envelope signed with ``fleetyield approve ID --key KEY --out`` (not submitted)."""
    path = f"/tmp/env-{uuid.uuid4().hex[:8]}.json"
    fy(cluster, "approve", proposal_id, "--key", key, "--out", path, *extra)
    return cluster.exec(CTL, "cat", path).stdout.strip()


def signed_for_node(cluster: Any, key: str, proposal_id: str, other: str) -> str:
    """An envelope signed by a trusted key for the right proposal id but another node."""
    code = (
        "import sys\n"
        "from slurm_fleetyield.gate import sign_statement\n"
        "class R:\n"
        f"    id = {proposal_id!r}\n"
        f"    node = {other!r}\n"
        f"sys.stdout.write(sign_statement({key!r}, R(), 'approve'))\n"
    )
    return cluster.exec(CTL, "/opt/fleetyield/bin/python", "-c", code).stdout.strip()


def drained_reason(cluster: Any, name: str) -> str | None:
    f = node(cluster, name)
    return f.get("Reason", "") if "DRAIN" in f["State"] else None


def slurmctld_log(cluster: Any, since: float) -> str:
    """slurmctld's log (stderr) since the Unix time ``since`` (the log spans the container's life)."""
    cmd = [cluster.docker, "logs", "--since", f"{since:.3f}", "slurmctld"]
    return subprocess.run(cmd, capture_output=True, text=True).stderr


def wait_stage(cluster: Any, name: str, want: str, timeout: float) -> float:
    t0 = time.monotonic()
    cluster.poll(lambda: stage(cluster, name) == want, timeout=timeout, interval=0.25, what=f"{name} {want}")
    return time.monotonic() - t0


# --- 1. The human gate -----------------------------------------------------------------------------------


def test_degradation_proposal_waits_for_a_trusted_approval_and_refuses_the_rest(
    world: Any, admins: dict[str, str]
) -> None:
    x, other = H100
    t_start = time.time()
    before = sbatch(world, "-w", x, "--comment=fy:batch", script="sleep 600")
    wait_running(world, before)
    # Correctable ECC errors at 20/s remap 2 rows/s: red within a few ticks, no fatal event.
    world.agent(x, "fault", "degrade", "--gpu", "1", "--mode", "ecc", "--rate", "20", "--threshold", "100000")
    (proposal,) = world.poll(
        lambda: pending_for(world, x), timeout=90, interval=1, what=f"a proposal for {x}"
    )
    pid = proposal["id"]
    assert PROPOSAL_ID.match(pid) and proposal["status"] == "pending", proposal
    api = world.api("/v1/proposals")
    assert [p["id"] for p in api["pending"] if p["node"] == x] == [pid], api
    assert re.search(r"^fleetyield_proposals_pending 1(\.0)?$", world.api_text("/metrics"), re.MULTILINE)
    # The node keeps working: not drained, the job submitted before still runs.
    assert drained_reason(world, x) is None and job_state(world, before) == "RUNNING"

    def unchanged() -> None:
        assert drained_reason(world, x) is None, node(world, x)
        assert [p["id"] for p in pending_for(world, x)] == [pid]

    # Refused, with their reason codes, changing nothing.
    forged = submit(world, signed(world, admins["mallory"], pid))
    assert (forged["http_status"], forged["error"]) == (403, "unknown_key"), forged
    good = json.loads(signed(world, admins["alice"], pid))
    sig = bytearray(base64.b64decode(good["signature"]))
    sig[0] ^= 0xFF
    tampered = json.dumps({**good, "signature": base64.b64encode(bytes(sig)).decode()})
    assert submit(world, tampered)["error"] == "bad_signature"
    wrong_node = submit(world, signed_for_node(world, admins["alice"], pid, other))
    assert wrong_node["error"] == "wrong_node", wrong_node
    short = signed(world, admins["alice"], pid, "--ttl", "1")
    expires = json.loads(short)["statement"]["expires_at"]
    world.poll(lambda: time.time() > expires + 0.5, timeout=10, interval=0.2, what="the statement to expire")
    assert submit(world, short)["error"] == "expired"
    unchanged()
    assert job_state(world, before) == "RUNNING"

    # The trusted approval drains X with our reason naming the admin and the proposal.
    late_envelope = signed(world, admins["bob"], pid)  # signed while pending, submitted after the decision
    envelope = signed(world, admins["alice"], pid, "--note", "ecc growth, confirmed")
    t0 = time.monotonic()
    ok = submit(world, envelope)
    assert ok["http_status"] == 200 and ok["status"] == "approved" and ok["admin"] == "alice", ok
    reason = world.poll(lambda: drained_reason(world, x), timeout=30, interval=0.1, what=f"{x} drained")
    latency = time.monotonic() - t0
    print(f"\napproval -> DRAIN in {latency:.2f} s; reason {reason!r}")
    assert reason.startswith("fleetyield:") and f"[approved by alice #{pid}]" in reason, reason
    # Replayed and already-settled approvals: refused, nothing more happens.
    assert submit(world, envelope)["error"] in {"replayed", "already_settled"}
    late = submit(world, late_envelope)
    assert late["error"] == "already_settled", late
    world.wait_ticks(2)
    log = slurmctld_log(world, t_start)
    approved_sets = [ln for ln in log.splitlines() if "reason set to: " in ln and f"#{pid}]" in ln]
    assert len(approved_sets) == 1, approved_sets

    report = fy_json(world, "audit", "verify")
    assert report["ok"], report
    print(f"audit: {json.dumps(report)[:300]}")
    assert latency < 10, latency


def test_an_approved_ecc_drain_whose_fault_a_reboot_cleared_returns_to_service_not_rma(
    world: Any, admins: dict[str, str]
) -> None:
    """Issue "Hardening" item 9, as a new admin met it: ECC and remap counters do not reset, so every canary
    after the reboot that cleared the fault used to count as a new incident, and the node was RETIRED after
    three of them within 30 s. A counter that did not grow since the remediation proved OK is no new fault."""
    x = H100[1]
    world.agent(x, "fault", "degrade", "--gpu", "1", "--mode", "ecc", "--rate", "20", "--threshold", "100000")
    (proposal,) = world.poll(lambda: pending_for(world, x), timeout=90, interval=1, what=f"{x}'s proposal")
    ok = submit(world, signed(world, admins["alice"], proposal["id"]))
    assert ok["http_status"] == 200 and ok["status"] == "approved", ok
    world.poll(lambda: drained_reason(world, x), timeout=30, interval=0.1, what=f"{x} drained")
    seen: list[str] = []

    def back() -> bool:
        s = stage(world, x)
        if not seen or seen[-1] != s:
            seen.append(s)
        assert s not in {"retired", "needs_human"}, seen
        return s == "in_service" and "remediating" in seen

    world.poll(back, timeout=240, interval=0.25, what=f"{x} back in service after the reboot")
    info = node(world, x)
    assert "DRAIN" not in info["State"], info
    family = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
    rows = [ln for ln in world.metrics(x).splitlines() if ln.startswith(family)]
    remapped = [float(ln.rsplit(" ", 1)[1]) for ln in rows if 'gpu="1"' in ln]
    assert remapped and remapped[0] > 0, rows  # the counters the reboot did not reset are still there
    print(f"\napproved ECC drain -> back in service; stages {seen}; remapped rows kept: {remapped[0]:g}")


# --- 2. The ladder, no human -------------------------------------------------------------------------------


def test_xid79_quarantine_reboot_canary_probation_back_in_service(world: Any) -> None:
    x = H100[1]
    t_start, t0 = time.time(), time.monotonic()
    world.agent(x, "fault", "inject", "--gpu", "3", "--xid", "79")
    world.poll(lambda: drained_reason(world, x), timeout=20, interval=0.1, what=f"{x} quarantined")
    assert drained_reason(world, x).startswith("fleetyield: XID 79 gpu 3")
    seen: list[str] = []

    def watch() -> bool:
        s = stage(world, x)
        if not seen or seen[-1] != s:
            seen.append(s)
        return s == "probation"

    world.poll(watch, timeout=120, interval=0.25, what=f"{x} in probation")
    t_probation = time.monotonic() - t0
    assert "remediating" in seen and "canary" in seen, seen
    world.poll(lambda: stage(world, x) == "in_service", timeout=90, interval=0.25, what=f"{x} in service")
    t_back = time.monotonic() - t0
    row = world.rows()[x]
    info = node(world, x)
    print(f"\nXID 79 -> probation {t_probation:.1f} s, -> in service ({row['tier']}) {t_back:.1f} s; {seen}")
    assert "DRAIN" not in info["State"], info
    assert row["tier"] in {"green", "yellow"}, row  # risk-based again (a fresh fatal weighs on risk)
    feats = set(info["AvailableFeatures"].split(","))
    assert "fy_canary" not in feats and any(f.startswith("fy_ok_") for f in feats), feats
    # The reboot went through Slurm (RebootProgram) and the canaries ran on X and completed.
    log = slurmctld_log(world, t_start)
    assert f"reboot request queued for nodes {x}" in log
    reboot_log = world.exec(x, "cat", "/var/log/fleetyield/reboot.log").stdout
    assert "booted: fake GPUs power-cycled" in reboot_log, reboot_log
    sacct = world.ctl("sacct", "-n", "-X", "-P", "-a", "-S", "now-10minutes", "-o", "JobName,State,NodeList")
    canaries = [ln.split("|") for ln in sacct.splitlines() if ln.startswith("fy_canary_")]
    assert len([c for c in canaries if c[1] == "COMPLETED" and c[2] == x]) >= 2, canaries
    events = fy_json(world, "events", "--node", x, "--limit", "200")
    assert any("probation_elapsed" in e.get("message", "") for e in events), events[:5]


def test_a_driver_recovery_request_quarantines_resets_the_gpu_and_returns(world: Any) -> None:
    """XID 154 with the recovery action GPU_RESET (the fake's stand-in for an R570+ driver): the controller
    reads DCGM_FI_DEV_GPU_RECOVERY_ACTION from the scrape, drains, resets that GPU first, and the node
    comes back once the request is gone."""
    x = H100[0]
    world.agent(x, "fault", "inject", "--gpu", "2", "--xid", "154", "--recovery-action", "gpu_reset")
    reason = world.poll(lambda: drained_reason(world, x), timeout=30, interval=0.2, what=f"{x} quarantined")
    assert reason.startswith("fleetyield: GPU 2 driver requests GPU reset"), reason
    seen: list[str] = []
    reasons: set[str] = set()

    def back() -> bool:
        s = stage(world, x)
        if not seen or seen[-1] != s:
            seen.append(s)
        if r := drained_reason(world, x):
            reasons.add(r)
        return s == "in_service" and "canary" in seen

    world.poll(back, timeout=180, interval=0.25, what=f"{x} back in service")
    assert any("remediation 1/3 (gpu_reset)" in r for r in reasons), reasons  # what the driver asked for
    assert not any("(reboot)" in r for r in reasons), reasons
    assert "DRAIN" not in node(world, x)["State"]


# --- 3. Quiet corruption fails the canary -------------------------------------------------------------------


def test_quiet_corruption_fails_the_canary_and_returns_to_quarantine(world: Any) -> None:
    x = H100[1]
    world.agent(x, "fault", "corrupt", "--gpu", "5")  # no metric changes; a reset/reboot does not fix it
    world.wait_ticks(2)
    assert world.rows()[x]["tier"] == "green", "quiet: nothing to see in the metrics"
    world.agent(x, "fault", "inject", "--gpu", "3", "--xid", "79")  # gets it into the ladder
    world.poll(lambda: stage(world, x) == "canary", timeout=90, interval=0.25, what=f"{x} in canary")

    # The controller's own log: the lifecycle step, and the drain reason it set (the next tick already moves
    # the node on to the next rung, so Slurm shows that reason only for a moment).
    def requarantined() -> str | None:
        for e in fy_json(world, "events", "--node", x, "--limit", "300"):
            msg = e.get("message", "")
            # The failing check inside the canary job is also pushed by the agent as fatal evidence
            # (check_failed), which may quarantine the node before sacct shows the job FAILED.
            if msg.startswith("canary_failed -> quarantined") or (
                msg.startswith("fatal -> quarantined") and "check failed" in msg and "in canary" in msg
            ):
                return msg
        return None

    msg = world.poll(requarantined, timeout=90, interval=0.5, what=f"{x} back in quarantine")
    print(f"\nafter the failed canary: {msg!r}")
    cols = "JobName,State,ExitCode,NodeList"
    failed = world.poll(
        lambda: [
            ln
            for ln in world.ctl(
                "sacct", "-n", "-X", "-P", "-a", "-S", "now-10minutes", "-o", cols
            ).splitlines()
            if ln.startswith("fy_canary_")
            and ln.endswith(f"|{x}")
            and ("|FAILED|1:0|" in ln or "|CANCELLED" in ln)
        ],
        timeout=30,
        what=f"the failed canary job on {x} in sacct",
    )
    # The check inside the canary fails and the agent pushes it at once; the controller may quarantine the
    # node and cancel the round (scancel) before the job's own exit is recorded: FAILED or CANCELLED, on x.
    assert failed, failed
    assert stage(world, x) in {"quarantined", "remediating", "canary"}, stage(world, x)


# --- 4. The ledger ------------------------------------------------------------------------------------------


def test_ledger_settles_killed_job_as_wasted_since_checkpoint_and_completed_as_useful(world: Any) -> None:
    x, y = H100
    done = sbatch(world, "-w", y, "--comment=fy:batch", script="sleep 6", gpus=2)
    ckpt = "/var/spool/fleetyield/ckpt/$SLURM_JOB_ID"
    killed = sbatch(
        world, "-w", x, "--comment=fy:batch", script=f"sleep 4; date +%s > {ckpt}; sleep 600", gpus=2
    )
    wait_running(world, killed)
    t_ckpt = world.poll(
        lambda: world.sh(x, "ls /var/spool/fleetyield/ckpt/").split(), timeout=30, what="the checkpoint file"
    )
    assert t_ckpt
    world.poll(lambda: job_state(world, done) == "COMPLETED", timeout=60, what=f"job {done} completed")
    (gpu, *_) = world.job_gpus(killed)
    world.agent(x, "fault", "inject", "--gpu", str(gpu), "--xid", "79")  # on its GPU: drain + requeue

    def attempts(job: str) -> list[tuple[str, float, float]]:
        out = world.ctl("sacct", "-n", "-X", "-D", "-P", "-j", job, "-o", "State,Start,End", "--noconvert")
        rows = []
        for ln in out.splitlines():
            st, s, e = ln.split("|")
            if e not in {"Unknown", ""} and s not in {"Unknown", ""}:
                rows.append((st, _epoch(world, s), _epoch(world, e)))
        return rows

    killed_attempts = world.poll(lambda: attempts(killed), timeout=60, what=f"job {killed}'s attempt ended")
    (done_attempt,) = attempts(done)

    def settled() -> dict[str, Any] | None:
        doc = fy_json(world, "ledger", "--by", "cause")
        groups = {g["group"]: g for g in doc["groups"]}
        total = sum(g["jobs"] for g in groups.values())
        return doc if total >= 2 and any(g["wasted_gpu_h"] > 0 for g in groups.values()) else None

    doc = world.poll(settled, timeout=120, interval=1, what="both jobs settled in the ledger")
    useful_h = sum(g["useful_gpu_h"] for g in doc["groups"])
    wasted_h = sum(g["wasted_gpu_h"] for g in doc["groups"])
    _, k_start, k_end = killed_attempts[0]
    _, d_start, d_end = done_attempt
    ckpt_time = k_start + 4
    want_useful = 2 * (d_end - d_start) + 2 * (ckpt_time - k_start)
    want_wasted = 2 * (k_end - ckpt_time)
    print(
        f"\nledger by cause: {json.dumps(doc['groups'])}\n"
        f"useful {useful_h * 3600:.0f} GPU-s (want ~{want_useful:.0f}), wasted {wasted_h * 3600:.0f} GPU-s "
        f"(want ~{want_wasted:.0f})"
    )
    assert abs(wasted_h * 3600 - want_wasted) <= 2 * 3 + 0.05 * want_wasted, (wasted_h, want_wasted)
    assert abs(useful_h * 3600 - 2 * (d_end - d_start)) <= 2 * 3 + 2 * (ckpt_time - k_start) + 1, useful_h


def _epoch(cluster: Any, stamp: str) -> float:
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


# --- 5. kill -9 of the controller during the flows ----------------------------------------------------------


def test_controller_kill9_at_random_points_loses_nothing_and_drains_once(
    world: Any, admins: dict[str, str]
) -> None:
    seed = int(os.environ.get("FY_KILL_SEED", random.SystemRandom().randrange(1 << 30)))
    total = int(os.environ.get("FY_KILLS", "20"))  # CI: 20; issue #27's run: FY_KILLS=50
    rng = random.Random(seed)
    print(f"\nkill -9 seed: {seed}, {total} kills (rerun with FY_KILL_SEED={seed} FY_KILLS={total})")
    x, y = H100
    t_start = time.time()
    kills: list[str] = []

    def maybe_kill(budget: int) -> None:
        if len(kills) < budget and rng.random() < 0.5:
            kills.append(world.exec(CTL, "fy-service", "controller", "kill9").stdout.strip())

    def poll_killing(cond: Any, budget: int, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                got = cond()
            except (AssertionError, ValueError, subprocess.SubprocessError):
                got = None
            if got:
                return got
            assert time.monotonic() < deadline, f"timed out waiting for {what} (kills so far {len(kills)})"
            maybe_kill(budget)
            time.sleep(rng.uniform(0.2, 1.5))

    # Flow A: XID 79 on X through the whole ladder, killed at random points (10 kills).
    world.agent(x, "fault", "inject", "--gpu", "3", "--xid", "79")
    poll_killing(lambda: stage(world, x) == "probation", total // 2, 180, f"{x} in probation")
    poll_killing(lambda: stage(world, x) == "in_service", total // 2, 120, f"{x} back in service")
    # Flow B: degradation on Y -> proposal -> approval -> drain, killed at random points (the rest).
    world.agent(y, "fault", "degrade", "--gpu", "1", "--mode", "ecc", "--rate", "20", "--threshold", "100000")
    (proposal,) = poll_killing(lambda: pending_for(world, y), 3 * total // 4, 120, f"a proposal for {y}")
    pid = proposal["id"]
    gate_before = _gate_snapshot(world)
    ok = submit(world, signed(world, admins["alice"], pid))
    assert ok["http_status"] == 200, ok
    poll_killing(lambda: drained_reason(world, y), total, 60, f"{y} drained")
    while len(kills) < total:  # the rest, while the approved drain settles into the lifecycle
        kills.append(world.exec(CTL, "fy-service", "controller", "kill9").stdout.strip())
        time.sleep(rng.uniform(0.2, 1.5))
    world.poll(lambda: world.tick() > 0, timeout=30, interval=0.2, what="the controller back")
    world.wait_ticks(3)
    assert len(kills) == total and len(set(kills)) == total, kills

    gate_after = _gate_snapshot(world)
    for p in gate_before:
        assert p in gate_after, f"proposal {p} lost"
    assert gate_after[pid] == "approved", gate_after
    # (Y does not stay drained: an approved drain is an episode of the ladder -- reboot, canaries -- so the
    # drain is checked in slurmctld's log below.)
    report = fy_json(world, "audit", "verify")
    assert report["ok"], report
    # Each drain command once: the quarantine's for X's XID 79, the approved one for Y.
    log = slurmctld_log(world, t_start)
    xid_reason = f"node {x} reason set to: fleetyield: XID 79 gpu 3 fell"
    xid_drains = [ln for ln in log.splitlines() if xid_reason in ln]
    approved = [ln for ln in log.splitlines() if f"node {y} reason set to:" in ln and f"#{pid}]" in ln]
    print(f"XID drains of {x}: {len(xid_drains)}; approved drains of {y}: {len(approved)}")
    assert len(xid_drains) == 1, xid_drains
    assert len(approved) == 1, approved
    assert stage(world, x) == "in_service"
    # Item 3: no reboot repeated across a crash. X's XID 79 ladder reboots it once (the fault is cleared by
    # it and the canary passes); the stand-in RebootProgram logs every reboot slurmd was asked for.
    reboots = [
        ln
        for ln in world.sh(x, "cat /var/log/fleetyield/reboot.log 2>/dev/null || true").splitlines()
        if "reboot requested by slurmd" in ln and float(ln.split()[0]) >= t_start
    ]
    print(f"reboots of {x}: {len(reboots)}")
    assert len(reboots) == 1, reboots


def _gate_snapshot(cluster: Any) -> dict[str, str]:
    code = (
        "import json\n"
        "from slurm_fleetyield.adapters.proposals import read_proposals\n"
        "print(json.dumps({p['id']: p['status'] for p in read_proposals('/var/lib/fleetyield/gate')}))\n"
    )
    return json.loads(cluster.exec(CTL, "/opt/fleetyield/bin/python", "-c", code).stdout)
