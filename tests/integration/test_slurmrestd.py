"""The slurmrestd adapter against the docker cluster's real slurmrestd (auth/jwt, issue #29).

The adapter runs inside the controller container (``fleetyield``: the installed package, the token in
/shared/slurmrest/token, slurmrestd at slurmctld:6820). Every write is verified with ``scontrol show``,
polled with a deadline. CI runs the short ones; ``make test-rest`` (FLEETYIELD_REST_LOOP=1) adds the
closed loop on adapter = "rest" (the controller's config swapped, as test_stake_rule.py does).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from test_closed_loop import job_fields, sbatch, wait_ran

pytestmark = pytest.mark.integration

CTL = "fleetyield"
NODE = "gpu-l40s-2"
PRELUDE = """
import dataclasses, json, sys
from slurm_fleetyield.adapters.slurm import SlurmCli
from slurm_fleetyield.adapters.slurmrest import SlurmRest, TokenFile
from slurm_fleetyield.core.plan import *
cli = SlurmCli()
rest = SlurmRest("http://slurmctld:6820", "root", TokenFile("/shared/slurmrest/token"), cli)
def dump(x):
    print(json.dumps(x, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o)))
"""


def rest_py(cluster: Any, code: str) -> Any:
    out = cluster.exec(CTL, "/opt/fleetyield/bin/python", "-c", PRELUDE + code, timeout=60).stdout
    lines = out.strip().splitlines()
    assert lines, f"no output from {code!r}"
    return json.loads(lines[-1])


def rest_apply(cluster: Any, actions: str) -> list[list[str]]:
    """``rest.apply(Plan(actions=(<actions>,)))`` in the controller container; every result must be ok.
    The commands executed: (method, endpoint) over REST, else the CLI's argv."""
    report = rest_py(
        cluster,
        f"r = rest.apply(Plan(actions=({actions},)));"
        " dump([(x.ok, list(x.command), x.detail) for x in r.results])",
    )
    assert report and all(ok for ok, _, _ in report), report
    return [command for _, command, _ in report]


def slurm_version(cluster: Any) -> tuple[int, int]:
    """The cluster's Slurm release (``scontrol --version``: "slurm 22.05.8" or "slurm-wlm 24.11.5")."""
    out = cluster.exec("slurmctld", "scontrol", "--version").stdout
    m = re.search(r"(\d+)\.(\d+)\.\d+", out)
    assert m, out
    return int(m.group(1)), int(m.group(2))


def writes_over_rest(cluster: Any) -> bool:
    """Node updates go over REST from v0.0.39 (Slurm 23.02); 22.05 serves up to v0.0.38: scontrol."""
    return slurm_version(cluster) >= (23, 2)


@pytest.fixture(scope="module")
def quiet(cluster: Any) -> Iterator[Any]:
    """The controller stopped (it would undo our writes within a tick); a clean world afterwards."""
    cluster.reset_world()
    cluster.fy_service(CTL, "controller", "stop")
    try:
        yield cluster
    finally:
        cluster.reset_world()
        cluster._fy_clean = True


def test_rest_reads_the_same_nodes_and_jobs_as_the_cli(quiet: Any) -> None:
    job = sbatch(quiet, "--requeue", "--comment=fy:decode", seconds=600)
    wait_ran(quiet, [job])
    both = rest_py(
        quiet,
        "dump({'version': rest.api().prefix,"
        " 'nodes': [{k: dataclasses.asdict(v) for k, v in sorted(a.read_nodes().items())}"
        " for a in (cli, rest)],"
        " 'jobs': [[dataclasses.asdict(j) for j in a.read_jobs()] for a in (cli, rest)]})",
    )
    served = tuple(int(x) for x in re.findall(r"\d+", both["version"]))
    if writes_over_rest(quiet):
        assert served >= (0, 0, 39), both["version"]  # 24.11 serves v0.0.40-v0.0.42
    else:
        assert served == (0, 0, 38), both["version"]
    cli_nodes, rest_nodes = both["nodes"]
    assert len(cli_nodes) == 4 and rest_nodes == cli_nodes
    cli_jobs, rest_jobs = both["jobs"]
    # Jobs that ended within MinJobAge: 22.05's `squeue --json` lists them as its REST /jobs does; 24.11's
    # squeue --json does not, its REST /jobs does. The decisions read only live states: those must agree.
    live = ("PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING")
    assert [j for j in rest_jobs if j["state"] in live] == [j for j in cli_jobs if j["state"] in live]
    if not writes_over_rest(quiet):
        assert rest_jobs == cli_jobs
    (ours,) = [j for j in rest_jobs if j["job_id"] == int(job)]
    assert ours["state"] == "RUNNING" and ours["workload"] == "decode" and ours["gpus"] == 1, ours
    quiet.ctl("scancel", job)


