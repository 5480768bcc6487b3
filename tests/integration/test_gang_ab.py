"""The gang A/B's FleetYield arm on the docker cluster (chaos/gang_ab.py), short: a 3-node gang, one XID.

About 2 minutes: the arm's reset and fresh controller (~40 s), 24 s of work, the fault, the requeue, the
restore. The bare arm (a hang to the collective timeout, then NHC's drain and the requeue) is what
``make ab-gang`` measures; here the FleetYield arm must requeue the whole gang before its collective timeout
and the gang must finish on the three other nodes from its last checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slurm_fleetyield.chaos import gang, gang_ab
from slurm_fleetyield.chaos.ab import Cluster
from slurm_fleetyield.chaos.runner import docker_exec

pytestmark = pytest.mark.integration


def test_fleetyield_requeues_the_whole_gang_before_its_collective_timeout(cluster: Any, tmp_path: Path):
    gp = gang.GangParams(work_s=24.0, ckpt_s=8.0, collective_timeout_s=60.0, health_check_interval_s=30.0)
    p = gang.plan(1, gp)
    try:
        res = gang_ab.run_gang_arm(p, gp, "fleetyield", docker_exec, tmp_path, deadline_s=240.0)
    finally:
        Cluster(docker_exec, gang_ab.NODES).restore()
        cluster._fy_clean = False  # the next `world` test resets
    (r,) = res["recoveries"]
    assert r["hit"] and r["attempt_state"] == "REQUEUED" and not r["timed_out"], res["sacct"]
    assert r["drained_s"] is not None and r["drained_s"] < 10.0
    assert r["recovery_s"] is not None and r["recovery_s"] < gp.collective_timeout_s, res["sacct"]
    assert r["relanded"] == 0 and 0 <= r["lost_s"] <= gp.ckpt_s + 1
    assert res["wall_s"] is not None and not res["unfinished"]
    assert res["fault_node"] in res["nodes"]
