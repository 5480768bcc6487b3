"""Prometheus text exposition (format 0.0.4) of a CollectorRegistry, dcgm-exporter style.

Input: a ``CollectorRegistry``. Output: bytes. Unlike ``prometheus_client.generate_latest``
it does not append ``_total`` to counter names in HELP/TYPE lines (dcgm-exporter's
counters such as ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` have no suffix) and prints
integral values without a trailing ``.0``, as dcgm-exporter does.
"""

from __future__ import annotations

import math

from prometheus_client.registry import CollectorRegistry

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render(registry: CollectorRegistry) -> bytes:
    lines: list[str] = []
    for metric in registry.collect():
        name = metric.name
        if metric.type == "counter" and metric.samples and metric.samples[0].name == name + "_total":
            name += "_total"
        lines.append(f"# HELP {name} {_escape_help(metric.documentation)}")
        lines.append(f"# TYPE {name} {metric.type}")
        for s in metric.samples:
            if s.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in s.labels.items())
                lines.append(f"{s.name}{{{labels}}} {_fmt(s.value)}")
            else:
                lines.append(f"{s.name} {_fmt(s.value)}")
    lines.append("")
    return "\n".join(lines).encode()