def node_fields(cluster: Any, node: str) -> dict[str, str]:
    return cluster.node_info()[node]


def test_rest_sets_features_and_weight_drains_resumes_and_requeues(quiet: Any) -> None:
    before = node_fields(quiet, NODE)
    (command,) = rest_apply(quiet, f"UpdateNodes(({NODE!r},), ('l40s', 'fy_rest_probe'), 777)")
    over_rest = writes_over_rest(quiet)
    assert (command[0] == "POST") == over_rest and (not over_rest or command[1].endswith(f"/node/{NODE}")), (
        command
    )
    quiet.poll(
        lambda: (f := node_fields(quiet, NODE))["Weight"] == "777" and "fy_rest_probe" in f["ActiveFeatures"],
        timeout=10,
        what=f"{NODE} weight 777 and feature fy_rest_probe",
    )
    restore = (
        f"UpdateNodes(({NODE!r},), tuple({before['AvailableFeatures']!r}.split(',')), {before['Weight']})"
    )
    rest_apply(quiet, restore)

    job = sbatch(quiet, "--requeue", "-w", NODE, seconds=600)
    wait_ran(quiet, [job])
    reason = "fleetyield: rest adapter probe"
    rest_apply(quiet, f"DrainNode({NODE!r}, {reason!r}, ({job},))")
    quiet.poll(
        lambda: (
            "DRAIN" in (f := node_fields(quiet, NODE))["State"] and f.get("Reason", "").startswith(reason)
        ),
        timeout=10,
        what=f"{NODE} DRAIN with our reason",
    )
    quiet.poll(
        lambda: int(job_fields(quiet, job).get("Restarts", "0")) >= 1,
        timeout=30,
        what=f"job {job} requeued",
    )
    (command,) = rest_apply(quiet, f"ResumeNode({NODE!r}, 'probe done')")
    assert (command[0] == "POST") == over_rest, command
    quiet.poll(lambda: "DRAIN" not in node_fields(quiet, NODE)["State"], timeout=10, what=f"{NODE} resumed")
    quiet.ctl("scancel", job)


def test_a_bad_token_is_a_clear_error_naming_the_endpoint(quiet: Any) -> None:
    out = quiet.exec(
        CTL,
        "bash",
        "-c",
        "umask 077 && echo not-a-jwt > /tmp/bad.token && /opt/fleetyield/bin/python -c '"
        "from slurm_fleetyield.adapters.slurm import SlurmCli, SlurmCommandError\n"
        "from slurm_fleetyield.adapters.slurmrest import SlurmRest, TokenFile\n"
        'r = SlurmRest("http://slurmctld:6820", "root", TokenFile("/tmp/bad.token"), SlurmCli())\n'
        "try:\n    r.ping()\nexcept SlurmCommandError as e:\n    print(e)\n'",
    ).stdout
    assert "slurmrestd GET /slurm/v" in out, out
    if writes_over_rest(quiet):  # 24.11: HTTP 200, slurmctld "pinged": "DOWN"
        assert "no slurmctld answered UP (slurmctld DOWN)" in out, out
    else:
        assert "HTTP 500" in out, out
    assert "not-a-jwt" not in out  # the token is never printed


@pytest.fixture(scope="module")
def rest_controller(cluster: Any) -> Iterator[Any]:
    with cluster.on_rest_adapter():
        yield cluster
    cluster._fy_clean = True


@pytest.mark.skipif(
    not os.environ.get("FLEETYIELD_REST_LOOP"), reason="the closed loop on adapter = 'rest': make test-rest"
)
def test_closed_loop_on_rest_a_fatal_xid_drains_and_requeues(rest_controller: Any) -> None:
    world = rest_controller
    job = sbatch(world, "--requeue", seconds=3600)
    x = wait_ran(world, [job])[job]
    (gpu,) = world.job_gpus(job)
    timing = world.inject_and_time_drain(x, gpu=gpu, xid=79)
    fields = world.node_info()[x]
    assert "DRAIN" in fields["State"] and "XID 79" in fields["Reason"], fields
    print(f"\nadapter=rest: XID 79 -> DRAIN on {x}: {timing['drain_s']:.3f} s")

    def requeued() -> dict[str, str] | None:
        f = job_fields(world, job)
        return f if int(f.get("Restarts", "0")) >= 1 and f.get("NodeList") != x else None

    world.poll(requeued, timeout=30, what=f"job {job} requeued off {x}")
