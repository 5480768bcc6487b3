"""A/B: the same chaos timeline on the same cluster, bare Slurm vs Slurm + FleetYield, over seeds.

Per seed and arm: reset the cluster (``reset``), put it in the arm's configuration (``prepare``), run the
timeline (``ChaosRunner``), wait for its jobs (``drain_timeout_s``, then leftovers are cancelled and counted
as they stand), read ``sacct`` and the jobs' checkpoint logs, settle them with ``chaos.ledger`` (the core's
``settle_job``). After the last arm the cluster is left as ``make up`` leaves it (``restore``).

Reset (both arms, the supported way, like the integration tests' ``reset_world``): stop the NHC emulation
(by its recorded pid) and the controller, cancel every job, wait until no node is rebooting (the
rehabilitation ladder's ``scontrol reboot`` restarts a node's container), ``fy-service agent restart
--wipe`` on every node (fresh fake GPUs: injected faults, counters, fatal marker and push spool gone, so a
previous arm's events never reach the next controller), drop the nodes' undelivered epilog records, wait
for an empty queue, resume every drained or down node.

Arms:
- ``bare``: no FleetYield influence. The controller stays stopped; ``/etc/slurm/fleetyield.disabled``
  (job_submit.lua adds no ``fy_`` constraint); ``scontrol reconfigure`` puts features and weights back to
  slurm.conf's (checked: no ``fy_`` feature, slurm.conf weights); the nodes' hooks.conf is swapped for one
  whose Prolog consults neither the controller nor the agent's fatal marker (a FleetYield Prolog would refuse
  a node with a pending fatal event); ``contrib/chaos/nhc-drain.sh`` runs in slurmctld: it drains a node
  after a job on it failed with a GPU fault (exit 86), as a site's NHC would, and nobody resumes it during the
  run (an admin would, later).
- ``fleetyield``: hooks.conf restored, kill switch removed, ``fy-service controller restart --wipe`` (an
  empty store: no fatal history, lifecycle or calibration carried over from a previous arm or seed), then
  wait until it has labelled every node green.

Both arms: held jobs of the run (a Prolog refusal requeues a job held) are released, as an operator would.
Measured: real Slurm placements, requeues, states and times. Simulated: the GPU faults (the agents' fake
backend) and the work (the job script sleeps). Everything executed is in the per-arm JSONL logs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_fleetyield.chaos import admin as admin_mod
from slurm_fleetyield.chaos import ledger
from slurm_fleetyield.chaos.log import ChaosLog
from slurm_fleetyield.chaos.runner import CTL, SHARED, ChaosRunner, Exec, progress_dir
from slurm_fleetyield.chaos.timeline import Timeline, TimelineParams, generate

ARMS = ("bare", "fleetyield")
NHC_PID = f"{SHARED}/nhc.pid"
PREMIUM_NODES = frozenset({"gpu-h100-1", "gpu-h100-2"})
REPO = Path(__file__).resolve().parents[2]
CONTRIB = REPO / "contrib" / "chaos"
SLURM_CONF = REPO / "contrib" / "slurm-docker-cluster" / "slurm" / "slurm.conf"
CONTROLLER = admin_mod.CONTROLLER  # the controller's container
HOOKS_CONF = "/etc/fleetyield/hooks.conf"
HOOKS_ORIG = f"{HOOKS_CONF}.fy-ab-orig"
DISABLED = "/etc/slurm/fleetyield.disabled"
# Bare arm: the FleetYield Prolog still runs (slurm.conf names it) but asks no controller and reads an empty
# agent directory, i.e. it allows every job, as if it were not installed.
BARE_HOOKS = (
    "# fleetyield chaos ab, bare arm (restored after the arm): no controller gate, no fatal-marker check\n"
    "controller_url =\n"
    "agent_state_dir = /var/lib/fleetyield-ab-bare-arm\n"
)
POLL_S = 5.0  # how often the wait for a run's jobs looks at squeue
_UNSETTLED = ("REBOOT", "NOT_RESPONDING", "POWER", "UNKNOWN")


class ChaosError(RuntimeError):
    """The cluster could not be put into the state an arm needs (the message says which wait failed)."""


def d(*argv: str) -> tuple[str, ...]:
    return ("docker", "exec", *argv)


def slurm_conf_nodes(path: Path = SLURM_CONF) -> dict[str, dict[str, str]]:
    """Features and weight slurm.conf gives each node (``NodeName=gpu-h100-[1-2] ... Feature=h100,nvlink
    Weight=10``), expanded per node: what a cluster without FleetYield runs with."""
    out: dict[str, dict[str, str]] = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\s*NodeName=(\S+)\s", line)
        if not m:
            continue
        f = re.search(r"\bFeatures?=(\S+)", line)
        w = re.search(r"\bWeight=(\d+)", line)
        for n in ledger._hosts(m.group(1)):
            out[n] = {"features": f.group(1) if f else "", "weight": w.group(1) if w else "1"}
    return out


def node_info(text: str) -> dict[str, dict[str, str]]:
    """``scontrol show node -o`` as ``{node: {field: value}}`` (fields without spaces; first wins)."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for tok in line.split():
            k, sep, v = tok.partition("=")
            if sep and k not in fields:
                fields[k] = v
        if "NodeName" in fields:
            out[fields["NodeName"]] = fields
    return out


