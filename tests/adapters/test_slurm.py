"""SlurmCli on captured Slurm output, through the subprocess seam (a recording runner, no fake Slurm)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from slurm_fleetyield.adapters.slurm import (
    CommandResult,
    DryRunSlurm,
    SlurmCli,
    SlurmCommandError,
    gpu_indices,
    job_gpu_index,
    parse_gres,
    parse_kv_line,
    parse_nodes_text,
    parse_reason,
    parse_show_jobs,
    parse_states,
    parse_version,
    run_command,
)
from slurm_fleetyield.core.model import WorkloadClass
from slurm_fleetyield.core.plan import DrainNode, Plan, RequeueJobs, ResumeNode, SignalJobs, UpdateNodes

FIXTURES = Path(__file__).parent / "fixtures"


class Recorder:
    """Answers commands from a table (first matching prefix wins) and records every argv it was given."""

    def __init__(
        self, table: dict[tuple[str, ...], CommandResult | Callable[[Sequence[str]], CommandResult]]
    ):
        self.table = table
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        for prefix, answer in self.table.items():
            if argv[: len(prefix)] == prefix:
                return answer(argv) if callable(answer) else answer
        return CommandResult(0, "", "")


def ok(stdout: str = "") -> CommandResult:
    return CommandResult(0, stdout, "")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# ------------------------------------------------------------------------------------------------------
# parsing
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [("slurm 22.05.8\n", (22, 5, 8)), ("slurm-wlm 24.11.1", (24, 11, 1)), ("slurm 23.02", (23, 2, 0))],
)
def test_parse_version(text, version):
    assert parse_version(text) == version


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:h100:8(S:0)", ("h100", 8)),
        ("gpu:8(S:0-1)", (None, 8)),
        ("gpu:a100:2(S:0,1),gpu:a100:2(S:1)", ("a100", 4)),
        ("(null)", (None, 0)),
        ("mps:100,gpu:l40s:4", ("l40s", 4)),
        ("gpu", (None, 1)),
    ],
)
def test_parse_gres(gres, expected):
    assert parse_gres(gres) == expected


def test_parse_states_marks_not_responding():
    assert parse_states("IDLE+DRAIN") == {"IDLE", "DRAIN"}
    assert parse_states("DOWN*+DRAIN") == {"DOWN", "DRAIN", "NOT_RESPONDING"}


def test_kv_line_keeps_spaces_and_equals_inside_values():
    fields = parse_kv_line("NodeName=a OS=Linux 6.1 #1 SMP  CfgTRES=cpu=4,mem=1G AllocTRES= Weight=3")
    assert fields == {
        "NodeName": "a",
        "OS": "Linux 6.1 #1 SMP",
        "CfgTRES": "cpu=4,mem=1G",
        "AllocTRES": "",
        "Weight": "3",
    }


def test_reason_with_user_suffix_and_free_text():
    reason = parse_reason("NodeName=a State=IDLE Reason=bad PSU, ticket=INC-1 [alice@2026-01-11T21:58:40]")
    assert (reason.text, reason.user, reason.time) == (
        "bad PSU, ticket=INC-1",
        "alice",
        "2026-01-11T21:58:40",
    )
    assert parse_reason("NodeName=a State=IDLE Reason=no suffix here").text == "no suffix here"
    assert parse_reason("NodeName=a State=IDLE") is None


def test_nodes_22_05_text_fixture():
    parsed = parse_nodes_text(fixture("scontrol_show_node_o_22.05_edgecases.txt"))
    assert sorted(parsed) == ["cpu-01", "gpu-01", "gpu-02", "gpu-03"]
    n1, _ = parsed["gpu-01"]
    assert n1.states == {"IDLE"} and not n1.drained
    assert n1.available_features == ("h100", "ib", "fy_tier_green") == n1.active_features
    assert n1.admin_features == ("h100", "ib")
    assert (n1.gpu_type, n1.gpu_count, n1.weight, n1.partitions) == ("h100", 8, 10, ("gpu", "debug"))
    n2, d2 = parsed["gpu-02"]
    assert n2.drained_by_us and n2.states == {"MIXED", "DRAIN"}
    assert n2.reason == "fleetyield: fatal XID 79 on gpu 3 (GPU has fallen off the bus)"
    assert (d2.reason_user, d2.reason_time) == ("root", "2026-01-12T10:02:13")
    n3, d3 = parsed["gpu-03"]
    assert n3.drained_by_other and n3.reason == "bad PSU, ticket=INC-4411 see https://wiki/x?a=b"
    assert (
        d3.reason_user == "alice" and n3.available_features == () and (n3.gpu_type, n3.gpu_count) == (None, 8)
    )
    c1, _ = parsed["cpu-01"]
    assert c1.states == {"DOWN", "DRAIN", "NOT_RESPONDING"} and c1.gpu_count == 0


def test_real_22_05_output_from_the_docker_cluster():
    """Captured with ``docker exec slurmctld scontrol show node -o`` (slurm-wlm 22.05.8, Debian bookworm)."""
    parsed = parse_nodes_text(fixture("scontrol_show_node_o_22.05_docker.txt"))
    assert sorted(parsed) == ["gpu-h100-1", "gpu-h100-2", "gpu-l40s-1", "gpu-l40s-2"]
    h100, detail = parsed["gpu-h100-1"]
    assert (h100.gpu_type, h100.gpu_count, h100.weight) == ("h100", 8, 10)
    assert h100.available_features == ("h100", "nvlink") == h100.active_features
    assert (
        h100.states == {"IDLE"}
        and h100.partitions == ("gpu",)
        and h100.reason == ""
        and detail.reason_user is None
    )
    drained, detail = parse_nodes_text(fixture("scontrol_show_node_o_22.05_docker_drained.txt"))["gpu-l40s-2"]
    assert drained.states == {"IDLE", "DRAIN"} and drained.drained_by_us
    assert (
        drained.reason == "fleetyield: fatal XID 79 on gpu 3 (fell off the bus)"
        and detail.reason_user == "root"
    )


def test_real_squeue_json_from_the_docker_cluster():
    runner = Recorder({("squeue", "--json"): ok(fixture("squeue_json_22.05_docker.json"))})
    jobs = SlurmCli(runner=runner, version=(22, 5, 8)).read_jobs()
    assert [(j.job_id, j.state, j.nodes, j.requeue, j.gpus) for j in jobs] == [
        (1, "COMPLETED", ("gpu-l40s-1",), True, 2),
        (2, "COMPLETED", ("gpu-l40s-1",), True, 2),
    ]
    assert [j.qos for j in jobs] == ["normal", "normal"]  # the real document's ``qos`` field
    assert runner.calls == [("squeue", "--json")]  # plain names need no hostlist expansion


def test_real_squeue_json_gres_indices_from_the_docker_cluster():
    """Captured during a live A/B: running jobs carry gres_detail ``gpu:l40s:2(IDX:3-4)``; finished and
    pending ones an empty list (indices unknown)."""
    runner = Recorder({("squeue", "--json"): ok(fixture("squeue_json_22.05_docker_gres.json"))})
    jobs = {j.job_id: j for j in SlurmCli(runner=runner, version=(22, 5, 8)).read_jobs()}
    assert jobs[4].gpu_index == (("gpu-l40s-1", (3, 4)),) and jobs[4].gpus == 2
    assert jobs[6].gpu_index == (("gpu-l40s-2", (0, 1, 2, 3)),)
    assert jobs[2].gpu_index == () and jobs[12].gpu_index == ()
    assert jobs[4].holds_gpu("gpu-l40s-1", frozenset({4}))
    assert not jobs[4].holds_gpu("gpu-l40s-1", frozenset({2}))
    assert jobs[2].holds_gpu("gpu-l40s-1", frozenset({2}))  # unknown: assumed to hold it


@pytest.mark.parametrize(
    ("detail", "want"),
    [
        ("gpu:h100:2(IDX:0-1)", (0, 1)),
        ("gpu:2(IDX:0,3-4)", (0, 3, 4)),
        ("gpu:h100:1(IDX:7),nic:1", (7,)),
        ("gpu:a100:1(IDX:0),gpu:l40s:1(IDX:5)", (0, 5)),
        ("gpu:h100:2", None),  # no IDX (gres.conf without File=): unknown
        ("nic:1", None),
        ("gpu:1(IDX:x)", None),
    ],
)
def test_gpu_indices(detail, want):
    assert gpu_indices(detail) == want


def test_job_gpu_index_pairs_entries_with_nodes_or_gives_up():
    two = ("gpu-01", "gpu-02")
    assert job_gpu_index(two, ("gpu:8(IDX:0-7)", "gpu:4(IDX:0-3)")) == (
        ("gpu-01", tuple(range(8))),
        ("gpu-02", (0, 1, 2, 3)),
    )
    assert job_gpu_index(two, ("gpu:8(IDX:0-7)",)) == ()  # count mismatch: unknown, not misassigned
    assert job_gpu_index(two, ("gpu:8(IDX:0-7)", "gpu:4")) == ()


# ------------------------------------------------------------------------------------------------------
# reads through the seam
# ------------------------------------------------------------------------------------------------------


def test_read_nodes_uses_text_on_22_05():
    runner = Recorder(
        {
            ("scontrol", "--version"): ok("slurm-wlm 22.05.8\n"),
            ("scontrol", "show", "node", "-o"): ok(fixture("scontrol_show_node_o_22.05_edgecases.txt")),
        }
    )
    slurm = SlurmCli(runner=runner)
    nodes = slurm.read_nodes()
    assert len(nodes) == 4
    assert runner.calls == [("scontrol", "--version"), ("scontrol", "show", "node", "-o")]
    assert slurm.node_details["gpu-03"].reason_user == "alice"
    slurm.read_nodes()
    assert runner.calls[-1] == ("scontrol", "show", "node", "-o")  # the version is asked once
    assert len(runner.calls) == 3


def test_read_nodes_uses_json_on_24_11():
    runner = Recorder(
        {
            ("/opt/slurm/bin/scontrol", "--version"): ok("slurm 24.11.1\n"),
            ("/opt/slurm/bin/scontrol", "show", "node", "--json"): ok(
                fixture("scontrol_show_node_json_24.11.json")
            ),
        }
    )
    slurm = SlurmCli(bin_dir="/opt/slurm/bin", runner=runner)
    nodes = slurm.read_nodes()
    assert nodes["gpu-11"].available_features == ("h100", "ib", "fy_tier_yellow")
    assert nodes["gpu-11"].weight == 40 and nodes["gpu-11"].reason == ""
    assert nodes["gpu-12"].drained_by_us and nodes["gpu-12"].partitions == ("gpu", "debug")
    assert slurm.node_details["gpu-12"].reason_user == "root"
    assert slurm.node_details["gpu-11"].reason_user is None


def test_read_nodes_failure_is_typed():
    runner = Recorder(
        {
            ("scontrol", "--version"): ok("slurm 22.05.8"),
            ("scontrol", "show"): CommandResult(
                1, "", "slurm_load_node error: Unable to contact slurm controller"
            ),
        }
    )
    with pytest.raises(SlurmCommandError) as err:
        SlurmCli(runner=runner).read_nodes()
    assert err.value.returncode == 1 and "Unable to contact" in err.value.stderr
    assert err.value.command == ("scontrol", "show", "node", "-o")


def test_read_jobs_json_expands_hostlists_in_one_call():
    def hostnames(argv):
        return ok({"gpu-[01-02]": "gpu-01\ngpu-02\n"}[argv[3]])

    runner = Recorder(
        {
            ("squeue", "--json"): ok(fixture("squeue_json_22.05.json")),
            ("scontrol", "show", "hostnames"): hostnames,
        }
    )
    slurm = SlurmCli(runner=runner, version=(22, 5, 8))
    jobs = {j.job_id: j for j in slurm.read_jobs()}
    assert jobs[101].nodes == ("gpu-01", "gpu-02") and jobs[101].workload is WorkloadClass.PRETRAIN
    assert jobs[101].gpus == 16 and jobs[101].requeue and jobs[101].state == "RUNNING"
    assert jobs[102].nodes == ("gpu-02",) and not jobs[102].requeue and jobs[102].workload is None
    assert jobs[103].nodes == () and jobs[103].workload is WorkloadClass.DECODE
    assert runner.calls == [("squeue", "--json"), ("scontrol", "show", "hostnames", "gpu-[01-02]")]
    slurm.read_jobs()  # expansions are cached: no second hostnames call
    assert runner.calls[-1] == ("squeue", "--json")


def test_batched_expansion_falls_back_when_slurm_reorders():
    def hostnames(argv):
        if "," in argv[3] and "fyhostlistsep" in argv[3]:
            return ok("a1\na2\nb1\nb2\nfyhostlistsep\nfyhostlistsep\n")  # sorted: boundaries lost
        return ok({"a[1-2]": "a1\na2\n", "b[1-2]": "b1\nb2\n"}[argv[3]])

    runner = Recorder({("scontrol", "show", "hostnames"): hostnames})
    expanded = SlurmCli(runner=runner, version=(22, 5, 8)).expand_hostlists(["a[1-2]", "b[1-2]", "c9", ""])
    assert expanded == {"a[1-2]": ("a1", "a2"), "b[1-2]": ("b1", "b2"), "c9": ("c9",)}
    assert len(runner.calls) == 3


def test_batched_expansion_in_one_call_when_order_is_kept():
    runner = Recorder({("scontrol", "show", "hostnames"): ok("a1\na2\nfyhostlistsep\nb1\nfyhostlistsep\n")})
    expanded = SlurmCli(runner=runner, version=(22, 5, 8)).expand_hostlists(["b[1]", "a[1-2]"])
    assert expanded == {"a[1-2]": ("a1", "a2"), "b[1]": ("b1",)}
    assert runner.calls == [("scontrol", "show", "hostnames", "a[1-2],fyhostlistsep,b[1],fyhostlistsep")]


def test_read_jobs_falls_back_to_squeue_format_and_scontrol_requeue():
    runner = Recorder(
        {
            ("squeue", "--json"): CommandResult(1, "", "squeue: unrecognized option '--json'"),
            ("squeue", "-h", "-o"): ok(
                "7|RUNNING|n1|gres/gpu:h100:4|fy_preemptible|fy:batch|x\n8|PENDING||N/A|(null)|(null)\n"
            ),
            ("scontrol", "show", "job", "-o"): ok(
                "JobId=7 JobName=a UserId=u(1) Requeue=0 Restarts=0 JobState=RUNNING Comment=fy:batch|x\n"
                "JobId=8 JobName=b UserId=u(1) Requeue=1 Restarts=2 JobState=PENDING\n"
            ),
        }
    )
    jobs = {j.job_id: j for j in SlurmCli(runner=runner, version=(22, 5, 8)).read_jobs()}
    assert jobs[7].nodes == ("n1",) and not jobs[7].requeue and jobs[7].gpus == 4
    assert jobs[7].workload is WorkloadClass.BATCH
    assert jobs[8].requeue and jobs[8].nodes == () and jobs[8].gpus == 0
    assert jobs[7].qos == "fy_preemptible" and jobs[8].qos == ""
    assert jobs[7].restarts == 0 and jobs[8].restarts == 2  # scontrol's Restarts=
    assert ("squeue", "-h", "-o", "%A|%T|%N|%b|%q|%k") in runner.calls


def test_squeue_json_restart_count():
    """``restart_cnt`` (every squeue --json since 21.08): a requeued pending gang keeps its hot spares."""
    doc = json.loads(fixture("squeue_json_22.05_docker.json"))
    assert [j["restart_cnt"] for j in doc["jobs"]] == [0, 0]  # the real document carries the field
    doc["jobs"][1]["restart_cnt"] = 3
    runner = Recorder({("squeue", "--json"): ok(json.dumps(doc))})
    jobs = SlurmCli(runner=runner, version=(22, 5, 8)).read_jobs()
    assert [j.restarts for j in jobs] == [0, 3]
    assert parse_show_jobs("JobId=5 Restarts=1 Requeue=0\nJobId=6 JobName=x\nnot a job\n") == {
        5: (False, 1),
        6: (True, 0),
    }


# ------------------------------------------------------------------------------------------------------
# apply: the exact command lines
# ------------------------------------------------------------------------------------------------------


def test_apply_builds_one_update_per_group_and_drain_then_requeue():
    runner = Recorder({("scontrol", "show", "hostlist"): ok("gpu-[01-03]\n")})
    slurm = SlurmCli(runner=runner, version=(22, 5, 8))
    plan = Plan(
        actions=(
            UpdateNodes(("gpu-01", "gpu-02", "gpu-03"), ("h100", "fy_tier_green"), 10),
            UpdateNodes(("gpu-04",), (), 1),
            DrainNode("gpu-05", "fleetyield: fatal XID 79 on gpu 3", requeue_jobs=(11, 12)),
            DrainNode("gpu-06", "fleetyield: retire"),
            RequeueJobs("gpu-08", (21, 22), 30, "premium reclaim: pending pretrain job 30 ..."),
            ResumeNode("gpu-07", "rehabilitated"),
        )
    )
    report = slurm.apply(plan)
    assert runner.calls == [
        ("scontrol", "show", "hostlist", "gpu-01,gpu-02,gpu-03"),
        (
            "scontrol",
            "update",
            "NodeName=gpu-[01-03]",
            "AvailableFeatures=h100,fy_tier_green",
            "ActiveFeatures=h100,fy_tier_green",
            "Weight=10",
        ),
        ("scontrol", "update", "NodeName=gpu-04", "AvailableFeatures=", "ActiveFeatures=", "Weight=1"),
        ("scontrol", "update", "NodeName=gpu-05", "State=DRAIN", "Reason=fleetyield: fatal XID 79 on gpu 3"),
        ("scontrol", "requeue", "11,12"),
        ("scontrol", "update", "NodeName=gpu-06", "State=DRAIN", "Reason=fleetyield: retire"),
        ("scontrol", "requeue", "21,22"),
        ("scontrol", "update", "NodeName=gpu-07", "State=RESUME"),
    ]
    assert report.calls == 8 and not report.failed and len(report.results) == 6


def test_consecutive_drains_with_one_reason_are_one_drain_and_one_requeue():
    """A mass failure: drains of the same reason go out as one hostlist command, then one requeue."""
    xid = "fleetyield: XID 79 gpu 3 fell off the bus"
    runner = Recorder({("scontrol", "show", "hostlist", "gpu-01,gpu-02,gpu-03"): ok("gpu-[01-03]\n")})
    slurm = SlurmCli(runner=runner, version=(22, 5, 8))
    plan = Plan(
        actions=(
            DrainNode("gpu-01", xid, requeue_jobs=(11,)),
            DrainNode("gpu-02", xid),
            DrainNode("gpu-03", xid, requeue_jobs=(12, 11)),
            DrainNode("gpu-04", "fleetyield: retire"),  # another reason: its own command
            ResumeNode("gpu-05", "rehabilitated"),
        )
    )
    report = slurm.apply(plan)
    assert runner.calls == [
        ("scontrol", "show", "hostlist", "gpu-01,gpu-02,gpu-03"),
        ("scontrol", "update", "NodeName=gpu-[01-03]", "State=DRAIN", f"Reason={xid}"),
        ("scontrol", "requeue", "11,12"),
        ("scontrol", "update", "NodeName=gpu-04", "State=DRAIN", "Reason=fleetyield: retire"),
        ("scontrol", "update", "NodeName=gpu-05", "State=RESUME"),
    ]
    assert [r.action for r in report.results] == list(plan.actions)  # one result per action, in plan order
    assert not report.failed and report.calls == 5


def test_a_failed_batched_drain_is_retried_node_by_node_with_results_of_its_own():
    xid = "fleetyield: XID 79 gpu 3 fell off the bus"
    bad = CommandResult(1, "", "slurm_update error: Invalid node name specified")
    runner = Recorder(
        {
            ("scontrol", "update", "NodeName=gpu-[01-02]"): bad,
            ("scontrol", "update", "NodeName=gpu-02"): bad,
            ("scontrol", "show", "hostlist"): ok("gpu-[01-02]\n"),
        }
    )
    report = SlurmCli(runner=runner, version=(22, 5, 8)).apply(
        Plan(actions=(DrainNode("gpu-01", xid, (7,)), DrainNode("gpu-02", xid, (8,))))
    )
    assert [r.ok for r in report.results] == [True, False]
    assert runner.calls[2:] == [
        ("scontrol", "update", "NodeName=gpu-01", "State=DRAIN", f"Reason={xid}"),
        ("scontrol", "requeue", "7"),
        ("scontrol", "update", "NodeName=gpu-02", "State=DRAIN", f"Reason={xid}"),
    ]
    # the drain of gpu-02 failed, so its job was not requeued (it would land on the node again)
    assert ("scontrol", "requeue", "8") not in runner.calls


def test_a_failed_batched_requeue_fails_only_the_drains_that_had_jobs():
    xid = "fleetyield: XID 79 gpu 3 fell off the bus"
    runner = Recorder({("scontrol", "requeue"): CommandResult(1, "", "Invalid job id specified")})
    report = SlurmCli(runner=runner, version=(22, 5, 8)).apply(
        Plan(actions=(DrainNode("a", xid, (7,)), DrainNode("b", xid)))
    )
    assert [r.ok for r in report.results] == [False, True]
    assert report.results[0].command == ("scontrol", "requeue", "7")


def test_a_checkpoint_signal_goes_to_every_step_of_the_jobs_not_the_batch_shell():
    """SignalJobs -> ``scancel --signal=SIG <jobs>`` without --batch/--full: the training steps get it."""
    runner = Recorder({})
    slurm = SlurmCli(runner=runner, version=(22, 5, 8))
    report = slurm.apply(
        Plan(
            actions=(
                SignalJobs("gpu-01", (41, 42), "USR1", "approved drain p-1"),
                SignalJobs("gpu-01", (43,), "USR2", "drain proposal p-2", "batch"),  # the script traps it
            )
        )
    )
    assert runner.calls == [
        ("scancel", "--signal=USR1", "41", "42"),
        ("scancel", "--batch", "--signal=USR2", "43"),
    ]
    assert not report.failed


def test_apply_records_a_failure_and_continues():
    runner = Recorder(
        {
            ("scontrol", "update", "NodeName=bad"): CommandResult(
                1, "", "slurm_update error: Invalid node name"
            ),
        }
    )
    slurm = SlurmCli(runner=runner, version=(22, 5, 8))
    report = slurm.apply(Plan(actions=(ResumeNode("bad", "x"), ResumeNode("good", "y"))))
    assert [r.ok for r in report.results] == [False, True]
    assert "Invalid node name" in report.failed[0].detail
    assert report.failed[0].command == ("scontrol", "update", "NodeName=bad", "State=RESUME")


def test_dry_run_reads_but_never_writes():
    runner = Recorder(
        {
            ("scontrol", "--version"): ok("slurm 22.05.8"),
            ("scontrol", "show", "node", "-o"): ok(fixture("scontrol_show_node_o_22.05_edgecases.txt")),
        }
    )
    dry = DryRunSlurm(SlurmCli(runner=runner))
    assert len(dry.read_nodes()) == 4
    before = list(runner.calls)
    report = dry.apply(Plan(actions=(DrainNode("gpu-01", "fleetyield: x", (5,)), ResumeNode("gpu-02", "y"))))
    assert runner.calls == before and report.calls == 0
    assert report.results[0].command == ("scontrol", "requeue", "5")


def test_run_command_timeout_and_missing_binary(tmp_path):
    with pytest.raises(SlurmCommandError) as err:
        run_command([str(tmp_path / "no-such-scontrol")], 1.0)
    assert err.value.returncode == 127
    with pytest.raises(SlurmCommandError) as err:
        run_command(["sleep", "5"], 0.05)
    assert err.value.returncode is None and "timed out" in err.value.stderr
    assert run_command(["echo", "hi"], 5.0).stdout == "hi\n"


# --------------------------------------------------------------------------------------------------------
# Rehabilitation actions and accounting
# --------------------------------------------------------------------------------------------------------


def test_rehab_commands():
    from slurm_fleetyield.adapters.slurm import CanarySpec
    from slurm_fleetyield.core.plan import CancelCanaries, PowerCycle, RebootNode, SubmitCanary

    cli = SlurmCli(version=(22, 5, 8), canary=CanarySpec(command="fleetyield-agent check --json"))
    reason = "fleetyield: xid 79 on gpu 3; remediation 1/2 (reboot)"
    assert cli.commands_for(RebootNode("gpu-01", reason)) == [
        ("scontrol", "reboot", f"Reason={reason}", "gpu-01")
    ]
    sbatch = cli.commands_for(SubmitCanary("gpu-01", 2, "abc123", 301.0))
    assert len(sbatch) == 2 and sbatch[0] == (
        "sbatch",
        "--parsable",
        "-w",
        "gpu-01",
        "--constraint=fy_canary",
        "--exclusive",
        "--no-requeue",
        "--time=6",
        "--job-name=fy_canary_abc123",
        "--comment=fy:canary",
        "--output=/dev/null",
        "--wrap",
        "fleetyield-agent check --json",
    )
    assert cli.commands_for(CancelCanaries("gpu-01", "abc123")) == [("scancel", "--name=fy_canary_abc123")]
    with pytest.raises(TypeError, match="unknown action"):  # not Slurm's: the executor sends it to the BMC
        cli.commands_for(PowerCycle("gpu-01", reason))


def test_apply_runs_canary_count_times_and_leaves_power_cycle_to_the_bmc_executor():
    from slurm_fleetyield.core.plan import PowerCycle, SubmitCanary

    rec = Recorder({("sbatch",): CommandResult(0, "77\n", "")})
    cli = SlurmCli(runner=rec, version=(22, 5, 8))
    report = cli.apply(Plan((SubmitCanary("gpu-01", 3, "t1", 600.0), PowerCycle("gpu-02", "x"))))
    assert [c[0] for c in rec.calls] == ["sbatch"] * 3 and report.calls == 3
    # PowerCycle is not Slurm's: no command, no result (the executor sends it to the Redfish adapter).
    assert [r.ok for r in report.results] == [True] and report.results[0].action.kind == "submit_canary"


def test_sacct_canaries_and_squeue_fallback():
    from slurm_fleetyield.adapters.slurm import parse_sacct_canaries

    text = (
        "501|fy_canary_t1|COMPLETED|0:0|2026-01-12T10:00:00|gpu-01\n"
        "502|fy_canary_t1|FAILED|1:0|2026-01-12T10:00:05|gpu-01\n"
        "503|fy_canary_t1|CANCELLED by 0|0:15|2026-01-12T10:00:06|None assigned\n"
        "504|fy_canary_old|COMPLETED|0:0|2026-01-12T09:00:00|gpu-01\n"
        "505|fy_canary_t1|RUNNING|0:0|Unknown|gpu-01\n"
    )
    got = parse_sacct_canaries(text, {"t1": "gpu-01"})
    assert [(r.job_id, r.state, r.exit_code) for r in got] == [
        (501, "COMPLETED", 0),
        (502, "FAILED", 1),
        (503, "CANCELLED", 143),
        (505, "RUNNING", 0),
    ]
    assert got[2].node == "gpu-01" and got[0].end_time is not None and got[3].end_time is None
    rec = Recorder(
        {
            ("sacct",): CommandResult(1, "", "sacct: error: Problem talking to the database"),
            ("squeue",): CommandResult(0, "601|fy_canary_t2|PENDING|\n", ""),
        }
    )
    cli = SlurmCli(runner=rec, version=(22, 5, 8))
    got = cli.read_canaries({"t2": "gpu-02"}, 0.0)
    assert [(r.job_id, r.node, r.state) for r in got] == [(601, "gpu-02", "PENDING")]
    assert rec.calls[0][:5] == ("sacct", "-X", "-n", "-P", "-a") and "--name=fy_canary_t2" in rec.calls[0]


def test_sacct_job_attempts():
    from slurm_fleetyield.adapters.slurm import parse_sacct_jobs

    text = (
        "88|REQUEUED|0:0|2026-01-12T08:00:00|2026-01-12T09:00:00|gpu-[01-02]\n"
        "88|NODE_FAIL|0:0|2026-01-12T09:05:00|2026-01-12T09:30:00|gpu-[01-02]\n"
        "89|TIMEOUT|0:1|2026-01-12T08:00:00|2026-01-12T10:00:00|gpu-03\n"
    )
    got = parse_sacct_jobs(text)
    assert [a.state for a in got[88]] == ["REQUEUED", "NODE_FAIL"] and got[88][0].nodelist == "gpu-[01-02]"
    assert got[89][0].exit_code == 129
