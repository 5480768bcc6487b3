"""Hot spares (issue #26 lever 3) on the docker Slurm cluster: the tested slurm.conf and the closed loop.

What is real here: slurmctld's QOS preemption (``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``, QOS
``fy_preemptible`` that QOS ``normal`` may preempt: slurm/fleetyield-spares.conf and the entrypoint's
sacctmgr lines), job_submit.lua's gang and preemptible classes (slurmctld's environment in
docker-compose.yml), the controller's spare designation and Slurm's requeue and placement. Simulated: the
fatal GPU fault (the fake GPU backend's XID 79).

The cluster's controller runs ``[core.spares] enabled = true`` with ``min = 0``: on four nodes the sizing
rule holds no spare (the expected restart wait a spare saves is far below a node-day of idle GPUs). The
closed-loop test sets the admin floor ``min = 1`` to see one, and restores the config afterwards.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_closed_loop import H100, L40S, features, job_fields, sbatch, wait_ran

pytestmark = pytest.mark.integration

CTL = "fleetyield"
CONFIG = "/etc/fleetyield/fleetyield.toml"
CLASS_FEATURES = {"fy_ok_train", "fy_ok_finetune", "fy_ok_decode", "fy_ok_batch"}


def restarts(world: Any, job: str) -> int:
    return int(job_fields(world, job).get("Restarts", "0"))


def test_a_preemptible_job_is_requeued_for_a_normal_one(world: Any) -> None:
    """slurm.conf's preemption alone: a normal-QOS job that needs the node requeues the fy_preemptible one."""
    node = L40S[0]
    low = sbatch(world, "--qos=fy_preemptible", "--comment=fy:batch", "--gres=gpu:8", "-w", node, seconds=600)
    assert job_fields(world, low)["QOS"] == "fy_preemptible"
    wait_ran(world, [low])
    high = sbatch(world, "--comment=fy:batch", "--gres=gpu:8", "-w", node, seconds=3600)
    placed = wait_ran(world, [high], timeout=60)
    assert placed[high] == node
    f = world.poll(
        lambda: (g := job_fields(world, low)) and int(g.get("Restarts", "0")) >= 1 and g,
        timeout=30,
        what=f"preemptible job {low} requeued",
    )
    assert f["JobState"] == "PENDING", f
    history = world.ctl("sacct", "-n", "-X", "-P", "-D", "-j", low, "-o", "State").split()
    assert "PREEMPTED" in history or "REQUEUED" in history, history


def test_job_submit_maps_gangs_and_preemptible_work_to_their_features(world: Any) -> None:
    gang_job = sbatch(world, "-N", "2", "--gres=gpu:8", "--hold", seconds=1)
    assert job_fields(world, gang_job)["Features"] == "fy_ok_gang"
    one = sbatch(world, "--gres=gpu:8", "--hold", seconds=1)
    assert job_fields(world, one)["Features"] == "fy_ok_train"
    low = sbatch(world, "--qos=fy_preemptible", "--comment=fy:finetune", "--hold", seconds=1)
    assert job_fields(world, low)["Features"] == "fy_ok_preempt"
    world.ctl("scancel", gang_job, one, low)
    # With no gang at risk and min = 0, no spare; the twins sit beside their class features everywhere.
    info = world.node_info()
    for node in info:
        f = features(info, node)
        assert "fy_spare" not in f, info[node]
        assert "fy_ok_gang" in f and "fy_ok_train" in f, info[node]
        assert "fy_ok_preempt" in f and "fy_ok_batch" in f, info[node]


def spares_config(config: str) -> str:
    """The cluster's controller config with ``[core.spares] min = 1`` (the admin floor) and ``max_fraction =
    0.5`` (the default 5% of four nodes is none)."""
    table = re.compile(r"^\[core\.spares\]\n(?:(?!\[).*\n)*", re.MULTILINE)
    m = table.search(config)
    assert m, f"{CONFIG}: no [core.spares] table"
    body = re.sub(r"^(min|max_fraction)\s*=.*\n", "", m.group(0), flags=re.MULTILINE)
    return config[: m.start()] + body.rstrip("\n") + "\nmin = 1\nmax_fraction = 0.5\n\n" + config[m.end() :]


