"""Run a chaos timeline against the docker cluster, logging every command and its outcome.

Input: a ``Timeline``, an ``exec`` function (argv -> (rc, output); the real one runs ``subprocess``), a clock
and a sleep (injected: tests run on a virtual clock), the log. Output: the log records; the job ids Slurm
gave each submitted event (``ref -> job id``). Commands go through ``docker exec`` into the cluster's
containers (``slurmctld`` for sbatch/sacct, the node containers for ``fleetyield-agent``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_fleetyield.chaos.log import ChaosLog
from slurm_fleetyield.chaos.timeline import Event, Timeline

Exec = Callable[[Sequence[str]], tuple[int, str]]
CTL = "slurmctld"
SHARED = "/shared/fy-chaos"
JOB_SCRIPT = f"{SHARED}/fy-train-job.sh"
AGENT_STATE_DIR = "/var/lib/fleetyield-agent"  # the node agents' --state-dir in the docker cluster
IMPLANT_MODULE = "fy_chaos_implant"


def progress_dir(run_tag: str) -> str:
    """Where one run's jobs keep their progress and checkpoint logs (shared volume, one dir per run)."""
    return f"{SHARED}/runs/{run_tag}/progress"


def docker_exec(argv: Sequence[str], timeout: float = 60.0) -> tuple[int, str]:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return p.returncode, (p.stdout + p.stderr).strip()


def command(e: Event, run_tag: str) -> tuple[str, ...]:
    if e.kind == "submit":
        env = (
            f"--export=ALL,FY_WORK_S={int(e.work_s)},FY_CKPT_S={int(e.ckpt_s)},"
            f"FY_PROGRESS_DIR={progress_dir(run_tag)}"
        )
        requeue = "--requeue" if e.requeue else "--no-requeue"
        return (
            "docker", "exec", CTL, "sbatch", "--parsable", f"--job-name=fy-chaos-{run_tag}-{e.ref}",
            f"--comment=fy:{e.workload}", requeue, f"--gres=gpu:{e.gpus}", f"--output={SHARED}/out/%j.out",
            env, JOB_SCRIPT,
        )  # fmt: skip
    if e.kind == "fault":
        return ("docker", "exec", e.node, "fleetyield-agent", "fault", "inject", "--state-dir",
                AGENT_STATE_DIR, "--gpu", str(e.gpu), "--xid", str(e.xid))  # fmt: skip
    if e.kind == "precursor":  # remap threshold left at the agent's default: rows remap, none pends
        return ("docker", "exec", e.node, "fleetyield-agent", "fault", "degrade", "--state-dir",
                AGENT_STATE_DIR, "--gpu", str(e.gpu), "--mode", "ecc", "--rate", f"{e.rate:g}")  # fmt: skip
    if e.kind == "implant":
        return ("docker", "exec", e.node, "fleetyield-agent", "attest", "implant", "--state-dir",
                AGENT_STATE_DIR, "--module", IMPLANT_MODULE)  # fmt: skip
    raise ValueError(f"unknown chaos event kind {e.kind!r}")


@dataclass
class ChaosRunner:
    timeline: Timeline
    exec: Exec
    clock: Callable[[], float]
    sleep: Callable[[float], None]
    log: ChaosLog
    run_tag: str = "a"
    job_ids: dict[str, int] = field(default_factory=dict)
    faults: list[tuple[str, float]] = field(default_factory=list)  # (node, unix time) injected

    def run(self) -> None:
        t0 = self.clock()
        for e in self.timeline.events:
            wait = t0 + e.at_s - self.clock()
            if wait > 0:
                self.sleep(wait)
            argv = command(e, self.run_tag)
            now = self.clock()
            rc, out = self.exec(argv)
            outcome = "ok" if rc == 0 else "failed"
            if e.kind == "submit" and rc == 0:
                jid = out.strip().splitlines()[-1].split(";")[0] if out.strip() else ""
                if jid.isdigit():
                    self.job_ids[e.ref] = int(jid)
            if e.kind == "fault" and rc == 0:
                self.faults.append((e.node, now))
            if e.kind == "implant" and rc != 0 and "No such command" in out:
                outcome = "skipped: agent has no attest implant"
            self.log.write(
                {"type": "action", "ref": e.ref, "kind": e.kind, "planned_at_s": e.at_s, "t": now,
                 "offset_s": round(now - t0, 3), "command": list(argv), "rc": rc, "out": out[-500:],
                 "outcome": outcome, "job_id": self.job_ids.get(e.ref)}
            )  # fmt: skip
