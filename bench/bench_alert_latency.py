"""Fault-to-inbox latency of the Prometheus/Alertmanager path, on 127.0.0.1 with the real binaries.

XID 79 is injected on a fake agent (the GPU falls off the bus); Prometheus scrapes it, the shipped rule
FleetYieldGpuMissing fires, Alertmanager (group_wait 0s) POSTs the webhook, and the controller's listener
stores the FatalEvent durably. Measured: the agent's fault timestamp -> the event committed to SQLite.
One injection per agent (a second missing GPU on the same node is the same alert), ``--injections``
agents, run once per interval setting (default 1s and 100ms), each with a fresh Prometheus/Alertmanager.

With ``--slurm-drain CMD`` the time until ``CMD NODE`` (e.g. a script polling ``scontrol show node``)
exits 0 is measured too; leave it off where no Slurm cluster is reachable.

Run: .venv/bin/python bench/bench_alert_latency.py [--injections 12] [--intervals 1s,100ms]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from promstack.stack import Agent, AlertPath, binaries

GOAL_P50_S = {"1s": 3.0}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def run(bins: dict, workdir: Path, agents: list[Agent], interval: str, drain_cmd: str | None) -> list[float]:
    path = AlertPath(bins, workdir, agents, interval=interval)
    out: list[float] = []
    try:
        path.start()
        time.sleep(1.0)
        for agent in agents:
            latency, event = path.inject_and_wait(agent, gpu=1, xid=79)
            if drain_cmd:
                t0 = time.time()
                while subprocess.run([*drain_cmd.split(), agent.hostname]).returncode != 0:
                    if time.time() - t0 > 60:
                        raise TimeoutError(f"{agent.hostname} never drained")
                    time.sleep(0.05)
                latency += time.time() - t0
            out.append(latency)
            print(f"  {interval:>6} {agent.hostname}: {latency:.3f} s ({event.message})", flush=True)
            time.sleep(0.3)
    finally:
        path.stop()
    for agent in agents:
        agent.cli("reset", "--gpu", "1")  # the GPU comes back for the next interval setting
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--injections", type=int, default=12)
    ap.add_argument("--intervals", default="1s,100ms", help="scrape = evaluation interval settings")
    ap.add_argument("--slurm-drain", default=None, help="command NODE that exits 0 once NODE is drained")
    args = ap.parse_args()
    bins = binaries()
    missing = [k for k in ("prometheus", "alertmanager") if not bins[k]]
    if missing:
        print(f"missing: {missing} (apt-get install prometheus prometheus-alertmanager)")
        return 2
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="fy-alert-bench-") as tmp:
        workdir = Path(tmp)
        agents = [Agent(f"bench-{i:02d}", workdir, gpus=2, seed=100 + i) for i in range(args.injections)]
        try:
            for a in agents:
                a.start()
            for interval in args.intervals.split(","):
                results[interval] = run(bins, workdir, agents, interval, args.slurm_drain)
        finally:
            for a in agents:
                a.stop()
    print("\ninterval  n   p50     p90     max     goal p50  ratio")
    base = None
    for interval, values in results.items():
        p50, p90, mx = statistics.median(values), pct(values, 0.9), max(values)
        goal = GOAL_P50_S.get(interval)
        ratio = f"{p50 / goal:.2f}" if goal else "-"
        print(
            f"{interval:>8}  {len(values):<3} {p50:.3f}s  {p90:.3f}s  {mx:.3f}s  "
            f"{f'{goal:.1f}s' if goal else '-':>8}  {ratio}"
        )
        base = base or p50
    if len(results) > 1 and base:
        first, *rest = results
        for interval in rest:
            print(f"p50 {interval} / p50 {first}: {statistics.median(results[interval]) / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
