"""Benchmark the node agent: scrape latency and RSS of a fake 8-GPU agent on 127.0.0.1.

Input: flags (scrapes, GPUs, model). Output: a table of p50/p99 scrape latency over N HTTP
scrapes (after warm-up), exposition size and the server process RSS (psutil), with the
ratio to the goals (<= 5 ms per scrape, <= 40 MB RSS). Starts ``fleetyield-agent serve``
in a subprocess with a temporary state dir and stops it with SIGTERM.
"""

from __future__ import annotations

import http.client
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import psutil

GOAL_SCRAPE_MS = 5.0
GOAL_RSS_MB = 40.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int, deadline_s: float = 15.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return time.monotonic() - t0
        except OSError:
            time.sleep(0.01)
    raise SystemExit(f"agent did not come up on port {port} within {deadline_s}s")


@click.command()
@click.option("--scrapes", default=500, show_default=True)
@click.option("--gpus", default=8, show_default=True)
@click.option("--model", default="h100", show_default=True)
@click.option(
    "--backend",
    type=click.Choice(["fake", "nvml"]),
    default="fake",
    show_default=True,
    help="nvml: this machine's GPUs (needs the NVIDIA driver); --gpus/--model then unused.",
)
def main(scrapes: int, gpus: int, model: str, backend: str) -> None:
    """Run the benchmark and print the table."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-c",
            "from node_agent.cli import main; main()",
            "serve",
            "--backend",
            backend,
            "--listen",
            "127.0.0.1",
            "--port",
            str(port),
            "--state-dir",
            str(Path(tmp) / "state"),
            "--hostname",
            "bench-node",
        ]
        if backend == "fake":
            cmd += ["--gpus", str(gpus), "--model", model]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        try:
            startup_s = _wait_ready(port)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            lat: list[float] = []
            size = 0
            for i in range(scrapes + 20):
                t0 = time.perf_counter()
                conn.request("GET", "/metrics")
                body = conn.getresponse().read()
                dt = (time.perf_counter() - t0) * 1000
                if i >= 20:
                    lat.append(dt)
                size = len(body)
            rss_mb = psutil.Process(proc.pid).memory_info().rss / 2**20
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    lat.sort()
    p50 = statistics.median(lat)
    p99 = lat[int(len(lat) * 0.99) - 1]
    rows = [
        ("scrape p50 (ms)", f"{p50:.2f}", f"{GOAL_SCRAPE_MS:.0f}", f"{p50 / GOAL_SCRAPE_MS:.2f}"),
        ("scrape p99 (ms)", f"{p99:.2f}", f"{GOAL_SCRAPE_MS:.0f}", f"{p99 / GOAL_SCRAPE_MS:.2f}"),
        ("agent RSS (MB)", f"{rss_mb:.1f}", f"{GOAL_RSS_MB:.0f}", f"{rss_mb / GOAL_RSS_MB:.2f}"),
        ("startup to ready (s)", f"{startup_s:.2f}", "-", "-"),
        ("exposition size (bytes)", str(size), "-", "-"),
    ]
    what = f"fake {model} x{gpus}" if backend == "fake" else "nvml (this machine's GPUs)"
    click.echo(f"{what}, {scrapes} scrapes over one keep-alive connection on 127.0.0.1")
    click.echo(f"| {'metric':<24} | {'measured':>9} | {'goal':>5} | {'ratio':>5} |")
    click.echo(f"|{'-' * 26}|{'-' * 11}|{'-' * 7}|{'-' * 7}|")
    for name, measured, goal, ratio in rows:
        click.echo(f"| {name:<24} | {measured:>9} | {goal:>5} | {ratio:>5} |")


if __name__ == "__main__":
    main()
