"""The stake rule (core/stake.py) on the docker Slurm cluster: class features follow expected loss.

The cluster's own controller config runs the tier rule (its other integration tests exercise the tier rule's
mechanisms); this module switches the controller to the stake rule for its tests and back afterwards:

- ``[core.stake] enabled = true``, the site default;
- ``withhold_cap_fraction = 0.5``: the breaker's share of in-service GPUs. One 8-GPU node of 32 is 25%,
  above the default 20%, so with the default a 4-node cluster could never withhold a class from any node
  while the class has work pending; 0.5 lets the rule itself be seen;
- finetune work that cannot checkpoint (``checkpoint_s = 0``) and runs for 90 days: its stake is half that
  run, so on a red node (P(fatal within 7 d) >= 0.5) its expected loss exceeds the work it would do there,
  while hourly-checkpointing pretrain work on the same node loses ~1,000 times less and keeps running.

What the tier rule would do instead (tests/integration/test_closed_loop.py): a yellow node loses
fy_ok_train and fy_ok_finetune at once, a red node every class feature but its tier's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from test_closed_loop import H100, features, job_fields, make_yellow, sbatch, wait_ran, wait_tier

pytestmark = pytest.mark.integration

CTL = "fleetyield"
CONFIG = "/etc/fleetyield/fleetyield.toml"
STAKE_RULE = """[core.stake]
enabled = true
withhold_cap_fraction = 0.5

[core.stake.classes.pretrain]
checkpoint_s = 3600.0

[core.stake.classes.finetune]
checkpoint_s = 0.0
run_s = 7776000.0

[core.stake.classes.batch]
checkpoint_s = 1800.0

[core.stake.classes.decode]
checkpoint_s = 120.0
"""


def stake_config(tier_rule_config: str) -> str:
    """The cluster's controller config with its ``[core.stake]`` table replaced by ``STAKE_RULE``."""
    table = re.compile(r"^\[core\.stake\]\n(?:(?!\[).*\n)*", re.MULTILINE)
    new, n = table.subn(STAKE_RULE + "\n", tier_rule_config)
    assert n == 1, f"{CONFIG}: expected one [core.stake] table, found {n}"
    return new


@pytest.fixture(scope="module")
def stake_cluster(cluster: Any) -> Iterator[Any]:
    original = cluster.sh(CTL, f"cat {CONFIG}")
    cluster.fy_service(CTL, "controller", "stop")
    cluster.write_file(CTL, CONFIG, stake_config(original))
    try:
        cluster.reset_world()  # restarts the controller (empty store) on the stake rule
        yield cluster
    finally:
        cluster.fy_service(CTL, "controller", "stop")
        cluster.write_file(CTL, CONFIG, original)
        cluster.reset_world()
        cluster._fy_clean = True


@pytest.fixture
def world(stake_cluster: Any) -> Iterator[Any]:
    yield stake_cluster
    stake_cluster.reset_world()


def stake_rows(world: Any, node: str) -> dict[str, dict[str, Any]]:
    """explain's stake figures for ``node``: {class: row} (decision, loss and cost in GPU-h per hour)."""
    doc = world.api(f"/v1/nodes/{node}/explain")
    st = doc["explain"]["stake"]
    assert st and st["weighed"], doc["text"]
    return {c["class"]: c for c in st["classes"]}


def test_a_yellow_node_keeps_training_work_and_runs_it_when_the_green_one_is_busy(world: Any) -> None:
    x, other = H100
    make_yellow(world, x)
    world.wait_ticks(2)
    info = world.node_info()
    # The tier rule would strip both: a yellow node's risk is tiny next to the work an hour of training does.
    assert {"fy_tier_yellow", "fy_ok_train", "fy_ok_finetune", "fy_ok_batch"} <= features(info, x), info[x]
    rows = stake_rows(world, x)
    assert rows["pretrain"]["decision"] == "carried", rows["pretrain"]
    assert rows["pretrain"]["loss_gpu_h_per_h"] < rows["pretrain"]["cost_gpu_h_per_h"], rows["pretrain"]
    # The weights still order by risk: the safest node is used first.
    assert int(info[other]["Weight"]) < int(info[x]["Weight"]), (info[other]["Weight"], info[x]["Weight"])
    first = sbatch(world, "--comment=fy:pretrain", "--constraint=h100", "--gres=gpu:8", seconds=300)
    assert job_fields(world, first)["Features"] == "h100&fy_ok_train"
    assert wait_ran(world, [first])[first] == other
    # The green H100 is full: the next 8-GPU pretrain job runs on the yellow one instead of waiting.
    second = sbatch(world, "--comment=fy:pretrain", "--constraint=h100", "--gres=gpu:8", seconds=3)
    assert wait_ran(world, [second])[second] == x
    assert world.rows()[x]["tier"] == "yellow"


def test_a_red_node_withholds_only_the_class_whose_stake_outweighs_its_work(world: Any) -> None:
    x, other = H100
    # The row remapper runs out of spare rows (remap failure) -> red, P(fatal within 7 d) >= 0.5.
    world.agent(x, "fault", "degrade", "--gpu", "4", "--mode", "ecc", "--rate", "100", "--threshold", "1")
    wait_tier(world, x, "red", timeout=60)
    world.wait_ticks(2)

    def withheld() -> dict[str, dict[str, Any]] | None:
        rows = stake_rows(world, x)
        return rows if rows["finetune"]["decision"] == "withheld" else None

    rows = world.poll(withheld, timeout=30, what=f"{x} to withhold fy_ok_finetune")
    fin, pre = rows["finetune"], rows["pretrain"]
    assert fin["loss_gpu_h_per_h"] > fin["cost_gpu_h_per_h"], fin
    assert pre["decision"] == "carried" and pre["loss_gpu_h_per_h"] < pre["cost_gpu_h_per_h"], pre
    info = world.node_info()
    assert "fy_ok_finetune" not in features(info, x), info[x]
    assert {"fy_tier_red", "fy_ok_train", "fy_ok_batch"} <= features(info, x), info[x]
    assert "fy_ok_finetune" in features(info, other), info[other]
    text = world.api(f"/v1/nodes/{x}/explain")["text"]
    assert "withheld" in text and "fy_ok_finetune" in text, text
    # Finetune work (non-checkpointable) goes to the other H100; pretrain may still use the red one.
    fine = sbatch(world, "--comment=fy:finetune", "--constraint=h100", seconds=3)
    assert job_fields(world, fine)["Features"] == "h100&fy_ok_finetune"
    assert wait_ran(world, [fine])[fine] == other
