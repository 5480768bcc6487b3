"""Gang A/B on the docker cluster: one 3-node training job and one fatal GPU fault, bare Slurm vs FleetYield.

Per seed and arm (``run_gang_arm``): the arm's configuration (``ab.Cluster.prepare``: reset, then bare =
controller stopped, kill switch, slurm.conf's features and weights; fleetyield = fresh controller, every node
green), ``contrib/chaos/nhc-gang.sh`` started in slurmctld in BOTH arms (the simulator's NHC runs under every
policy: a periodic health check drains a node whose GPU is dead; a gang that FAILED with exit 86 is
requeued at once, as a site's resubmit wrapper would: Slurm does not requeue a job after a non-zero exit),
then the gang: ``sbatch -N3 --exclusive --gres=gpu:8 --requeue --comment=fy:pretrain`` running
``fy-train-job.sh`` with ``FY_GANG=1`` (checkpoints, the checkpoint-signal handler, a collective timeout).
``GangPlan.fault_after_s`` into its training the driver writes the fault record of the planned node of its
allocation (``<run>/faults/<node>``: the job hangs on it, NHC's check sees it) and injects the XID into that
node's agent (fake backend: the agent writes its fatal marker and pushes the event, which only a running
controller receives). Then it polls, every second, the job (releasing a held one, as an operator would)
and the faulted node's state (when it is first seen drained), until the job leaves the queue or the
deadline. The ledger (``chaos.gang.recoveries``) reads Slurm's attempts from ``sacct -D`` and the job's step
and event logs.

Measured (real): Slurm's requeues, placements and start/end times, the controller's and the agents' real
push, drain and requeue in the FleetYield arm, the NHC emulation's drains and requeues in the bare arm.
Simulated: the GPU fault (an XID raised in the agent's fake backend, and the record the job reads), the hang
(the job stops making progress and exits 86 after its collective timeout) and the work (1 s sleeps).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_fleetyield.chaos import ab as ab_mod
from slurm_fleetyield.chaos import gang
from slurm_fleetyield.chaos import log as log_mod
from slurm_fleetyield.chaos.ab import CONTRIB, CONTROLLER, ChaosError, Cluster, d
from slurm_fleetyield.chaos.ledger import SACCT_FIELDS, _hosts
from slurm_fleetyield.chaos.log import ChaosLog
from slurm_fleetyield.chaos.runner import AGENT_STATE_DIR, CTL, JOB_SCRIPT, SHARED, Exec, progress_dir

ARMS = ab_mod.ARMS
NODES = ("gpu-h100-1", "gpu-h100-2", "gpu-l40s-1", "gpu-l40s-2")
NHC_SCRIPT = f"{SHARED}/nhc-gang.sh"
POLL_S = 1.0


def fault_dir(tag: str) -> str:
    return f"{SHARED}/runs/{tag}/faults"


def nhc_log(tag: str) -> str:
    return f"{SHARED}/runs/{tag}/nhc.log"


def submit_command(tag: str, gp: gang.GangParams) -> tuple[str, ...]:
    env = (
        f"--export=ALL,FY_GANG=1,FY_WORK_S={int(gp.work_s)},FY_CKPT_S={int(gp.ckpt_s)},"
        f"FY_COLLECTIVE_TIMEOUT_S={int(gp.collective_timeout_s)},FY_PROGRESS_DIR={progress_dir(tag)},"
        f"FY_FAULT_DIR={fault_dir(tag)}"
    )
    return d(CTL, "sbatch", "--parsable", f"--job-name=fy-gang-{tag}", f"--comment=fy:{gp.workload}",
             "--requeue", f"-N{gp.nodes}", "--exclusive", f"--gres=gpu:{gp.gpus_per_node}",
             f"--output={SHARED}/out/%j.out", env, JOB_SCRIPT)  # fmt: skip


def setup_commands(tag: str, gp: gang.GangParams, p: gang.GangPlan) -> list[tuple[str, ...]]:
    """After ``prepare``: the fault directory, the NHC emulation (both arms; stopped by ``reset``)."""
    return [
        d(CTL, "sh", "-c", f"mkdir -p {fault_dir(tag)}"),
        ("docker", "cp", str(CONTRIB / "nhc-gang.sh"), f"{CTL}:{NHC_SCRIPT}"),
        d(
            "-d",
            CTL,
            "bash",
            NHC_SCRIPT,
            fault_dir(tag),
            f"{gp.health_check_interval_s:g}",
            f"{p.nhc_phase_s:g}",
            nhc_log(tag),
        ),
    ]


def fault_commands(tag: str, node: str, p: gang.GangPlan) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The fault record (stamped by slurmctld's clock as it lands, printed: the fault's time) and the XID."""
    f = f"{fault_dir(tag)}/{node}"
    record = d(CTL, "bash", "-c", f't=$EPOCHREALTIME; echo "$t {p.gpu} {p.xid}" > {f}.tmp && mv {f}.tmp {f} '
               '&& echo "$t"')  # fmt: skip
    inject = d(node, "fleetyield-agent", "fault", "inject", "--state-dir", AGENT_STATE_DIR, "--gpu",
               str(p.gpu), "--xid", str(p.xid))  # fmt: skip
    return record, inject


