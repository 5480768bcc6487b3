"""Benchmark: one full controller tick against a real slurmctld holding 10,000 nodes.

Input: the docker cluster image (``fleetyield/slurm:22.05``, built by ``make up`` / ``up.sh --build-only``).
Output: a table on stdout: per tick the wall time split into read (``scontrol show node`` + ``squeue``),
sense, decide (``tick``), apply (``scontrol update``), render and commit, and the number of Slurm calls
next to the number of distinct (features, weight) groups; plus slurmctld's RSS. ``--json FILE`` writes the
raw figures.

How: a separate container (same image, name ``fybench-ctld``, no network shared with the test cluster)
runs slurmctld with a generated slurm.conf of ``--nodes`` ``State=CLOUD`` nodes (half ``h100,nvlink``
8x H100, half ``l40s`` 8x L40S; no slurmd anywhere, ``PrivateData=cloud`` so they are listed), and the
controller's own code from the image runs INSIDE that container: the real ``Daemon.tick_once`` with the
real ``SlurmCli`` adapter and a SQLite store, and a synthetic sense port (80k GPUs for 10k nodes: healthy
except 1% remap pending, 1% with an uncorrectable remapped row, 0.4% remap failure, 0.2% not answering),
so the feature-write path sees realistic distinct groups. The controller code is this working tree's
``slurm_fleetyield`` (copied into the container ahead of the image's; ``--image-code`` runs the image's).
Ticks:

1. cold: Slurm holds only the admin features, every node gets labelled, every view row written (and the
   first ``views.EXPLAIN_PER_TICK`` explanations);
2. steady: nothing changed, nothing to write in Slurm; the view still explains the next nodes not yet
   explained (backfill); then ticks until every node is explained (not printed, counted);
3. settled: nothing changed and every node explained (the common tick);
4. after ``scontrol reconfigure``: Slurm reset features and weights to slurm.conf, all re-asserted;
5. with ``--mass-failure N`` (issue #30): N nodes spread over the fleet report a fatal XID 79 at once (N
   agent pushes, put in the store's inbox as the push listener does, then the tick the push wakes): the
   time from the first event in the inbox until every drain the cap allows is in Slurm (``sinfo``), the
   drains and holds by rule, and ``fleetyield_holds`` as ``/metrics`` exports it (the expression of the
   FleetYieldDrainCapHit alert); then one more tick, which must drain nothing more while the cap binds.
   ``--drain-rate R`` sets ``core.quarantine.max_new_drains_per_window`` (default 3 per 600 s), so the
   fraction cap (10% of the nodes) is the one that binds.

The container is removed at the end (``--keep`` keeps it for a look).

    .venv/bin/python bench/bench_reconcile.py [--nodes 10000] [--image fleetyield/slurm:22.05] \
        [--mass-failure 1000 [--drain-rate 100000]] [--json out.json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CONTAINER = "fybench-ctld"
GOAL_CALLS = "calls grow with distinct (features, weight) groups, not with nodes"

SLURM_CONF = """\
ClusterName=fybench
SlurmctldHost={host}
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmctldPidFile=/run/slurmctld.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldDebug=error
ReturnToService=2
# Power-saved cloud nodes are hidden from scontrol/sinfo unless listed as private data "cloud".
PrivateData=cloud
SuspendTime=INFINITE
TreeWidth=65533
NodeName=h[{h_first:05d}-{h_last:05d}] {hw} Gres=gpu:h100:8 Feature=h100,nvlink Weight=10 State=CLOUD
NodeName=l[{l_first:05d}-{l_last:05d}] {hw} Gres=gpu:l40s:8 Feature=l40s Weight=1 State=CLOUD
PartitionName=gpu Nodes=ALL Default=YES State=UP
"""

HW = "CPUs=16 RealMemory=65536"

SETUP = r"""
set -euo pipefail
dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge /run/munge && runuser -u munge -- /usr/sbin/munged --force
rm -f /etc/slurm/gres.conf
install -d -o slurm -g slurm /var/spool/slurmctld
(slurmctld -D >/tmp/slurmctld.log 2>&1 &)
for _ in $(seq 300); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
scontrol ping | grep -q 'is UP'
"""


# ------------------------------------------------------------------------------------------------------
# Host side: start the container, run the inner part in it, print, tear down
# ------------------------------------------------------------------------------------------------------


def docker_bin() -> str:
    for cand in (shutil.which("docker"), "/usr/bin/docker"):
        if cand and subprocess.run([cand, "info"], capture_output=True).returncode == 0:
            return cand
    sys.exit("no working docker client")


def run(*argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, text=True, capture_output=True, **kw)


def host_main(args: argparse.Namespace) -> int:
    docker = docker_bin()
    if run(docker, "image", "inspect", args.image, check=False).returncode != 0:
        sys.exit(f"image {args.image} not found: build it with `make up` (or up.sh --build-only)")
    run(docker, "rm", "-f", CONTAINER, check=False)
    half = args.nodes // 2
    conf = SLURM_CONF.format(
        host=CONTAINER, hw=HW, h_first=1, h_last=half, l_first=1, l_last=args.nodes - half
    )
    t0 = time.monotonic()
    try:
        run(
            docker,
            "run",
            "-d",
            "--name",
            CONTAINER,
            "--hostname",
            CONTAINER,
            args.image,
            "shell",
            "-c",
            "sleep infinity",
        )
        subprocess.run(
            [docker, "exec", "-i", CONTAINER, "bash", "-c", "cat >/etc/slurm/slurm.conf"],
            input=conf,
            text=True,
            check=True,
        )
        run(docker, "exec", CONTAINER, "bash", "-c", SETUP)
        started = time.monotonic() - t0
        run(docker, "cp", __file__, f"{CONTAINER}:/tmp/bench_reconcile.py")
        run(docker, "cp", str(Path(__file__).with_name("_fleet.py")), f"{CONTAINER}:/tmp/_fleet.py")
        env = []
        if not args.image_code:
            package = Path(__file__).resolve().parent.parent / "slurm_fleetyield"
            run(docker, "exec", CONTAINER, "mkdir", "-p", "/tmp/fycode")
            run(docker, "cp", str(package), f"{CONTAINER}:/tmp/fycode/")
            env = ["-e", "PYTHONPATH=/tmp/fycode"]
        proc = subprocess.run(
            [
                docker,
                "exec",
                *env,
                CONTAINER,
                "/opt/fleetyield/bin/python",
                "/tmp/bench_reconcile.py",
                "--inner",
                "--nodes",
                str(args.nodes),
                "--mass-failure",
                str(args.mass_failure),
                *(["--drain-rate", str(args.drain_rate)] if args.drain_rate is not None else []),
            ],
            text=True,
            capture_output=True,
        )
        if proc.returncode != 0:
            print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
            return 1
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
        doc["container_start_s"] = started
        doc["slurmctld_rss_mb_end"] = _rss_mb(docker)
    finally:
        if not args.keep:
            run(docker, "rm", "-f", CONTAINER, check=False)
    report(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


def _rss_mb(docker: str) -> float:
    out = run(docker, "exec", CONTAINER, "ps", "-o", "rss=", "-C", "slurmctld", check=False).stdout.split()
    return int(out[0]) / 1024 if out else float("nan")


def report(doc: dict) -> None:
    n = doc["nodes"]
    print(
        f"\nreconcile against a real slurmctld (Slurm {doc['slurm_version']}): {n:,} nodes "
        f"({n * 8:,} GPUs), {doc['samples']:,} nodes sampled; "
        f"slurmctld RSS {doc['slurmctld_rss_mb_start']:.0f} MB "
        f"at start, {doc['slurmctld_rss_mb_end']:.0f} MB at the end"
    )
    cols = (
        "tick",
        "total s",
        "read s",
        "sense s",
        "decide s",
        "apply s",
        "render s",
        "commit s",
        "rows",
        "explained",
        "calls",
        "reads",
        "writes",
        "groups",
        "drains",
    )
    print("  ".join(f"{c:>9}" for c in cols))
    for t in doc["ticks"]:
        row = (
            t["name"],
            t["total_s"],
            t["read_s"],
            t["sense_s"],
            t["decide_s"],
            t["apply_s"],
            t["render_s"],
            t["commit_s"],
            t.get("rows", "-"),
            t.get("explained", "-"),
            t["calls"],
            t["read_calls"],
            t["write_calls"],
            t["groups"],
            t["drains"],
        )
        print("  ".join(f"{v:>9.3f}" if isinstance(v, float) else f"{v!s:>9}" for v in row))
    print(f"backfill: {doc.get('backfill_ticks', '-')} ticks between steady and settled")
    print("\nSlurm commands of the cold tick (count, total s):")
    for cmd, (count, secs) in sorted(doc["ticks"][0]["by_command"].items()):
        print(f"  {cmd:<40} {count:>5} {secs:>8.3f}")
    cold = doc["ticks"][0]
    mass = doc.get("mass_failure")
    if mass:
        print(
            f"\nmass failure: {mass['events']:,} nodes fatal at once (cap: {mass['cap_nodes']:,} nodes, "
            f"{mass['rate_cap']} new drains per {mass['window_s']:.0f} s): {mass['drained_in_slurm']:,} "
            f"drained in Slurm {mass['in_slurm_s']:.3f} s after the events reached the inbox "
            f"(tick {mass['tick_s']:.3f} s: "
            f"read {mass['read_s']:.3f}, decide {mass['decide_s']:.3f}, apply {mass['apply_s']:.3f}, commit "
            f"{mass['commit_s']:.3f}; {mass['update_calls']} scontrol update calls, {mass['requeue_calls']} "
            f"requeue calls); held {mass['holds']} (by rule {mass['holds_by_rule']}); fleetyield_holds "
            f"exported {mass['holds_metric']} (FleetYieldDrainCapHit: fleetyield_holds > 0); next tick: "
            f"{mass['next_tick_drains']} new drains planned ({mass['next_tick_redrains']} of the same nodes "
            f"again), {mass['drained_after']:,} drained"
        )
    print(
        f"\ncalls vs groups ({GOAL_CALLS}): cold tick {cold['write_calls']} writes "
        f"for {cold['groups']} groups "
        f"over {n:,} nodes -> {cold['write_calls'] / max(1, cold['groups']):.1f} writes per group "
        f"(1 compress + 1 update), {cold['write_calls'] / n:.4f} per node"
    )


# ------------------------------------------------------------------------------------------------------
# Inside the container: the controller's real daemon tick with a timing Slurm runner
# ------------------------------------------------------------------------------------------------------


def inner_main(args: argparse.Namespace) -> int:
    import tempfile
    from collections import defaultdict

    from _fleet import SyntheticSense  # copied next to this file in the container

    from slurm_fleetyield import daemon as daemon_mod
    from slurm_fleetyield.adapters import slurm as slurm_mod
    from slurm_fleetyield.adapters.store import Store
    from slurm_fleetyield.config import Config
    from slurm_fleetyield.core.plan import DrainNode, UpdateNodes

    timings: dict[str, float] = defaultdict(float)
    by_command: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def runner(argv, timeout_s):
        t = time.perf_counter()
        result = slurm_mod.run_command(argv, timeout_s)
        dt = time.perf_counter() - t
        key = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv[:3]))
        key = key.split("NodeName=")[0].strip()
        by_command[key][0] += 1
        by_command[key][1] += dt
        return result

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timings[name] += time.perf_counter() - t

        return wrapper

    from slurm_fleetyield.config import from_mapping

    cli = slurm_mod.SlurmCli(runner=runner)
    major, minor, patch = cli.version()
    version = f"{major}.{minor:02d}.{patch}"
    rss_start = _self_rss_mb()
    store = Store(os.path.join(tempfile.mkdtemp(), "fy.db"))
    sense = SyntheticSense()
    config = Config()
    if args.drain_rate is not None:
        config = from_mapping({"core": {"quarantine": {"max_new_drains_per_window": args.drain_rate}}})
    d = daemon_mod.Daemon(config, cli, sense, store)
    # Time each stage of the daemon's own tick by wrapping what it calls.
    cli.read_nodes = timed("read", cli.read_nodes)
    cli.read_jobs = timed("read", cli.read_jobs)
    cli.apply = timed("apply", cli.apply)
    sense.sample = timed("sense", sense.sample)
    daemon_mod.tick = timed("decide", daemon_mod.tick)
    views = getattr(d, "views", None)  # the incremental renderer; older code renders render_result whole
    if views is not None:
        views.render = timed("render", views.render)
    else:
        daemon_mod.render_result = timed("render", daemon_mod.render_result)
    commit = store.commit_tick
    written: list = []

    def counted_commit(*a, **kw):
        written.append(kw.get("view"))
        return commit(*a, **kw)

    store.commit_tick = timed("commit", counted_commit)

    ticks = []
    backfill = 0
    for name in ("cold", "steady", "settled", "reconfig"):
        if name == "settled":
            while views is not None and views.unexplained and backfill < 100:
                d.tick_once()
                backfill += 1
        if name == "reconfig":
            slurm_mod.run_command(("scontrol", "reconfigure"), 60)
            _wait_reconfigured(args.nodes)
        written.clear()
        timings.clear()
        by_command.clear()
        calls0 = cli.calls
        t = time.perf_counter()
        outcome = d.tick_once()
        total = time.perf_counter() - t
        plan = outcome.result.plan
        updates = [a for a in plan.actions if isinstance(a, UpdateNodes)]
        writes = sum(c for k, (c, _) in by_command.items() if " update" in k or "hostlist" in k)
        ticks.append(
            {
                "name": name,
                "total_s": total,
                **{f"{k}_s": timings[k] for k in ("read", "sense", "decide", "apply", "render", "commit")},
                "calls": cli.calls - calls0,
                "write_calls": writes,
                "read_calls": cli.calls - calls0 - writes,
                "groups": len(updates),
                "updated_nodes": sum(len(u.nodes) for u in updates),
                "drains": sum(isinstance(a, DrainNode) for a in plan.actions),
                **_view_counts(written[0] if written else None),
                "tiers": dict(sorted(_count(dd.tier.value for dd in outcome.result.nodes.values()).items())),
                "by_command": {k: v for k, v in by_command.items()},
            }
        )
    mass = _mass_failure(args, d, store, cli, timings, by_command) if args.mass_failure else None
    print(
        json.dumps(
            {
                "mass_failure": mass,
                "nodes": args.nodes,
                "samples": args.nodes,
                "slurm_version": version,
                "slurmctld_rss_mb_start": rss_start,
                "backfill_ticks": backfill,
                "ticks": ticks,
            }
        )
    )
    return 0


def _mass_failure(args, d, store, cli, timings, by_command) -> dict:
    """``--mass-failure N``: N nodes' agents push a fatal XID at once; time until the drains are in Slurm."""
    from prometheus_client import generate_latest

    from slurm_fleetyield.adapters.metrics import make_registry
    from slurm_fleetyield.core.model import FatalEvent
    from slurm_fleetyield.core.plan import DrainNode, RequeueJobs

    half = args.nodes // 2
    names = [f"h{i:05d}" for i in range(1, half + 1)] + [f"l{i:05d}" for i in range(1, args.nodes - half + 1)]
    step = max(1, len(names) // args.mass_failure)
    hit = names[::step][: args.mass_failure]
    q = d.config.core.quarantine
    cap = max(q.drain_cap_min_nodes, int(q.drain_cap_fraction * args.nodes))
    timings.clear()
    by_command.clear()
    now = time.time()
    events = [
        FatalEvent(f"mass-{n}", n, now, "xid", gpu=3, xid=79, message="GPU has fallen off the bus")
        for n in hit
    ]
    t0 = time.perf_counter()
    store.put_events(events)  # what the push listener does with each agent's push, before it answers 202
    outcome = d.tick_once()
    tick_s = time.perf_counter() - t0
    drained = _fy_drained()
    in_slurm_s = time.perf_counter() - t0
    plan = outcome.result.plan
    metrics = generate_latest(make_registry(d.stats)).decode()
    held_metric = sum(
        float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("fleetyield_holds{")
    )
    update_calls = sum(c for k, (c, _) in by_command.items() if "update" in k)
    split = {f"{k}_s": timings[k] for k in ("read", "decide", "apply", "commit")}
    first_drains = {a.node for a in plan.actions if isinstance(a, DrainNode)}
    second = d.tick_once()
    again = {a.node for a in second.result.plan.actions if isinstance(a, DrainNode)}
    return {
        "events": len(events),
        "cap_nodes": cap,
        "rate_cap": q.max_new_drains_per_window,
        "window_s": q.window_s,
        "tick_s": tick_s,
        "in_slurm_s": in_slurm_s,
        **split,
        "drains_planned": len(first_drains),
        "update_calls": update_calls,
        "requeue_calls": sum(isinstance(a, RequeueJobs) for a in plan.actions),
        "drained_in_slurm": len(drained),
        "holds": len(plan.holds),
        "holds_by_rule": dict(_count(h.rule for h in plan.holds)),
        "holds_metric": held_metric,
        "next_tick_drains": len(again - first_drains),
        "next_tick_redrains": len(again & first_drains),
        "drained_after": len(_fy_drained()),
    }


def _fy_drained() -> set[str]:
    """Nodes Slurm shows drained with a FleetYield reason."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "drain,drained,draining", "-o", "%N|%E"], capture_output=True, text=True
    ).stdout
    return {ln.split("|", 1)[0] for ln in out.splitlines() if "|fleetyield:" in ln}


def _view_counts(view) -> dict:
    """View rows written and explanations rendered by one tick (incremental renderer only)."""
    if view is None or not hasattr(view, "nodes"):
        return {}
    return {"rows": len(view.nodes), "explained": sum(1 for n in view.nodes if n[3] is not None)}


def _count(items):
    from collections import Counter

    return Counter(items)


def _self_rss_mb() -> float:
    out = subprocess.run(
        ["ps", "-o", "rss=", "-C", "slurmctld"], capture_output=True, text=True
    ).stdout.split()
    return int(out[0]) / 1024 if out else float("nan")


def _wait_reconfigured(nodes: int, timeout: float = 60) -> None:
    """After ``scontrol reconfigure``: wait until slurmctld answers with the slurm.conf features again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = subprocess.run(["scontrol", "show", "node", "-o", "h00001"], capture_output=True, text=True)
        if proc.returncode == 0 and "AvailableFeatures=h100,nvlink " in proc.stdout:
            return
        time.sleep(0.1)
    raise SystemExit("slurmctld did not come back after scontrol reconfigure")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--image", default=os.environ.get("FLEETYIELD_IMAGE", "fleetyield/slurm:22.05"))
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--keep", action="store_true", help="keep the container")
    parser.add_argument("--mass-failure", type=int, default=0, help="then N nodes fatal at once (issue #30)")
    parser.add_argument("--drain-rate", type=int, help="core.quarantine.max_new_drains_per_window")
    parser.add_argument(
        "--image-code", action="store_true", help="run the image's controller code, not this working tree's"
    )
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return inner_main(args) if args.inner else host_main(args)


if __name__ == "__main__":
    sys.exit(main())
