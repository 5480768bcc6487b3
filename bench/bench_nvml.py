"""The real NVML backend on a real GPU: what it reads, what it costs, and what the controller makes of it.

Needs an NVIDIA driver (libnvidia-ml); exits 2 with a clear message without one. Input: flags (samples,
seconds of load, JSON path). Output (stdout, and the same as JSON with ``--json``):

1. The GPUs NVML enumerates (index, UUID, PCI bus id, model), the driver and the static fields read once
   at start (VBIOS, ECC/MIG/persistence modes), and whether the XID event thread is running.
2. Which of the agent's dcgm-exporter fields this GPU reports and which NVML answers NotSupported
   (omitted, as dcgm-exporter omits blanks).
3. ``NvmlBackend.sample()`` cost as the agent runs it (slow counters from the refresher thread, every
   ``--slow-interval`` s): p50/p99 ms per scrape over N samples, per GPU; and one ``refresh_slow()``.
4. The full exposition (``make_registry`` + the agent's ``exposition.render``: what ``/metrics``
   serves), parsed back by the controller's own ``parse_exposition`` and fed through one
   ``core.loop.tick`` (a fresh controller, the node IDLE in Slurm with ``Gres=gpu:<model>:N``): the
   tier, risk, features and weight it decides.
5. With ``--load-seconds S`` and PyTorch importable: the same fields idle and under a bf16 matrix-product
   load on GPU 0 (power, SM clock, utilisation, temperature, energy delta), showing the values are live.

Run: ``python bench/bench_nvml.py [--samples 200 --load-seconds 8 --json out.json]``.
"""

from __future__ import annotations