def has_fy_feature(fields: Mapping[str, str]) -> bool:
    feats = f"{fields.get('AvailableFeatures', '')},{fields.get('ActiveFeatures', '')}".split(",")
    return any(f.startswith("fy_") for f in feats)


def setup_commands(
    arm: str, nodes: Sequence[str], run_tag: str = "x", nhc: bool = True
) -> list[tuple[str, ...]]:
    """The arm's configuration commands after ``reset`` (idempotent; ``prepare`` adds the waits); ``nhc``:
    the bare arm starts ``nhc-drain.sh`` (the gang A/B runs its own health checks in both arms instead)."""
    common = [
        d(CTL, "sh", "-c", f"rm -rf {SHARED}/runs/{run_tag}; mkdir -p {SHARED}/out {progress_dir(run_tag)}"),
        ("docker", "cp", str(CONTRIB / "fy-train-job.sh"), f"{CTL}:{SHARED}/fy-train-job.sh"),
        ("docker", "cp", str(CONTRIB / "nhc-drain.sh"), f"{CTL}:{SHARED}/nhc-drain.sh"),
    ]
    if arm == "bare":
        out = [*common, d(CTL, "touch", DISABLED)]
        conf = slurm_conf_nodes()
        for n in nodes:  # features and weight back to slurm.conf's (no fy_ label, no shadow price)
            c = conf.get(n, {"features": "", "weight": "1"})
            out.append(d(CTL, "scontrol", "update", f"NodeName={n}", f"AvailableFeatures={c['features']}",
                         f"ActiveFeatures={c['features']}", f"Weight={c['weight']}"))  # fmt: skip
        hooks = shlex.quote(BARE_HOOKS)
        for n in nodes:  # keep the image's hooks.conf once (a re-run must not back up the bare one)
            out.append(
                d(n, "sh", "-c", f"[ -f {HOOKS_ORIG} ] || cp -p {HOOKS_CONF} {HOOKS_ORIG}; "
                  f"printf %s {hooks} > {HOOKS_CONF}")
            )  # fmt: skip
        if nhc:
            out.append(d("-d", CTL, "bash", f"{SHARED}/nhc-drain.sh", "5"))
        return out
    if arm == "fleetyield":
        out = [*common, *restore_hooks_commands(nodes), d(CTL, "rm", "-f", DISABLED)]
        out.append(d(CONTROLLER, "fy-service", "controller", "restart", "--wipe"))
        return out
    raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ARMS)}")


def restore_hooks_commands(nodes: Sequence[str]) -> list[tuple[str, ...]]:
    return [d(n, "sh", "-c", f"[ ! -f {HOOKS_ORIG} ] || mv -f {HOOKS_ORIG} {HOOKS_CONF}") for n in nodes]