@pytest.fixture
def floor_one(cluster: Any) -> Iterator[Any]:
    original = cluster.sh(CTL, f"cat {CONFIG}")
    cluster.fy_service(CTL, "controller", "stop")
    cluster.write_file(CTL, CONFIG, spares_config(original))
    try:
        cluster.reset_world()
        yield cluster
    finally:
        cluster.fy_service(CTL, "controller", "stop")
        cluster.write_file(CTL, CONFIG, original)
        cluster.reset_world()
        cluster._fy_clean = True


def test_a_requeued_gang_restarts_on_the_hot_spare_preempting_its_filler(floor_one: Any) -> None:
    world = floor_one
    # A 2-node gang; Slurm's weights put it on the L40S pair (the H100s are premium).
    gang_job = sbatch(world, "-N", "2", "--gres=gpu:8", "--requeue", seconds=3600)
    assert job_fields(world, gang_job)["Features"] == "fy_ok_gang"
    gang_nodes = world.poll(
        lambda: job_fields(world, gang_job)["JobState"] == "RUNNING" and _nodes(world, gang_job),
        timeout=60,
        what=f"gang {gang_job} running",
    )
    assert gang_nodes == set(L40S), gang_nodes

    def spare() -> str | None:
        info = world.node_info()
        held = [n for n in H100 if "fy_spare" in features(info, n)]
        return held[0] if len(held) == 1 else None

    s = world.poll(spare, timeout=30, what="one H100 designated hot spare (min = 1)")
    (other,) = set(H100) - {s}
    info = world.node_info()
    f = features(info, s)
    assert {"fy_spare", "fy_ok_gang", "fy_ok_preempt"} <= f and not (f & CLASS_FEATURES), info[s]
    assert "h100" in f and "nvlink" in f, info[s]  # the admin's own features stay
    text = world.api(f"/v1/nodes/{s}/explain")["text"]
    assert "spare" in text, text
    # Ordinary work does not land on the spare; preemptible work may fill it.
    fine = sbatch(world, "--comment=fy:finetune", "--constraint=h100", seconds=3600)
    assert wait_ran(world, [fine])[fine] == other
    filler = sbatch(
        world,
        "--qos=fy_preemptible",
        "--comment=fy:batch",
        "--gres=gpu:8",
        "--requeue",
        "--constraint=h100",
        seconds=3600,
    )
    assert job_fields(world, filler)["Features"] == "h100&fy_ok_preempt"
    assert wait_ran(world, [filler])[filler] == s
    # A fatal fault on a gang node: the controller drains it and requeues the gang; Slurm restarts it on
    # the other L40S and the spare, preempting (requeueing) the filler. The gang's restart waits for the
    # faulted node's reboot (its old job is COMPLETING there until the node registers again), so the fault
    # is one no reset clears: a fixed node could pass its canary and take the gang back before Slurm's next
    # scheduling pass (a CI run saw that race).
    x = sorted(gang_nodes)[0]
    t0 = time.time()
    world.inject_and_time_drain(x, gpu=0, xid=79, reset_fixes=False)

    def running_again() -> set[str] | None:
        g = job_fields(world, gang_job)
        if int(g.get("Restarts", "0")) < 1 or g["JobState"] != "RUNNING":
            return None
        return _nodes(world, gang_job)

    now_on = world.poll(running_again, timeout=90, what=f"gang {gang_job} running again")
    t1 = time.time()
    assert now_on == (set(L40S) - {x}) | {s}, now_on
    assert restarts(world, filler) >= 1 and job_fields(world, filler)["JobState"] == "PENDING"
    assert job_fields(world, fine)["JobState"] == "RUNNING" and restarts(world, fine) == 0
    print(
        f"\nfatal XID on {x} -> gang {gang_job} running on {sorted(now_on)}: {t1 - t0:.1f} s "
        f"(filler {filler} requeued by QOS preemption)"
    )


def _nodes(world: Any, job: str) -> set[str]:
    """The nodes a running job holds, expanded."""
    hl = world.ctl("squeue", "-h", "-j", job, "-o", "%N").strip()
    return set(world.ctl("scontrol", "show", "hostnames", hl).split()) if hl else set()