import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print(n)
"""

WATCH = (
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def _controller_view(text: str, node: str, model_key: str, gpus: int, now: float) -> dict[str, Any]:
    from slurm_fleetyield.adapters.scrape import parse_exposition
    from slurm_fleetyield.core.loop import tick
    from slurm_fleetyield.core.model import Observations, SlurmNode
    from slurm_fleetyield.core.params import Params
    from slurm_fleetyield.core.state import ControllerState

    sample = parse_exposition(text, node, now, expect_hostname=node)
    slurm = SlurmNode(node, frozenset({"IDLE"}), gpu_type=model_key, gpu_count=gpus)
    obs = Observations(time=now, slurm={node: slurm}, samples={node: sample})
    res = tick(ControllerState.empty(), obs, Params(), now, random.Random(0))
    d = res.nodes[node]
    return {
        "source": sample.source,
        "gpus_parsed": len(sample.gpus),
        "fields_parsed_gpu0": len(sample.gpus[0].fields) if sample.gpus else 0,
        "tier": str(d.tier.value if hasattr(d.tier, "value") else d.tier),
        "health": str(d.health.value if hasattr(d.health, "value") else d.health),
        "risk": d.risk,
        "features": list(d.features),
        "weight": d.weight,
        "reason": d.reason,
        "evidence": list(d.evidence)[:8],
        "plan_actions": len(res.plan.actions) if hasattr(res.plan, "actions") else None,
    }


@click.command()
@click.option("--samples", default=200, show_default=True, help="sample() calls timed.")
@click.option("--load-seconds", default=0.0, show_default=True, help="bf16 matmul load on GPU 0 (PyTorch).")
@click.option("--slow-interval", default=10.0, show_default=True, help="The agent's nvml_slow_interval_s.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--exposition",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the /metrics text here.",
)
def main(
    samples: int, load_seconds: float, slow_interval: float, json_path: Path | None, exposition: Path | None
) -> None:
    """Run the probe and print what it found."""
    from node_agent.agent import Agent
    from node_agent.backends.base import BackendError
    from node_agent.backends.nvml import NvmlBackend
    from node_agent.collector import DCGM_FIELDS
    from node_agent.config import AgentConfig
    from node_agent.exporter import make_registry
    from node_agent.exposition import render as render_exposition

    node = socket.gethostname()
    backend = NvmlBackend(node, slow_interval_s=slow_interval)
    try:
        backend.start()
    except BackendError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    out: dict[str, Any] = {"node": node, "driver": backend.driver_version()}
    try:
        infos = backend._infos
        out["gpus"] = [
            {
                "index": i.index,
                "uuid": i.uuid,
                "pci_bus_id": i.pci_bus_id,
                "device": i.device,
                "model": i.model_name,
                "static": backend.static.get(i.index, {}),
            }
            for i in infos
        ]
        out["xid_thread_alive"] = bool(backend._thread and backend._thread.is_alive())
        first = backend.sample(time.time())
        names = [f for f, _, _ in DCGM_FIELDS]
        present = sorted(set(first[0].values)) if first else []
        out["fields_present"] = [n for n in names if n in present]
        out["fields_absent"] = [n for n in names if n not in present]
        out["gpu0_values"] = dict(first[0].values) if first else {}

        lat = []
        for _ in range(samples):
            t0 = time.perf_counter()
            backend.sample(time.time())
            lat.append((time.perf_counter() - t0) * 1000)
        n_gpu = max(1, len(infos))
        slow = []
        for _ in range(20):
            t0 = time.perf_counter()
            backend.refresh_slow()
            slow.append((time.perf_counter() - t0) * 1000)
        out["refresh_slow_ms"] = {"n": 20, "p50": statistics.median(slow), "max": max(slow)}
        out["sample_ms"] = {
            "n": samples,
            "p50": statistics.median(lat),
            "p99": _pct(lat, 0.99),
            "max": max(lat),
            "p50_per_gpu": statistics.median(lat) / n_gpu,
        }

        with tempfile.TemporaryDirectory() as tmp:
            cfg = AgentConfig(backend="nvml", state_dir=Path(tmp), hostname=node)
            agent = Agent(backend, Path(tmp), node, time.time)
            registry = make_registry(agent, cfg)
            render = []
            for _ in range(20):
                t0 = time.perf_counter()
                text = render_exposition(registry).decode()
                render.append((time.perf_counter() - t0) * 1000)
            out["exposition"] = {
                "bytes": len(text),
                "lines": text.count("\n"),
                "render_p50_ms": statistics.median(render),
            }
            if exposition is not None:
                exposition.write_text(text)
            model = infos[0].model_name.lower() if infos else ""
            key = next((k for k in ("h200", "h100", "b200", "a100", "l40s") if k in model), "gpu")
            out["controller"] = _controller_view(text, node, key, len(infos), time.time())

        if load_seconds > 0:
            out["load"] = _under_load(backend, load_seconds)
    finally:
        backend.stop()

    click.echo(json.dumps(out, indent=2, sort_keys=True, default=str))
    if json_path is not None:
        json_path.write_text(json.dumps(out, indent=2, sort_keys=True, default=str))


def _under_load(backend: Any, seconds: float) -> dict[str, Any]:
    def snap() -> dict[str, float]:
        backend.refresh_slow()  # live energy for the load series
        s = backend.sample(time.time())
        return {k: s[0].values.get(k) for k in WATCH} if s else {}

    idle = snap()
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    series = []
    t0 = time.time()
    while proc.poll() is None and time.time() - t0 < seconds + 60:
        series.append({"t": round(time.time() - t0, 2), **snap()})
        time.sleep(0.5)
    stdout, stderr = proc.communicate(timeout=30)
    after = snap()
    loaded = [r for r in series if (r.get("DCGM_FI_DEV_GPU_UTIL") or 0) > 50]
    peak = {k: max((r.get(k) or 0) for r in series) for k in WATCH} if series else {}
    return {
        "rc": proc.returncode,
        "matmuls": stdout.strip(),
        "stderr_tail": stderr.strip()[-400:],
        "idle": idle,
        "peak": peak,
        "after": after,
        "samples": len(series),
        "samples_util_over_50": len(loaded),
        "energy_delta_mj": (after.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") or 0)
        - (idle.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") or 0),
        "series": series[:: max(1, len(series) // 12)],
    }


if __name__ == "__main__":
    main()