@dataclasses.dataclass
class Cluster:
    """The docker cluster as the A/B sees it: commands through ``exec_`` (logged), polls with deadlines."""

    exec_: Exec
    nodes: Sequence[str]
    log: ChaosLog | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def run(self, argv: Sequence[str], kind: str = "setup") -> tuple[int, str]:
        rc, out = self.exec_(argv)
        if self.log is not None:
            rec = {"type": kind, "t": self.clock(), "command": list(argv), "rc": rc, "out": out[-300:]}
            self.log.write(rec)
        return rc, out

    def nodes_now(self) -> dict[str, dict[str, str]]:
        rc, out = self.exec_(d(CTL, "scontrol", "show", "node", "-o"))
        return node_info(out) if rc == 0 else {}

    def wait(self, what: str, ok: Callable[[], bool], timeout: float, interval: float = 1.0) -> None:
        t0 = self.clock()
        deadline = t0 + timeout
        while True:
            if ok():
                if self.log is not None:
                    self.log.write({"type": "wait", "t": self.clock(), "what": what,
                                    "waited_s": round(self.clock() - t0, 1)})  # fmt: skip
                return
            if self.clock() >= deadline:
                raise ChaosError(f"gave up after {timeout:.0f} s waiting for {what}")
            self.sleep(interval)

    def queue(self) -> list[tuple[str, str, str]] | None:
        """Every job in the queue: (id, state, reason); None when squeue failed (not: an empty queue)."""
        rc, out = self.exec_(d(CTL, "squeue", "-h", "-o", "%i|%T|%r"))
        if rc != 0:
            return None
        return [tuple(ln.split("|", 2)) for ln in out.splitlines() if ln.count("|") == 2]  # type: ignore[misc]

    def settled(self) -> bool:
        for n in self.nodes:
            rc, out = self.exec_(("docker", "inspect", "-f", "{{.State.Running}}", n))
            if rc != 0 or out.strip() != "true":
                return False
        info = self.nodes_now()
        return set(self.nodes) <= set(info) and not any(
            w in info[n].get("State", "") for n in self.nodes for w in _UNSETTLED
        )

    def reset(self) -> None:
        """Back to a quiet cluster: no jobs, no faults, no drains, controller stopped (module docstring)."""
        self.run(d(CTL, "sh", "-c", f"[ ! -f {NHC_PID} ] || kill $(cat {NHC_PID}); rm -f {NHC_PID}"))
        self.run(d(CONTROLLER, "fy-service", "controller", "stop"))
        jobs = [j for j, _, _ in self.queue() or ()]
        if jobs:
            self.run(d(CTL, "scancel", *jobs))
        self.wait("no node rebooting or not responding", self.settled, 180.0)
        for n in self.nodes:
            self.run(d(n, "fy-service", "agent", "restart", "--wipe"))
            self.run(d(n, "sh", "-c", "rm -f /var/spool/fleetyield/outcomes/*"))
        self.wait("an empty job queue", lambda: self.queue() == [], 120.0)
        for n, f in self.nodes_now().items():
            if n in self.nodes and any(w in f.get("State", "") for w in ("DRAIN", "DOWN", "FAIL")):
                self.run(d(CTL, "scontrol", "update", f"NodeName={n}", "State=RESUME"))
        self.wait("every node idle", lambda: self._all(lambda f: f.get("State") == "IDLE"), 60.0)

    def _all(self, pred: Callable[[Mapping[str, str]], bool]) -> bool:
        info = self.nodes_now()
        return all(n in info and pred(info[n]) for n in self.nodes)

    def prepare(self, arm: str, run_tag: str, nhc: bool = True) -> dict[str, dict[str, str]]:
        """Reset, then the arm's configuration, verified; returns the nodes as the run starts."""
        self.reset()
        for argv in setup_commands(arm, self.nodes, run_tag, nhc):
            rc, out = self.run(argv)
            if rc != 0:
                raise ChaosError(f"{' '.join(argv)} failed (rc {rc}): {out[-300:]}")
        if arm == "bare":
            conf = slurm_conf_nodes()
            self.wait(
                "slurm.conf's features and weights (no fy_ feature)",
                lambda: self._all(
                    lambda f: f.get("State") == "IDLE" and not has_fy_feature(f)
                    and f.get("Weight") == conf.get(f.get("NodeName", ""), {}).get("weight")
                ),
                60.0,
            )  # fmt: skip
        else:
            self.wait(
                "the controller labelling every node green",
                lambda: self._all(
                    lambda f: f.get("State") == "IDLE" and "fy_tier_green" in f.get("AvailableFeatures", "")
                ),
                120.0,
            )
        info = self.nodes_now()
        if self.log is not None:
            keep = ("State", "AvailableFeatures", "Weight")
            nodes = {n: {k: f.get(k, "") for k in keep} for n, f in info.items()}
            self.log.write({"type": "nodes", "t": self.clock(), "arm": arm, "nodes": nodes})
        return info

    def restore(self) -> None:
        """The cluster as ``make up`` leaves it: hooks back, kill switch off, fresh controller, all green."""
        self.prepare("fleetyield", "restore")
        self.run(d(CTL, "rm", "-rf", f"{SHARED}/runs/restore"))


