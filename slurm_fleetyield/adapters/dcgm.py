"""What both sense paths know about DCGM telemetry (``scrape``: one node's exposition, ``prometheus``:
fleet-wide queries), so that they build the same ``NodeSample``s.

Input: series values and labels, as either path reads them. Output: the metric names both read, ``is_blank``
(DCGM's "no value" sentinels), ``GpuSeries`` (one GPU's series folded: identity labels, fields, XID counts)
and ``readings`` (a node's ``GpuReading``s: XID totals from our agent's exact counter when the node runs
the agent, else dcgm-exporter's windowed count, a lower bound).

This module imports no other adapter: both paths use it without reaching each other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.model import GpuReading

AGENT_XID_COUNTER = "fleetyield_gpu_xid_errors_total"
"""Our agent's monotonic per-(GPU, XID) counter: exact cumulative counts."""
EXPORTER_XID_WINDOW = "DCGM_EXP_XID_ERRORS_COUNT"
"""dcgm-exporter's windowed per-(GPU, XID) count: a lower bound of the cumulative count."""
AGENT_GPUS_EXPECTED = "fleetyield_agent_gpus_expected"

# DCGM writes "no value" as sentinels near the top of the int32/int64 range (DCGM_INT32_BLANK 0x7ffffff0,
# DCGM_INT64_BLANK 0x7ffffffffffffff0, up to ..._NOT_SUPPORTED/_NOT_PERMISSIONED just above).
_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
_INT32_BLANK = (float(0x7FFFFFF0), float(0x7FFFFFFF))


def is_blank(value: float, gauge: bool) -> bool:
    """Whether ``value`` is DCGM's "no value": NaN or an int64 sentinel; with ``gauge``, an int32 one too
    (only on gauges: a cumulative counter may legitimately pass through 2^31)."""
    if math.isnan(value) or value >= _INT64_BLANK:
        return True
    return gauge and _INT32_BLANK[0] <= value <= _INT32_BLANK[1]


@dataclass
class GpuSeries:
    """One GPU's series, folded as they are read."""

    index: int
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    hostname: str = ""
    fields: dict[str, float] = field(default_factory=dict)
    agent_xids: dict[int, float] = field(default_factory=dict)
    window_xids: dict[int, float] = field(default_factory=dict)

    def identify(self, labels: Mapping[str, str]) -> None:
        """UUID, model and PCI bus id from a series' labels (the first series that has one wins)."""
        self.uuid = self.uuid or labels.get("UUID", "")
        self.model = self.model or labels.get("modelName", "")
        self.pci_bus_id = self.pci_bus_id or labels.get("pci_bus_id", "")

    def count_xid(self, family: str, code: int, value: float) -> None:
        """Add a per-XID count of ``family`` (``AGENT_XID_COUNTER`` or ``EXPORTER_XID_WINDOW``)."""
        target = self.agent_xids if family == AGENT_XID_COUNTER else self.window_xids
        target[code] = target.get(code, 0.0) + value


def readings(gpus: Iterable[GpuSeries], agent: bool) -> tuple[GpuReading, ...]:
    """The node's readings by GPU index; XID totals from the agent's counter when ``agent`` (the node
    runs our agent) or any GPU has it, else from dcgm-exporter's window."""
    ordered = sorted(gpus, key=lambda g: g.index)
    use_agent = agent or any(g.agent_xids for g in ordered)
    return tuple(
        GpuReading(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            pci_bus_id=g.pci_bus_id,
            fields=g.fields,
            xid_totals=dict(g.agent_xids if use_agent else g.window_xids),
        )
        for g in ordered
    )