FINAL = ("COMPLETED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL")
FAILED_GRACE_S = 15.0  # a FAILED gang not requeued (nhc-gang.sh polls every 2 s) in this long stays failed


def _job_state(cluster: Cluster, job: str) -> tuple[str, str, str] | None:
    """(state, nodes, reason) of the job in slurmctld (``scontrol show job``: a FAILED job waiting for its
    requeue is still there, squeue would not show it); ("GONE", "", "") once slurmctld forgot it; None when
    scontrol failed."""
    rc, out = cluster.exec_(d(CTL, "scontrol", "show", "job", job, "-o"))
    if rc != 0:
        return ("GONE", "", "") if "Invalid job id" in out else None
    f: dict[str, str] = {}
    for tok in out.split():
        k, sep, v = tok.partition("=")
        if sep and k not in f:
            f[k] = v
    return f.get("JobState", ""), f.get("NodeList", ""), f.get("Reason", "")


def run_gang_arm(
    p: gang.GangPlan,
    gp: gang.GangParams,
    arm: str,
    exec_: Exec,
    out_dir: Path,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    deadline_s: float | None = None,
) -> dict[str, Any]:
    """One arm of one seed; ``deadline_s`` (default 3 x work + collective timeout + 120 s) bounds the run
    from the submit: past it the job is cancelled and the ledger counts it as it stands."""
    tag = f"gang-{arm}-s{p.seed}"
    limit = deadline_s if deadline_s is not None else 3 * gp.work_s + gp.collective_timeout_s + 120.0
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"chaos-{tag}.jsonl", "w") as fh:
        log = ChaosLog(fh)
        log.write({"type": "header", "kind": "gang", "arm": arm, "seed": p.seed, "plan": _asdict(p),
                   "params": gp.to_dict(), "started": clock()})  # fmt: skip
        cluster = Cluster(exec_, NODES, log, clock, sleep)
        cluster.prepare(arm, tag, nhc=False)
        for argv in setup_commands(tag, gp, p):
            rc, out = cluster.run(argv)
            if rc != 0:
                raise ChaosError(f"{' '.join(argv)} failed (rc {rc}): {out[-300:]}")
        rc, out = cluster.run(submit_command(tag, gp), "submit")
        job = out.strip().splitlines()[-1].split(";")[0] if rc == 0 and out.strip() else ""
        if not job.isdigit():
            raise ChaosError(f"sbatch of the gang failed (rc {rc}): {out[-300:]}")
        submitted = clock()
        deadline = submitted + limit
        started, nodes = _wait_running(cluster, job, min(deadline, submitted + 180.0))
        log.write({"type": "running", "t": started, "job": job, "nodes": list(nodes)})
        node = sorted(nodes)[p.node_index % len(nodes)]
        wait = started + p.fault_after_s - clock()
        if wait > 0:
            sleep(wait)
        record, inject = fault_commands(tag, node, p)
        rc, out = cluster.run(record, "fault_record")
        try:
            fault_t = float(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise ChaosError(f"the fault record on {node} was not written (rc {rc}): {out[-300:]}") from None
        rc, out = cluster.run(inject, "fault_inject")
        if rc != 0:
            raise ChaosError(f"fault inject on {node} failed (rc {rc}): {out[-300:]}")
        drained = _follow(cluster, job, node, deadline)
        last = _job_state(cluster, job)
        unfinished = last is None or last[0] not in (*FINAL, "GONE", "FAILED")
        if unfinished:
            cluster.run(d(CTL, "scancel", job), "deadline")
        sacct = ab_mod._final_sacct(cluster, {job})
        logs = {}
        for ext in ("steps", "events", "ckpts"):
            _, logs[ext] = exec_(d(CTL, "sh", "-c", f"cat {progress_dir(tag)}/{job}.{ext} 2>/dev/null"))
        _, nhc = exec_(d(CTL, "sh", "-c", f"cat {nhc_log(tag)} 2>/dev/null"))
        if arm == "fleetyield":
            rc, text = exec_(d(CONTROLLER, "fleetyield", "events", "--limit", "200", "--json"))
            (out_dir / f"controller-events-{tag}.json").write_text(text + "\n")
        raw = {
            "type": "result", "arm": arm, "seed": p.seed, "job": job, "nodes": list(nodes),
            "fault_node": node, "fault_t": fault_t, "drained": drained, "unfinished": unfinished,
            "sacct": sacct, "nhc_log": nhc, "logs": logs, "elapsed_s": round(clock() - submitted, 1),
        }  # fmt: skip
        result = raw | settle(raw)
        log.write(result)
    return result


def settle(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ledger of one arm from what its log's ``result`` record holds (sacct text, the job's logs, the
    fault, when its node was seen drained): the same code for a run and for ``resettle``."""
    sacct, job, logs = raw["sacct"], raw["job"], raw["logs"]
    recs = gang.recoveries(
        sacct, job, logs["steps"], logs["events"], [(raw["fault_node"], raw["fault_t"])], raw["drained"]
    )
    return {
        "recoveries": [r.to_dict() for r in recs],
        "wall_s": gang.wall_s(sacct, job),
        "attempts": len(gang.attempts(sacct, job)),
    }


def _arm_summary(result: Mapping[str, Any]) -> dict[str, Any]:
    """What ab-gang.json keeps of an arm (the sacct text and the job's logs stay in the JSONL log)."""
    return {k: v for k, v in result.items() if k not in ("sacct", "logs", "type")}


def resettle(out_dir: Path) -> dict[str, Any]:
    """Rebuild ``out_dir/ab-gang.json``'s per-arm results from the JSONL logs beside it (after a change to
    the ledger: no cluster needed; the run's provenance is kept)."""
    summary = json.loads((out_dir / "ab-gang.json").read_text())
    for s in summary["seeds"]:
        for arm in ARMS:
            path = out_dir / f"chaos-gang-{arm}-s{s}.jsonl"
            raw = next(r for r in log_mod.records(path) if r.get("type") == "result")
            if "drained" not in raw:  # logs written before the result kept it: the drained records have it
                raw["drained"] = {}
                for r in log_mod.records(path):
                    if r.get("type") == "drained":
                        raw["drained"].setdefault(r["node"], r["t"])
            summary["arms"][arm][str(s)] = _arm_summary(raw | settle(raw))
    git = subprocess.run(["git", "-C", str(ab_mod.REPO), "describe", "--always", "--dirty"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    summary["resettled_at"] = git.stdout.strip() or "?"
    (out_dir / "ab-gang.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n")
    return summary


def _asdict(p: gang.GangPlan) -> dict[str, Any]:
    return {k: getattr(p, k) for k in p.__dataclass_fields__}


def _wait_running(cluster: Cluster, job: str, deadline: float) -> tuple[float, tuple[str, ...]]:
    while True:
        st = _job_state(cluster, job)
        if st is not None and st[0] == "RUNNING":
            return cluster.clock(), _hosts(st[1])
        if st is not None and (st[0] in FINAL or st[0] in ("GONE", "FAILED")):
            raise ChaosError(f"gang job {job} ended before it ran ({st[0]}, {st[2]})")
        if cluster.clock() >= deadline:
            raise ChaosError(f"gang job {job} did not start in time (last: {st})")
        cluster.sleep(POLL_S)


def _follow(cluster: Cluster, job: str, node: str, deadline: float) -> dict[str, float]:
    """Poll the job and the faulted node until the job leaves the queue (or the deadline); returns when the
    node was first seen drained. A held job is released (a Prolog refusal requeues a job held)."""
    drained: dict[str, float] = {}
    released = False
    failed_since: float | None = None
    while True:
        if node not in drained:
            rc, out = cluster.exec_(d(CTL, "scontrol", "show", "node", node, "-o"))
            state = ab_mod.node_info(out).get(node, {}).get("State", "") if rc == 0 else ""
            if "DRAIN" in state or "DOWN" in state or "REBOOT" in state:
                drained[node] = cluster.clock()
                if cluster.log is not None:
                    cluster.log.write({"type": "drained", "t": drained[node], "node": node, "state": state})
        st = _job_state(cluster, job)
        if st is not None and (st[0] in FINAL or st[0] == "GONE"):
            return drained
        if st is not None and st[0] == "FAILED":
            failed_since = cluster.clock() if failed_since is None else failed_since
            if cluster.clock() - failed_since >= FAILED_GRACE_S:
                return drained
        elif st is not None:
            failed_since = None
        if st is not None and "held" in st[2].lower() and not released:
            cluster.run(d(CTL, "scontrol", "release", job), "operator_release")
            released = True
        if cluster.clock() >= deadline:
            return drained
        cluster.sleep(POLL_S)


def ab_gang(
    seeds: Sequence[int],
    exec_: Exec,
    out_dir: Path,
    gp: gang.GangParams | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    command: str = "",
) -> dict[str, Any]:
    """Both arms over ``seeds``; writes ``out_dir/ab-gang.json`` (no sacct text or logs: those are in the
    per-arm JSONL logs beside it) and leaves the cluster as ``make up`` does."""
    gp = gp or gang.GangParams()
    out_dir.mkdir(parents=True, exist_ok=True)
    vers = ab_mod.versions(exec_)
    results: dict[str, dict[str, Any]] = {a: {} for a in ARMS}
    started = clock()
    try:
        for s in seeds:
            p = gang.plan(s, gp)
            for arm in ARMS:
                res = run_gang_arm(p, gp, arm, exec_, out_dir, clock, sleep)
                results[arm][str(s)] = _arm_summary(res)
    finally:
        Cluster(exec_, NODES, None, clock, sleep).restore()
    summary = {
        "kind": "gang",
        "seeds": list(seeds),
        "params": gp.to_dict(),
        "plans": {str(s): _asdict(gang.plan(s, gp)) for s in seeds},
        "arms": results,
        "versions": vers,
        "command": command,
        "started": started,
        "elapsed_s": round(clock() - started, 1),
        "sacct_fields": SACCT_FIELDS,
    }
    (out_dir / "ab-gang.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n")
    return summary


def describe(summary: Mapping[str, Any]) -> str:
    """One line per seed and arm (what ``fleetyield chaos ab-gang`` prints)."""
    lines = []
    for s in summary["seeds"]:
        for arm in ARMS:
            r = summary["arms"][arm][str(s)]
            rec = (r.get("recoveries") or [{}])[0]
            lines.append(
                f"seed {s} {arm:<10} fault on {r.get('fault_node')}: recovery {rec.get('recovery_s')} s, "
                f"lost {rec.get('lost_s')} s of work, stalled {rec.get('stalled_s')} s, "
                f"wall {r.get('wall_s')} s"
            )
    return "\n".join(lines) + "\n"