def run_arm(
    timeline: Timeline,
    arm: str,
    exec_: Exec,
    out_dir: Path,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    drain_timeout_s: float | None = None,
    version: str = "",
    admin_delay_s: float | None = None,
) -> dict[str, Any]:
    """One arm of one seed; ``drain_timeout_s`` (default: the timeline's duration) bounds the wait for its
    jobs after the last event; ``admin_delay_s``: the FleetYield arm has an emulated admin approving drain
    proposals that long after they appear (chaos/admin.py; None: no admin)."""
    tag = f"{arm}-s{timeline.seed}"
    timeout = timeline.params.duration_s if drain_timeout_s is None else drain_timeout_s
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f"chaos-{tag}.jsonl", "w") as fh:
        log = ChaosLog(fh)
        log.header(timeline, arm, version, clock())
        cluster = Cluster(exec_, timeline.params.nodes, log, clock, sleep)
        cluster.prepare(arm, tag)
        stop = threading.Event()
        thread = None
        if arm == "fleetyield" and admin_delay_s is not None:
            for argv in admin_mod.setup_commands():
                rc, out = cluster.run(argv)
                if rc != 0:
                    raise ChaosError(f"admin setup failed (rc {rc}): {out[-300:]}")
            admin = admin_mod.Admin(exec_, admin_delay_s, clock, log)
            thread = threading.Thread(target=admin.run, args=(stop,), name="chaos-admin", daemon=True)
        runner = ChaosRunner(timeline, exec_, clock, sleep, log, tag)
        started = clock()
        if thread is not None:
            thread.start()
        try:
            runner.run()
            ours = {str(j) for j in runner.job_ids.values()}
            unfinished = _wait_for_jobs(cluster, ours, clock() + timeout)
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=120)
        if unfinished:
            cluster.run(d(CTL, "scancel", *sorted(unfinished)), "deadline")
        sacct = _final_sacct(cluster, ours)
        rc, ck = exec_(d(CTL, "sh", "-c", f"grep -H . {progress_dir(tag)}/*.ckpts 2>/dev/null"))
        records = ledger.parse_ckpt_logs(ck)
        classes = {str(runner.job_ids[e.ref]): e.workload for e in timeline.events if e.ref in runner.job_ids}
        controller: dict[str, tuple[int, str]] = {}
        if arm == "fleetyield":  # what the controller did and thinks, beside the log (can be large)
            for what, argv in (("events", ("events", "--limit", "1000")), ("status", ("status",))):
                controller[what] = exec_(d(CONTROLLER, "fleetyield", *argv, "--json"))
        # a requeue by premium reclaim is FleetYield's own doing: wasted, not a hardware failure
        reclaimed = ledger.reclaim_requeues(controller["events"][1]) if "events" in controller else []
        entries, totals = ledger.ledger(
            sacct, records, runner.faults, PREMIUM_NODES, classes=classes, reclaimed=reclaimed
        )
        # sbatch refused outright (e.g. a constraint no node carries): demand the ledger never sees
        refused = sum(1 for e in timeline.events if e.kind == "submit" and e.ref not in runner.job_ids)
        totals = dict(totals) | {
            "refused": float(refused),
            "unfinished": float(len(unfinished)),
            "elapsed_s": round(clock() - started, 1),
        }
        log.write({"type": "nodes_after", "t": clock(), "nodes": {
            n: {k: f.get(k, "") for k in ("State", "Reason", "AvailableFeatures")}
            for n, f in cluster.nodes_now().items()}})  # fmt: skip
        for what, (rc, text) in controller.items():
            (out_dir / f"controller-{what}-{tag}.json").write_text(text + "\n")
            log.write({"type": f"controller_{what}", "rc": rc, "file": f"controller-{what}-{tag}.json"})
        log.write({"type": "ledger", "entries": [_entry(e) for e in entries]})
        result = {"type": "result", "arm": arm, "seed": timeline.seed, "totals": totals,
                  "sacct": sacct, "job_ids": runner.job_ids, "faults": runner.faults,
                  "unfinished": sorted(unfinished)}  # fmt: skip
        log.write(result)
    return result


