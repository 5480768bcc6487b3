"""Host metrics collector (psutil), under the ``fleetyield_host_`` prefix.

Input: nothing but the host (psutil reads /proc). Output at each scrape: CPU percent
(since the previous scrape), memory total/available bytes, 1/5/15-minute load average.
psutil is imported lazily on the first scrape so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector


class HostCollector(Collector):
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        import os

        import psutil

        cpu = Metric(
            "fleetyield_host_cpu_percent", "Host CPU utilisation since the previous scrape (in %).", "gauge"
        )
        cpu.add_sample("fleetyield_host_cpu_percent", {}, psutil.cpu_percent(interval=None))
        yield cpu
        vm = psutil.virtual_memory()
        total = Metric("fleetyield_host_memory_total_bytes", "Host memory total (in bytes).", "gauge")
        total.add_sample("fleetyield_host_memory_total_bytes", {}, vm.total)
        yield total
        avail = Metric("fleetyield_host_memory_available_bytes", "Host memory available (in bytes).", "gauge")
        avail.add_sample("fleetyield_host_memory_available_bytes", {}, vm.available)
        yield avail
        load = Metric("fleetyield_host_load_average", "Host load average.", "gauge")
        for period, value in zip(("1m", "5m", "15m"), os.getloadavg(), strict=True):
            load.add_sample("fleetyield_host_load_average", {"period": period}, value)
        yield load
