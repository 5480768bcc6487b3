"""Issue 27 item 1 at full size: 10,000 idle or slow connections on each listening port, and what still works.

Three processes, as deployed: a fake-backend agent (``fleetyield-agent serve``), the controller in this
process (real ``build``: push listener, API, daemon loop at ``--interval`` s; Slurm is ``tests/rig.py``'s
recording ``FakeCommands``, 3 nodes scraped from the agent) and the scraping client (``bench/scrapes.py``).
For each port in turn (agent /metrics, controller push, controller API), ``bench/flood.py`` in a fourth
process holds ``-n`` connections in ``--mode``; while they are held this measures: ticks completed in
``--hold`` seconds, the agent's /metrics and the API's /metrics latency (median and max of ``--scrapes``
GETs), a validly signed fatal push -> the DRAIN command (a fresh node each port), and the flooded
process's threads and FDs (before -> during). Output: a table on stdout, one line per port.
``--one-process`` runs the agent and the client in this process instead (the first version of this bench:
its maxima measured the shared interpreter as much as the servers).

    ulimit -n 65536; nice -n 10 .venv/bin/python bench/bench_listeners.py -n 10000
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from tempfile import TemporaryDirectory

import click
import psutil

sys.path[:0] = [str(Path(__file__).parents[1] / "tests"), str(Path(__file__).parent)]
from flood import raise_nofile  # noqa: E402
from rig import AGENT, FakeCommands, free_port, node_line, wait_for, write_secret  # noqa: E402

from node_agent.config import build_config  # noqa: E402
from node_agent.exporter import Server  # noqa: E402
from node_agent.protocol import EVENTS_PATH, signed_headers  # noqa: E402
from slurm_fleetyield.adapters.scrape import AgentScraper  # noqa: E402
from slurm_fleetyield.adapters.slurm import SlurmCli  # noqa: E402
from slurm_fleetyield.config import from_mapping  # noqa: E402
from slurm_fleetyield.daemon import build  # noqa: E402

FLOOD = Path(__file__).parent / "flood.py"
SCRAPES = Path(__file__).parent / "scrapes.py"
SECRET = b"bench-listeners-secret-0123"
NODES = ["gpu-01", "gpu-02", "gpu-03"]


def _get(url: str) -> float:
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as resp:
        resp.read()
        assert resp.status == 200, resp.status
    return time.monotonic() - t0


def _scrape_times(urls: list[str], rounds: int, cpu: int | None) -> list[list[float]]:
    """``rounds`` GETs of each url from ``bench/scrapes.py`` (its own process, on ``cpu`` if given)."""
    args = [sys.executable, str(SCRAPES), "-n", str(rounds)] + [a for u in urls for a in ("--url", u)]
    if cpu is not None:
        args = ["taskset", "-c", str(cpu), *args]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True).stdout
    times = json.loads(out)
    return [times[u] for u in urls]


class _Agent:
    """``fleetyield-agent serve --backend fake`` in its own process (stderr to a file: a pipe nobody reads
    would block it once full)."""

    def __init__(self, tmp: Path, cpu: int | None) -> None:
        self.port = free_port()
        args = [AGENT, "serve", "--backend", "fake", "--listen", "127.0.0.1", "--port", str(self.port)]
        args += ["--state-dir", str(tmp / "agent"), "--gpus", "8", "--model", "h100", "--seed", "7"]
        if cpu is not None:
            args = ["taskset", "-c", str(cpu), *args]
        self.log = (tmp / "agent.log").open("wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        wait_for(self._ready, 30, "agent /metrics")
        self.ps = psutil.Process(self.proc.pid)
        if cpu is not None:  # taskset execs the agent: same pid
            assert self.ps.cpu_affinity() == [cpu]

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited {self.proc.returncode}")
        try:
            _get(f"http://127.0.0.1:{self.port}/metrics")
            return True
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)
        self.log.close()


def _push_fatal(port: int, node: str) -> int:
    event = {"event_id": str(uuid.uuid4()), "time": time.time(), "node": node, "gpu": 2, "uuid": "GPU-x",
             "kind": "xid", "xid": 79, "fatal": True, "message": "XID 79"}  # fmt: skip
    body = json.dumps({"node": node, "events": [event]}).encode()
    headers = signed_headers(SECRET, node, int(time.time()), body)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{EVENTS_PATH}", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


@click.command()
@click.option("-n", "count", type=int, default=10_000, show_default=True, help="Connections per port.")
@click.option(
    "--mode", type=click.Choice(["idle", "half", "trickle", "body"]), default="half", show_default=True
)
@click.option("--interval", type=float, default=1.0, show_default=True, help="Controller tick interval (s).")
@click.option("--hold", type=float, default=5.0, show_default=True, help="Seconds to count ticks under load.")
@click.option("--scrapes", type=int, default=20, show_default=True)
@click.option(
    "--pin",
    default=None,
    metavar="SERVER,FLOOD",
    help="CPUs for this process (the servers and the scraping client) and for the flood, e.g. 1,0: the "
    "flood's own connect/evict churn then competes for another core, as a remote attacker's would.",
)
@click.option(
    "--one-process",
    is_flag=True,
    help="Agent and scraping client in this process (the shared interpreter is then measured too).",
)
def main(
    count: int, mode: str, interval: float, hold: float, scrapes: int, pin: str | None, one_process: bool
) -> None:
    flood_cpu = server_cpu = None
    if pin:
        server_cpu, flood_cpu = (int(x) for x in pin.split(","))
        os.sched_setaffinity(0, {server_cpu})
    raise_nofile(count + 4096)
    with TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        agent: Server | _Agent
        if one_process:
            agent = Server(build_config(None, {"backend": "fake", "listen": "127.0.0.1", "port": 0,
                                               "state_dir": tmp / "agent", "gpus": 8}))  # fmt: skip
            agent.start()
        else:
            agent = _Agent(tmp, server_cpu)
        cmds = FakeCommands()
        for node in NODES:
            cmds.nodes[node] = node_line(node)
        cfg = from_mapping({
            "store": {"path": str(tmp / "fy.db")},
            "sense": {"url_template": f"http://127.0.0.1:{agent.port}/metrics?node={{node}}", "timeout_s": 5},
            "loop": {"interval_s": interval, "seed": 1},
            "push": {"secret_file": str(write_secret(tmp / "secret", SECRET)), "port": 0},
            "api": {"port": 0},
        })  # fmt: skip
        rt = build(cfg, slurm=SlurmCli(runner=cmds), sense=AgentScraper(cfg.sense.url_template, 5.0, 4))
        for server in rt.servers:
            server.start()
        runner = threading.Thread(target=rt.daemon.run, daemon=True)
        runner.start()
        ingest, api = rt.servers
        agent_url, api_url = f"http://127.0.0.1:{agent.port}/metrics", f"http://127.0.0.1:{api.port}/metrics"
        me = psutil.Process()
        agent_ps = me if isinstance(agent, Server) else agent.ps
        try:
            wait_for(lambda: rt.daemon.tick_no >= 1, 60, "first tick")
            _get(agent_url), _get(api_url), _push_fatal(ingest.port, "gpu-warm")  # start every worker
            targets = [
                ("agent /metrics", agent.port),
                ("controller push", ingest.port),
                ("controller API", api.port),
            ]
            print(f"| port | held / failed | ticks in {hold:.0f} s | agent /metrics p50 / max | API /metrics "
                  "p50 / max | fatal push -> DRAIN | threads | FDs |")  # fmt: skip
            for (name, port), node in zip(targets, NODES, strict=True):
                flooded = agent_ps if port == agent.port else me
                threads0, fds0 = flooded.num_threads(), flooded.num_fds()
                args = [sys.executable, str(FLOOD), "--port", str(port), "-n", str(count), "--mode", mode]
                if flood_cpu is not None:
                    args = ["taskset", "-c", str(flood_cpu), *args]
                proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                assert proc.stdout is not None and proc.stdin is not None
                ready = proc.stdout.readline().split()
                try:
                    tick0 = rt.daemon.tick_no
                    t_end = time.monotonic() + hold
                    a_times: list[float] = []
                    p_times: list[float] = []
                    if one_process:
                        while len(a_times) < scrapes:
                            a_times.append(_get(agent_url))
                            p_times.append(_get(api_url))
                    else:
                        a_times, p_times = _scrape_times([agent_url, api_url], scrapes, server_cpu)
                    t0 = time.monotonic()
                    status = _push_fatal(ingest.port, node)
                    wait_for(
                        lambda n=node: [c for c in cmds.drains() if f"NodeName={n}" in c],
                        30,
                        "drain",
                    )
                    drain = time.monotonic() - t0
                    threads, fds = flooded.num_threads(), flooded.num_fds()
                    time.sleep(max(0.0, t_end - time.monotonic()))  # the tick-counting window
                    ticks = rt.daemon.tick_no - tick0
                finally:
                    proc.stdin.close()
                    proc.wait(60)
                a_ms = f"{statistics.median(a_times) * 1e3:.1f} / {max(a_times) * 1e3:.1f} ms"
                p_ms = f"{statistics.median(p_times) * 1e3:.1f} / {max(p_times) * 1e3:.1f} ms"
                row = f"| {name} | {ready[1]} / {ready[2]} | {ticks} | {a_ms} | {p_ms} | {status}, "
                print(f"{row}{drain * 1e3:.0f} ms | {threads0} -> {threads} | {fds0} -> {fds} |", flush=True)
        finally:
            rt.daemon.stop()
            runner.join(15)
            rt.close()
            agent.stop()


if __name__ == "__main__":
    main()