def _entry(e: Any) -> dict[str, Any]:
    out = dataclasses.asdict(e)
    out["workload"] = e.workload.value if e.workload is not None else None
    return out


def _wait_for_jobs(cluster: Cluster, ours: set[str], deadline: float) -> set[str]:
    """Until none of ``ours`` is queued (releasing held ones) or ``deadline``; returns those left."""
    released: set[str] = set()
    left: set[tuple[str, str, str]] = {(j, "", "") for j in ours}
    while True:
        q = cluster.queue()
        if q is not None:  # a failed squeue keeps the last answer
            left = {(j, st, r) for j, st, r in q if j in ours}
        if not left:
            return set()
        for j, _st, reason in left:
            if "held" in reason.lower() and j not in released:
                cluster.run(d(CTL, "scontrol", "release", j), "operator_release")
                released.add(j)
        if cluster.clock() >= deadline:
            return {j for j, _, _ in left}
        cluster.sleep(POLL_S)


def _final_sacct(cluster: Cluster, ours: set[str]) -> str:
    """sacct rows of every attempt, once slurmdbd has every job's final state (it lags by a second or so)."""
    if not ours:
        return ""
    argv = d(CTL, "sacct", "-X", "-D", "-P", "-j", ",".join(sorted(ours)), "-o", ledger.SACCT_FIELDS)
    text = ""

    def final() -> bool:
        nonlocal text
        rc, text = cluster.exec_(argv)
        rows = ledger.parse_sacct(text) if rc == 0 else []
        return {r.get("JobID") for r in rows} >= ours and not any(
            r.get("State", "").split()[0] in ("RUNNING", "PENDING") for r in rows if r.get("State")
        )

    with contextlib.suppress(ChaosError):  # past 60 s: counted as they stand; the log has the text
        cluster.wait("final states in sacct", final, 60.0)
    return text


def versions(exec_: Exec) -> dict[str, str]:
    """What the result depends on: this checkout's commit, the cluster's Slurm, the controller image."""

    def git(*a: str) -> str:
        p = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, check=False)
        return p.stdout.strip()

    _, slurm = exec_(d(CTL, "sinfo", "-V"))
    _, image = exec_(("docker", "inspect", "-f", "{{.Image}} {{.Created}}", CONTROLLER))
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_describe": git("describe", "--always", "--dirty"),
        "slurm": slurm.strip(),
        "controller_image": image.strip(),
    }


def ab(
    seeds: Sequence[int],
    exec_: Exec,
    out_dir: Path,
    tp: TimelineParams | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    drain_timeout_s: float | None = None,
    command: str = "",
    admin_delay_s: float | None = None,
) -> dict[str, Any]:
    tp = tp or TimelineParams()
    out_dir.mkdir(parents=True, exist_ok=True)
    vers = versions(exec_)
    results: dict[str, dict[str, Any]] = {a: {} for a in ARMS}
    started = clock()
    try:
        for s in seeds:
            tl = generate(s, tp)
            for arm in ARMS:
                res = run_arm(
                    tl,
                    arm,
                    exec_,
                    out_dir,
                    clock,
                    sleep,
                    drain_timeout_s,
                    vers["git_describe"],
                    admin_delay_s,
                )
                results[arm][str(s)] = res["totals"]
    finally:
        Cluster(exec_, tp.nodes, None, clock, sleep).restore()
        if admin_delay_s is not None:
            for argv in admin_mod.teardown_commands():
                exec_(argv)
    summary = {
        "seeds": list(seeds),
        "arms": results,
        "params": tp.to_dict(),
        "drain_timeout_s": tp.duration_s if drain_timeout_s is None else drain_timeout_s,
        "admin_delay_s": admin_delay_s,
        "versions": vers,
        "command": command,
        "started": started,
        "elapsed_s": round(clock() - started, 1),
        "table": table(results, seeds),
    }
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
