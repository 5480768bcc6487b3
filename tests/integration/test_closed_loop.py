"""The closed loop on the real docker Slurm cluster: agents -> controller -> scontrol -> where jobs land.

One test per "must be shown" item of the closed-loop issue. The controller (container ``fleetyield``)
ticks every 2 s (contrib/slurm-docker-cluster/fleetyield/fleetyield.toml); agents push fatal events to it.
Every wait is a poll with a deadline; ``world`` (conftest.py) puts the cluster back (no jobs, no faults,
no drains, a controller with a fresh store, every node green) after each test, in ~3 s.

Run: ``.venv/bin/pytest tests/integration/test_closed_loop.py`` (brings the cluster up when needed).
"""

from __future__ import annotations

import math
import re
import statistics
import subprocess
import tomllib
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CONTROLLER_TOML = REPO_ROOT / "contrib" / "slurm-docker-cluster" / "fleetyield" / "fleetyield.toml"
H100 = ("gpu-h100-1", "gpu-h100-2")
L40S = ("gpu-l40s-1", "gpu-l40s-2")
NODES = H100 + L40S
TICK_S = tomllib.loads(CONTROLLER_TOML.read_text())["loop"]["interval_s"]
LATENCY_GOAL_S = 1.0  # p50 from the fault injection command to `scontrol show node` showing DRAIN

pytestmark = pytest.mark.integration


