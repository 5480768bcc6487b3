"""A/B: the same chaos timeline on the same cluster, bare Slurm vs Slurm + FleetYield, over seeds.

Per seed and arm: prepare the arm, run the timeline (``ChaosRunner``), wait for every job to finish (or
``drain_timeout_s``), read ``sacct`` and the epilog outcome records, settle them with ``chaos.ledger`` (the
core's ``settle_job``), clear the injected faults and reset the cluster for the next arm.

Arms:
- ``bare``: ``fy-service controller stop`` in the ``fleetyield`` container;
  ``touch /etc/slurm/fleetyield.disabled`` in slurmctld (job_submit adds no fy_ constraint); every node
  resumed, fy_ features removed, weights back to slurm.conf's; ``contrib/chaos/nhc-drain.sh`` started in
  slurmctld: it drains a node after a job on it failed with a GPU fault (exit 86), as a site's NHC would.
- ``fleetyield``: kill switch removed, controller started; it labels nodes, drains on the agents' pushes.

Measured: real Slurm placements, requeues, states and times. Simulated: the GPU faults (the agents' fake
backend) and the work (the job script sleeps). Everything executed is in the per-arm JSONL logs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_fleetyield.chaos import ledger
from slurm_fleetyield.chaos.log import ChaosLog
from slurm_fleetyield.chaos.runner import CTL, SHARED, ChaosRunner, Exec
from slurm_fleetyield.chaos.timeline import Timeline, TimelineParams, generate

ARMS = ("bare", "fleetyield")
NHC_PID = f"{SHARED}/nhc.pid"
PREMIUM_NODES = frozenset({"gpu-h100-1", "gpu-h100-2"})
CONTRIB = Path(__file__).resolve().parents[2] / "contrib" / "chaos"


def d(*argv: str) -> tuple[str, ...]:
    return ("docker", "exec", *argv)


def setup_commands(arm: str, nodes: Sequence[str]) -> list[tuple[str, ...]]:
    """Commands that put the cluster into ``arm``'s configuration (idempotent)."""
    common = [
        d(CTL, "mkdir", "-p", f"{SHARED}/out", f"{SHARED}/progress"),
        ("docker", "cp", str(CONTRIB / "fy-train-job.sh"), f"{CTL}:{SHARED}/fy-train-job.sh"),
        ("docker", "cp", str(CONTRIB / "nhc-drain.sh"), f"{CTL}:{SHARED}/nhc-drain.sh"),
        # a previous arm's NHC emulation, by the pid it recorded (never by name)
        d(CTL, "sh", "-c", f"[ -f {NHC_PID} ] && kill $(cat {NHC_PID}); rm -f {NHC_PID}"),
    ]
    for n in nodes:
        common.append(d(n, "fleetyield-agent", "fault", "clear", "--all"))
    if arm == "bare":
        out = [
            *common,
            d("fleetyield", "fy-service", "controller", "stop"),
            d(CTL, "touch", "/etc/slurm/fleetyield.disabled"),
            d(
                CTL,
                "scontrol",
                "update",
                f"NodeName={','.join(nodes)}",
                "AvailableFeatures=",
                "ActiveFeatures=",
            ),
            d(CTL, "scontrol", "reconfigure"),  # features and weights back to slurm.conf's
        ]
        out += [d(CTL, "scontrol", "update", f"NodeName={n}", "State=RESUME") for n in nodes]
        out.append(d("-d", CTL, "bash", f"{SHARED}/nhc-drain.sh", "5"))
        return out
    if arm == "fleetyield":
        out = [*common, d(CTL, "rm", "-f", "/etc/slurm/fleetyield.disabled")]
        out += [d(CTL, "scontrol", "update", f"NodeName={n}", "State=RESUME") for n in nodes]
        out.append(d("fleetyield", "fy-service", "controller", "start"))
        return out
    raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")


def run_arm(
    timeline: Timeline,
    arm: str,
    exec_: Exec,
    out_dir: Path,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    drain_timeout_s: float = 1800.0,
    version: str = "",
) -> dict[str, Any]:
    tag = f"{arm}-s{timeline.seed}"
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"chaos-{tag}.jsonl", "w") as fh:
        log = ChaosLog(fh)
        log.header(timeline, arm, version, clock())
        for argv in setup_commands(arm, timeline.params.nodes):
            rc, out = exec_(argv)
            log.write({"type": "setup", "t": clock(), "command": list(argv), "rc": rc, "out": out[-300:]})
        if arm == "fleetyield":
            sleep(10.0)  # the controller labels nodes before the first submit (its first tick)
        runner = ChaosRunner(timeline, exec_, clock, sleep, log, tag)
        runner.run()
        deadline = clock() + drain_timeout_s
        ids = ",".join(str(j) for j in runner.job_ids.values())
        while ids and clock() < deadline:
            rc, out = exec_(d(CTL, "squeue", "-h", "-j", ids, "-o", "%i"))
            if rc == 0 and not out.strip():
                break
            sleep(15.0)
        if ids:
            exec_(d(CTL, "scancel", *ids.split(",")))  # leftovers past the deadline: counted as they stand
        rc, sacct = exec_(d(CTL, "sacct", "-X", "-D", "-P", "-j", ids or "0", "-o", ledger.SACCT_FIELDS))
        records = _outcome_records(exec_, timeline.params.nodes)
        _entries, totals = ledger.ledger(sacct if rc == 0 else "", records, runner.faults, PREMIUM_NODES)
        result = {"type": "result", "arm": arm, "seed": timeline.seed, "totals": dict(totals),
                  "sacct": sacct, "job_ids": runner.job_ids, "faults": runner.faults}  # fmt: skip
        log.write(result)
    return result


def _outcome_records(exec_: Exec, nodes: Sequence[str]) -> list[Mapping[str, object]]:
    out: list[Mapping[str, object]] = []
    for n in nodes:
        rc, text = exec_(d(n, "sh", "-c", "cat /var/spool/fleetyield/outcomes/*.json 2>/dev/null"))
        for line in text.splitlines() if rc == 0 else ():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def ab(
    seeds: Sequence[int],
    exec_: Exec,
    out_dir: Path,
    tp: TimelineParams | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    drain_timeout_s: float = 1800.0,
) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {a: {} for a in ARMS}
    for s in seeds:
        tl = generate(s, tp)
        for arm in ARMS:
            results[arm][str(s)] = run_arm(tl, arm, exec_, out_dir, clock, sleep, drain_timeout_s)["totals"]
    summary = {"seeds": list(seeds), "arms": results, "table": table(results, seeds)}
    (out_dir / "ab.json").write_text(json.dumps(summary, sort_keys=True, indent=1) + "\n")
    return summary


KEYS = ("net_goodput_gpu_s", "failures", "hardware_failures", "wasted_gpu_s", "premium_misuse_gpu_s")


def table(results: Mapping[str, Mapping[str, Mapping[str, float]]], seeds: Sequence[int]) -> str:
    lines = [
        "A/B on the docker cluster: MEASURED Slurm placements and job outcomes; "
        "SIMULATED GPU faults and work",
        f"seeds {list(seeds)}; per-arm sums over seeds (GPU-seconds)",
        f"{'metric':<22}" + "".join(f"{a:>14}" for a in ARMS),
    ]
    for k in KEYS:
        vals = [sum(results[a][str(s)].get(k, 0.0) for s in seeds) for a in ARMS]
        lines.append(f"{k:<22}" + "".join(f"{v:>14.0f}" for v in vals))
    return "\n".join(lines) + "\n"
