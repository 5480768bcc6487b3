"""What each NVML call inside ``NvmlBackend.sample()`` costs on this machine's GPUs, and whether the batched
field-value API reads the slow counters cheaper than their own calls (same values, less time).

Needs the NVIDIA driver. Output: ms per ``sample()``, ms per call (sorted), then for each slow counter the
direct call vs ``nvmlDeviceGetFieldValues`` (alone and batched with the others) with both values, and the
process RSS before and after ``nvmlInit``. Run: ``python bench/bench_nvml_calls.py [--reps 100]``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

import click
import psutil


def _rss() -> float:
    return psutil.Process().memory_info().rss / 2**20


def _time(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    value = fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1000 / reps, value


def _field(nv: Any, fv: Any) -> Any:
    if fv.nvmlReturn != nv.NVML_SUCCESS:
        return f"error {fv.nvmlReturn}"
    return {
        nv.NVML_VALUE_TYPE_DOUBLE: fv.value.dVal,
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: fv.value.uiVal,
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: fv.value.ulVal,
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: fv.value.sllVal,
    }.get(fv.valueType, fv.value.ullVal)


@click.command()
@click.option("--reps", default=100, show_default=True)
def main(reps: int) -> None:
    """Run and print."""
    import pynvml as nv

    from node_agent.backends.nvml import NvmlBackend

    click.echo(f"RSS before nvmlInit (python + pynvml + agent backend + psutil): {_rss():.1f} MB")
    cost: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()

    class Timed:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(nv, name)
            if not callable(attr) or isinstance(attr, type) or not name.startswith("nvml"):
                return attr

            def wrapped(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return attr(*a, **k)
                finally:
                    cost[name] += time.perf_counter() - t0
                    calls[name] += 1

            return wrapped

    b = NvmlBackend("gpu-node", nvml=Timed())
    b.start()
    click.echo(f"RSS after nvmlInit + handles + XID event set: {_rss():.1f} MB")
    cost.clear()
    calls.clear()
    t0 = time.perf_counter()
    for _ in range(reps):
        b.sample(time.time())
    click.echo(f"sample(): {(time.perf_counter() - t0) * 1000 / reps:.2f} ms for {b.expected_gpus()} GPU(s)")
    for name, sec in sorted(cost.items(), key=lambda kv: -kv[1]):
        click.echo(f"  {name:46s} {sec * 1000 / reps:7.3f} ms  x{calls[name] / reps:g}")
    b.stop()

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    direct = {
        "TOTAL_ENERGY_CONSUMPTION": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "PCIE_REPLAY_COUNTER": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "PERF_POLICY_POWER": lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_POWER),
        "PERF_POLICY_THERMAL": lambda: nv.nvmlDeviceGetViolationStatus(h, nv.NVML_PERF_POLICY_THERMAL),
    }
    ids = {name: getattr(nv, f"NVML_FI_DEV_{name}") for name in direct}
    click.echo("GPU 0, direct call vs field-value API (ms per read; value):")
    for name, fn in direct.items():
        d_ms, d_val = _time(fn, reps)
        f_ms, f_vals = _time(lambda i=ids[name]: nv.nvmlDeviceGetFieldValues(h, [i]), reps)
        d_val = getattr(d_val, "violationTime", d_val)  # ns
        click.echo(f"  {name:26s} direct {d_ms:7.3f} ({d_val})  field {f_ms:7.3f} ({_field(nv, f_vals[0])})")
    all_ids = [*ids.values(), nv.NVML_FI_DEV_MEMORY_TEMP, nv.NVML_FI_DEV_ENERGY]
    b_ms, vals = _time(lambda: nv.nvmlDeviceGetFieldValues(h, all_ids), reps)
    click.echo(f"  all {len(all_ids)} in one call: {b_ms:.3f} ms: {[_field(nv, v) for v in vals]}")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