def gpu_count(metrics_text: str) -> int:
    return len(set(re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{[^}]*\bgpu="(\d+)"', metrics_text, re.MULTILINE)))


def features(info: dict[str, dict[str, str]], node: str) -> set[str]:
    return set(info[node]["AvailableFeatures"].split(","))


def sbatch(cluster: Any, *args: str, seconds: float = 1) -> str:
    """Submit a small job (1 GPU) and return its id."""
    tag = uuid.uuid4().hex[:6]
    out = cluster.ctl(
        "sbatch",
        "--parsable",
        "--gres=gpu:1",
        f"--job-name=fy-cl-{tag}",
        "-o",
        "/dev/null",
        *args,
        "--wrap",
        f"sleep {seconds}",
    )
    return out.strip().split(";")[0]


def job_fields(cluster: Any, job_id: str) -> dict[str, str]:
    from slurm_fleetyield.adapters.slurm import parse_kv_line

    return parse_kv_line(cluster.ctl("scontrol", "show", "job", "-o", job_id).strip())


def wait_ran(cluster: Any, job_ids: list[str], *, timeout: float = 120) -> dict[str, str]:
    """Wait until every job has started (sacct knows its node); returns {job: node}."""

    def placed() -> dict[str, str] | None:
        out = cluster.ctl("sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State,NodeList")
        nodes = {}
        for line in out.splitlines():
            job, state, node = line.split("|")
            assert state not in {"FAILED", "NODE_FAIL", "CANCELLED", "TIMEOUT"}, line
            if state in {"RUNNING", "COMPLETED"} and node in NODES:
                nodes[job] = node
        return nodes if set(nodes) == set(job_ids) else None

    return cluster.poll(placed, timeout=timeout, what=f"jobs {job_ids} to start")


def wait_tier(cluster: Any, node: str, tier: str, *, timeout: float = 60) -> dict[str, Any]:
    return cluster.poll(
        lambda: (row := cluster.rows()[node])["tier"] == tier and row,
        timeout=timeout,
        interval=0.25,
        what=f"{node} tier {tier}",
    )


# --- 0. The pieces: job_submit.lua loaded by slurmctld, its constraints accepted, agents pushing -------


def test_job_submit_lua_is_loaded_and_its_constraints_are_accepted(world: Any) -> None:
    config = world.ctl("scontrol", "show", "config")
    assert re.search(r"^JobSubmitPlugins\s+=\s+lua$", config, re.MULTILINE), config
    logs = subprocess.run([world.docker, "logs", "slurmctld"], capture_output=True, text=True).stderr
    assert "lua: fleetyield: job_submit.lua loaded" in logs
    cases = {
        (): "fy_ok_train",  # no class: treated like pretrain (green only)
        ("--constraint=h100&nvlink",): "h100&nvlink&fy_ok_train",
        ("--constraint=h100|l40s",): "(h100|l40s)&fy_ok_train",
        ("--constraint=[h100|l40s]",): "[h100|l40s]&fy_ok_train",
        ("--comment=fy:decode",): "fy_ok_decode",
        ("--comment=fy:batch", "--constraint=h100|l40s"): "(h100|l40s)&fy_ok_batch",
        ("--comment=fy:finetune",): "fy_ok_finetune",
    }
    jobs = {}
    for args, want in cases.items():
        job = sbatch(world, *args)
        assert job_fields(world, job)["Features"] == want, (args, job_fields(world, job))
        jobs[job] = args
    wait_ran(world, list(jobs))  # slurmctld accepted and scheduled every form
    rejected = world.exec("slurmctld", "sbatch", "--comment=fy:bogus", "--wrap", "true", check=False)
    assert rejected.returncode != 0 and "unknown workload class" in rejected.stderr, rejected


def test_agents_push_to_the_controller_with_the_shared_secret(world: Any) -> None:
    mode = world.exec("fleetyield", "stat", "-c", "%a %U", "/etc/fleetyield-secret/push.secret").stdout
    assert mode.split() == ["600", "root"], mode
    for node in NODES:
        cmd = world.exec(
            node, "bash", "-c", "cat /proc/$(cat /run/fleetyield/agent.pid)/cmdline | tr '\\0' ' '"
        )
        assert "--push-url http://fleetyield:9402/v1/agent/events" in cmd.stdout, cmd.stdout
    hooks = world.exec("gpu-h100-1", "cat", "/etc/fleetyield/hooks.conf").stdout
    assert re.search(r"^controller_url = http://fleetyield:9401$", hooks, re.MULTILINE), hooks
    gate = world.ctl("curl", "-fsS", "http://fleetyield:9401/v1/nodes/gpu-h100-1/gate")
    assert '"allow": true' in gate, gate


# --- 1. NVLink CRC growth: X loses fy_nvlink_full and fy_ok_train; NVLink jobs avoid X ------------------


def test_nvlink_crc_growth_strips_nvlink_features_and_jobs_avoid_the_node(world: Any) -> None:
    x, other = H100
    world.agent(x, "fault", "degrade", "--gpu", "2", "--mode", "nvlink_crc", "--rate", "50")
    info = world.poll(
        lambda: (i := world.node_info()) and "fy_nvlink_full" not in features(i, x) and i,
        timeout=10 * TICK_S,
        interval=0.25,
        what=f"{x} to lose fy_nvlink_full",
    )
    assert "fy_ok_train" not in features(info, x), info[x]
    assert {"h100", "nvlink", "fy_premium"} <= features(info, x), "admin features are kept"
    assert {"fy_nvlink_full", "fy_ok_train"} <= features(info, other)
    assert "nvlink_crc" in " ".join(world.api(f"/v1/nodes/{x}/explain")["text"].split()).lower()

    jobs = [sbatch(world, "--constraint=fy_nvlink_full") for _ in range(4)]
    for job in jobs:  # what job_submit.lua made of it: the user's constraint AND the class feature
        assert job_fields(world, job)["Features"] == "fy_nvlink_full&fy_ok_train"
    placed = wait_ran(world, jobs)
    assert set(placed.values()) == {other}, placed


# --- 2. HBM degradation: X yellow; checkpointable work lands there, non-checkpointable does not --------


def make_yellow(world: Any, x: str) -> None:
    """HBM degradation on ``x`` until the controller prices it yellow, then stop it there.

    Correctable ECC errors at 2/s remap a row every 5 s.  Stop the growth as soon as the controller sees
    yellow: the rate and the remapped rows then stay in the trend window (yellow for minutes), where
    letting it run on would reach 3 remapped rows in the window and red (risk model steps)."""
    world.agent(x, "fault", "degrade", "--gpu", "1", "--mode", "ecc", "--rate", "2", "--threshold", "1000")
    wait_tier(world, x, "yellow", timeout=60)
    world.agent(x, "fault", "clear", "--all")
    world.wait_ticks(2)


def test_hbm_degradation_makes_node_yellow_batch_lands_there_pretrain_does_not(world: Any) -> None:
    x, other = H100
    make_yellow(world, x)
    row = world.rows()[x]
    assert row["tier"] == "yellow", row
    assert 0.05 <= row["risk"] < 0.5, row
    info = world.node_info()
    assert {"fy_tier_yellow", "fy_ok_batch", "fy_hbm_full"} <= features(info, x), info[x]
    assert not {"fy_ok_train", "fy_ok_finetune"} & features(info, x), info[x]
    # Yellow is the cheapest tier: among the premium nodes X now comes first (10 + 1000 < 100 + 1000).
    assert int(info[x]["Weight"]) < int(info[other]["Weight"]), (info[x]["Weight"], info[other]["Weight"])

    batch = sbatch(world, "--comment=fy:batch", "--constraint=h100")
    pretrain = sbatch(world, "--comment=fy:pretrain", "--constraint=h100")
    assert job_fields(world, batch)["Features"] == "h100&fy_ok_batch"
    assert job_fields(world, pretrain)["Features"] == "h100&fy_ok_train"
    placed = wait_ran(world, [batch, pretrain])
    assert placed[batch] == x, placed
    assert placed[pretrain] == other, placed


# --- 2b. Gang widening: a pretrain job the busy green H100 cannot hold borrows the yellow one ------------


def test_gang_widening_lends_a_repaired_yellow_node_to_a_pretrain_job_that_green_cannot_hold(
    world: Any,
) -> None:
    x, other = H100
    # x fails (XID 79) and comes back through the rehabilitation ladder: yellow through its fatal history.
    world.agent(x, "fault", "inject", "--gpu", "3", "--xid", "79")
    world.poll(lambda: "DRAIN" in world.node_info()[x]["State"], timeout=30, what=f"{x} quarantined")

    def back_yellow() -> bool:
        return "DRAIN" not in world.node_info()[x]["State"] and world.rows()[x]["tier"] == "yellow"

    world.poll(back_yellow, timeout=240, interval=1, what=f"{x} back in service, yellow")
    risk = world.api(f"/v1/nodes/{x}/explain")["text"]
    assert "repeat_offender" in risk, risk
    assert "fy_ok_train" not in features(world.node_info(), x)  # no training job waits: green only
    # The green H100 is partly busy: 6 of its 8 GPUs are free, so an 8-GPU pretrain job cannot start there.
    busy = sbatch(world, "--comment=fy:batch", "-w", other, "--gres=gpu:2", seconds=300)
    assert wait_ran(world, [busy])[busy] == other
    pretrain = sbatch(world, "--comment=fy:pretrain", "--constraint=h100", "--gres=gpu:8", seconds=3)
    assert job_fields(world, pretrain)["Features"] == "h100&fy_ok_train"
    assert wait_ran(world, [pretrain])[pretrain] == x  # the controller lent x fy_ok_train; Slurm placed it
    row = world.rows()[x]
    assert row["tier"] == "yellow", row
    # the job ran for 3 s; with no training job waiting the loan ends at the next tick
    world.poll(
        lambda: "fy_ok_train" not in features(world.node_info(), x),
        timeout=60,
        what=f"{x} to lose the lent fy_ok_train",
    )
    kinds = {e["kind"] for e in world.api(f"/v1/events?node={x}&limit=200")}
    assert {"gang_lend", "gang_return"} <= kinds, kinds


# --- 2c. Keep open: with every node yellow, one still carries each class feature, so sbatch accepts --------


def test_with_every_node_yellow_one_node_keeps_each_class_submittable(world: Any) -> None:
    # Slurm refuses at submission a constraint no node has ("Invalid feature specification"): without keep
    # open, a fleet without a green node refuses every pretrain, finetune and decode job.
    ecc = ("fault", "degrade", "--gpu", "1", "--mode", "ecc", "--rate", "2", "--threshold", "1000")
    for n in NODES:
        world.agent(n, *ecc)
    left = set(NODES)

    def all_yellow() -> bool:
        rows = world.rows()
        for n in sorted(left):
            if rows[n]["tier"] == "yellow":  # stop its growth there (make_yellow's reasoning)
                world.agent(n, "fault", "clear", "--all")
                left.discard(n)
        return not left

    world.poll(all_yellow, timeout=90, interval=0.25, what="every node yellow")
    world.wait_ticks(2)
    info = world.node_info()
    assert all("fy_tier_yellow" in features(info, n) for n in NODES), info
    carriers = {f: {n for n in NODES if f in features(info, n)} for f in ("fy_ok_train", "fy_ok_finetune")}
    assert len(carriers["fy_ok_train"]) == 1, carriers  # all have 8 GPUs: the lowest risk
    assert len(carriers["fy_ok_finetune"]) == 1, carriers
    decode = {n for n in NODES if "fy_ok_decode" in features(info, n)}
    assert len(decode) == 1 and decode <= set(L40S), info  # decode: a non-premium node first
    pretrain = sbatch(world, "--comment=fy:pretrain")  # accepted (sbatch would exit 1 on a refusal)
    finetune = sbatch(world, "--comment=fy:finetune")
    dec = sbatch(world, "--comment=fy:decode")
    placed = wait_ran(world, [pretrain, finetune, dec])
    assert placed[pretrain] in carriers["fy_ok_train"] and placed[dec] in decode, placed
    kinds = [e["kind"] for e in world.api("/v1/events?limit=500")]
    assert "open_lend" in kinds, kinds


# --- 2d. Premium reclaim: batch holding both H100s is requeued for a pending pretrain job ---------------


RECLAIM_AFTER_S = tomllib.loads(CONTROLLER_TOML.read_text())["core"]["reclaim"]["after_s"]


def test_batch_on_the_h100s_is_requeued_for_a_pending_pretrain_job(world: Any) -> None:
    # Batch started on idle H100s before any premium work (pinned with -w here; Slurm's weights would put
    # it on the L40S first), then an 8-GPU pretrain job that only an H100 can take arrives and pends.
    batch = [
        sbatch(world, "--comment=fy:batch", "--requeue", "--gres=gpu:8", "-w", n, seconds=3600) for n in H100
    ]
    wait_ran(world, batch)
    pretrain = sbatch(world, "--comment=fy:pretrain", "--constraint=h100", "--gres=gpu:8", seconds=3600)
    assert job_fields(world, pretrain)["JobState"] == "PENDING"
    placed = wait_ran(world, [pretrain], timeout=RECLAIM_AFTER_S + 60)
    fields = {j: job_fields(world, j) for j in batch}
    moved = [j for j, f in fields.items() if f.get("Restarts", "0") != "0"]
    assert len(moved) == 1, fields  # one 8-GPU job frees one node: the youngest, never both
    (kept,) = set(batch) - set(moved)
    assert fields[kept]["JobState"] == "RUNNING", fields[kept]
    node = fields[moved[0]].get("ReqNodeList") or ""
    assert placed[pretrain] == node, (placed, fields[moved[0]])
    assert moved == [max(batch, key=int)], moved
    events = world.api(f"/v1/events?node={node}&limit=100")
    reclaim = [e for e in events if e["kind"] == "reclaim"]
    assert reclaim and f"pretrain job {pretrain}" in reclaim[0]["message"], events
    assert moved[0] in reclaim[0]["message"]
    # the requeued job cannot come back onto the reclaimed node before the pretrain job holds it, and the
    # wall lifts once it runs: the node carries fy_ok_batch again
    world.poll(
        lambda: "fy_ok_batch" in features(world.node_info(), node),
        timeout=30,
        what=f"fy_ok_batch back on {node} once pretrain job {pretrain} runs",
    )
    assert job_fields(world, moved[0])["JobState"] == "PENDING"


# --- 3. Decode never lands on a premium node while a non-premium one fits ------------------------------


def test_decode_jobs_never_land_on_premium_nodes(world: Any) -> None:
    jobs = [sbatch(world, "--comment=fy:decode", "--gres=gpu:2", seconds=3) for _ in range(8)]
    for job in jobs:
        assert job_fields(world, job)["Features"] == "fy_ok_decode"
    placed = wait_ran(world, jobs)
    assert set(placed.values()) <= set(L40S), placed
    info = world.node_info()
    for node in H100:
        assert "fy_ok_decode" not in features(info, node)


# --- 4. XID 79: drained with our reason within the latency goal; the job on that GPU is requeued, ------
# --- a job on another GPU of the node finishes under the drain ------------------------------------------


def test_xid79_drains_within_latency_goal_and_requeues_the_running_job(world: Any) -> None:
    job = sbatch(world, "--requeue", seconds=3600)
    x = wait_ran(world, [job])[job]
    neighbour = sbatch(world, "--requeue", "-w", x, seconds=3600)
    wait_ran(world, [neighbour])
    (gpu,) = world.job_gpus(job)
    assert gpu not in world.job_gpus(neighbour)

    timing = world.inject_and_time_drain(x, gpu=gpu, xid=79)
    fields = world.node_info()[x]
    assert "DRAIN" in fields["State"], fields
    assert fields["Reason"].startswith("fleetyield: "), fields["Reason"]
    assert "XID 79" in fields["Reason"], fields["Reason"]
    print(f"\nXID 79 -> DRAIN on {x}: {timing['drain_s']:.3f} s (inject command {timing['inject_s']:.3f} s)")
    assert timing["drain_s"] <= 2 * LATENCY_GOAL_S, timing  # one sample; bench_latency.py measures p50

    def requeued() -> dict[str, str] | None:
        f = job_fields(world, job)
        restarted = int(f.get("Restarts", "0")) >= 1
        moved = f["JobState"] == "PENDING" or (f["JobState"] == "RUNNING" and f.get("NodeList") != x)
        return f if restarted and moved else None

    f = world.poll(requeued, timeout=30, what=f"job {job} requeued off {x}")
    assert f.get("NodeList") != x, f
    sacct = ("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State")
    history = world.poll(
        lambda: "REQUEUED" in (o := world.ctl(*sacct)) and o,
        timeout=30,
        what=f"sacct to show job {job} REQUEUED",
    )
    assert "REQUEUED" in history.split(), history
    events = world.api(f"/v1/events?node={x}&limit=50")
    assert any(e["kind"] == "applied" and "requeue" in e["message"] and job in e["message"] for e in events)
    n = job_fields(world, neighbour)  # on a healthy GPU: still running on x, never requeued
    assert n["JobState"] == "RUNNING" and n.get("NodeList") == x and n.get("Restarts", "0") == "0", n
    world.ctl("scancel", neighbour)


def test_xid79_fault_to_drain_latency_p50(world: Any) -> None:
    """Three injections on an idle node: median fault -> DRAIN within one tick interval plus a second. The
    latency goal itself (p50 <= 1 s, measured over 12 injections) is bench/bench_latency.py's and bench's
    README table's: a timed assertion on a shared, loaded CI machine fails on noise (CI: 0.58, 4.07, 1.06 s
    with a simulator sweep on the other core), not on the code."""
    x = "gpu-l40s-2"
    samples = []
    for i in range(3):
        samples.append(world.inject_and_time_drain(x, gpu=i, xid=79)["drain_s"])
        # The next scrape sees the XID counter grow too: let it (the node is drained by us, so that is
        # moot) before resuming, or it would count as fresh evidence against a resumed node.
        world.wait_ticks(2)
        world.agent(x, "fault", "clear", "--all")
        world.poll(lambda: gpu_count(world.metrics(x)) == 8, timeout=30, what=f"GPU {i} back on {x}")
        world.wait_ticks(1)
        # The rehabilitation ladder reboots the quarantined node (RebootProgram): a resume is only possible
        # once it is back; the ladder may resume it itself (canary) meanwhile.
        world.wait_no_reboot()
        if "DRAIN" in world.node_info()[x]["State"]:
            world.ctl("scontrol", "update", f"NodeName={x}", "State=RESUME", check=False)
        world.poll(
            lambda: world.node_info()[x]["State"] == "IDLE", timeout=60, interval=0.2, what=f"{x} IDLE"
        )
    print(f"\nXID 79 -> DRAIN samples: {', '.join(f'{s:.3f}' for s in samples)} s")
    assert statistics.median(samples) <= TICK_S + LATENCY_GOAL_S, samples


# --- 5. scontrol reconfigure: features and weights are back within one tick --------------------------


def test_reconfigure_restores_features_and_weights_within_one_tick(world: Any) -> None:
    before = {n: (f["AvailableFeatures"], f["Weight"]) for n, f in world.node_info().items()}
    t0 = float(world.ctl("date", "+%s.%N"))
    world.ctl("scontrol", "reconfigure")
    # ≤ one tick interval for the next tick to start, plus its own duration and margin.
    world.poll(
        lambda: {n: (f["AvailableFeatures"], f["Weight"]) for n, f in world.node_info().items()} == before,
        timeout=2 * TICK_S + 2,
        interval=0.1,
        what="features and weights re-asserted after scontrol reconfigure",
    )
    # It really was the controller that put them back (reconfigure resets them to slurm.conf's): a node
    # update applied since, `scontrol update ... AvailableFeatures=` or (adapter = "rest", 24.11)
    # `POST /slurm/v0.0.41/node/<name>`.
    applied = [
        e
        for e in world.api("/v1/events?limit=100")
        if e["kind"] == "applied" and e["time"] >= t0 and e["data"].get("action") == "update"
    ]
    assert applied, "no feature update applied after the reconfigure"


# --- 6. A node an admin drained is never resumed or touched -------------------------------------------


def test_admin_drained_node_is_never_touched(world: Any) -> None:
    x = "gpu-h100-2"
    world.ctl("scontrol", "update", f"NodeName={x}", "State=DRAIN", "Reason=admin maintenance")
    before = world.node_info()[x]
    assert before["Reason"].startswith("admin maintenance"), before
    world.agent(x, "fault", "inject", "--gpu", "5", "--xid", "79")  # fatal, pushed to the controller
    world.agent(x, "fault", "degrade", "--gpu", "6", "--mode", "nvlink_crc", "--rate", "50")
    world.poll(
        lambda: any(e["kind"] == "fatal_left_alone" for e in world.api(f"/v1/events?node={x}&limit=50")),
        timeout=10 * TICK_S,
        interval=0.25,
        what="the controller to see the fatal event and leave the node alone",
    )
    world.wait_ticks(4)
    after = world.node_info()[x]
    for key in ("State", "Reason", "AvailableFeatures", "ActiveFeatures", "Weight"):
        assert after[key] == before[key], (key, before[key], after[key])
    row = world.rows()[x]
    assert "drained by someone else" in row["reason"], row
    touched = [e for e in world.api("/v1/events?limit=500") if e["kind"] == "applied" and x in e["message"]]
    assert not touched, touched


# --- 7. A storm: the drain cap holds, the rest is held and visible --------------------------------------


def test_storm_cap_holds_others_are_held_not_drained(world: Any) -> None:
    core = tomllib.loads(CONTROLLER_TOML.read_text())["core"]["quarantine"]
    cap = max(core["drain_cap_min_nodes"], math.floor(core["drain_cap_fraction"] * len(NODES)))
    assert cap == 1  # 10% of 4 nodes is 0 nodes; the floor of 1 lets a small cluster quarantine one
    storm = ("gpu-h100-1", "gpu-l40s-1", "gpu-l40s-2")
    with ThreadPoolExecutor(len(storm)) as pool:
        list(pool.map(lambda n: world.agent(n, "fault", "inject", "--gpu", "0", "--xid", "79"), storm))

    def settled() -> dict[str, Any] | None:
        status = world.api("/v1/status")
        held = {h["node"] for h in status["plan"]["holds"]}
        return status if len(held) == len(storm) - cap else None

    status = world.poll(settled, timeout=10 * TICK_S, interval=0.25, what="holds for the nodes past the cap")
    for hold in status["plan"]["holds"]:
        assert hold["rule"] == "drain_cap" and hold["action"] == "drain", hold
    held_nodes = {h["node"] for h in status["plan"]["holds"]}

    # A held node's evidence came from its own agent (whose fatal marker makes the Prolog refuse every job
    # there): it is fenced, no fy_ok_* feature, until the drain happens; its running jobs are not touched.
    def fenced_row() -> dict[str, Any] | None:
        for n in storm:
            row = world.api(f"/v1/nodes/{n}")
            if "drain held" in row["reason"]:
                return row
        return None

    row = world.poll(fenced_row, timeout=10 * TICK_S, interval=0.25, what="a node priced as held")
    assert not [f for f in row["fy_features"] if f.startswith("fy_ok_")], row
    assert "the Prolog refuses every job here" in row["reason"], row

    # Visible four ways: status JSON (above), the event log, the controller's /metrics, `fleetyield status`.
    def metric_seen() -> float | None:
        m = re.search(
            r'^fleetyield_holds\{rule="drain_cap"\} (\S+)$', world.api_text("/metrics"), re.MULTILINE
        )
        return float(m.group(1)) if m and float(m.group(1)) >= 1 else None

    world.poll(metric_seen, timeout=10 * TICK_S, interval=0.25, what="fleetyield_holds{rule=drain_cap} >= 1")
    world.poll(
        lambda: "HOLD " in world.exec("fleetyield", "fleetyield", "status").stdout or None,
        timeout=10 * TICK_S,
        interval=0.5,
        what="a HOLD line in `fleetyield status`",
    )
    events = world.api("/v1/events?limit=300")
    assert held_nodes <= {e["node"] for e in events if e["kind"] == "hold"}
    # The invariant: never more than `cap` nodes drained by FleetYield at once. The docker RebootProgram
    # brings a quarantined node back within seconds (reboot, canary, probation), which frees the cap for the
    # next held node: that is the cap working, so the count is checked at every look, not a fixed node set.
    for _ in range(3):
        info = world.node_info()
        ours = [
            n for n in NODES if "DRAIN" in info[n]["State"] and info[n].get("Reason", "").startswith("fleet")
        ]
        assert len(ours) <= cap, {n: (info[n]["State"], info[n].get("Reason")) for n in NODES}
        assert "DRAIN" not in info["gpu-h100-2"]["State"]
        world.wait_ticks(1)


# --- 8. Agent unreachable: no drain, tier unknown, features kept ----------------------------------------


def test_agent_unreachable_never_drains_and_keeps_features(world: Any) -> None:
    x = "gpu-h100-1"
    # Fatal-looking last state: the row remapper runs out of spare rows (remap failure: RMA) -> red.
    world.agent(x, "fault", "degrade", "--gpu", "4", "--mode", "ecc", "--rate", "100", "--threshold", "1")
    red = wait_tier(world, x, "red", timeout=60)
    world.wait_ticks(1)
    before = world.node_info()[x]
    assert "fy_tier_red" in before["AvailableFeatures"].split(","), before
    # The agent goes away; slurmd stays up (the node keeps running jobs, Slurm sees it healthy).
    world.fy_service(x, "agent", "stop")
    row = wait_tier(world, x, "unknown", timeout=10 * TICK_S)
    assert row["scrape_error"], row
    world.wait_ticks(4)
    after = world.node_info()[x]
    assert "DRAIN" not in after["State"], after
    for key in ("AvailableFeatures", "ActiveFeatures", "Weight"):
        assert after[key] == before[key], (key, before[key], after[key])
    row = world.rows()[x]
    assert row["tier"] == "unknown" and row["weight"] == int(before["Weight"]), (red, row)
    assert world.api(f"/v1/nodes/{x}/gate")["allow"] is True
    kinds = {e["kind"] for e in world.api(f"/v1/events?node={x}&limit=200")}
    assert "drain" not in kinds, kinds
