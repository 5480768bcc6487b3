"""The synthetic fleet the tick benchmarks share (``bench_reconcile.py``, ``bench_render.py``).

Input: node names ``h<index>`` (8x H100) and ``l<index>`` (8x L40S), and the time of the sample. Output:
``NodeSample``s of DCGM fields, deterministic by node index: healthy, except 1% remap pending, 1% with an
uncorrectable remapped row, 0.4% remap failure and 0.2% not answering, so the feature-write path sees
realistic distinct groups.
"""

from __future__ import annotations

from slurm_fleetyield.core.model import GpuReading, NodeSample

H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"


def sim_nodes(count: int) -> list[tuple[str, int, str, tuple[str, ...]]]:
    """``SimSlurm`` node specs: the first half ``h00001..`` (h100, nvlink), the rest ``l00001..`` (l40s)."""
    half = count // 2
    return [(f"h{i:05d}", 8, "h100", ("h100", "nvlink")) for i in range(1, half + 1)] + [
        (f"l{i:05d}", 8, "l40s", ("l40s",)) for i in range(1, count - half + 1)
    ]


class SyntheticSense:
    """The sense port over 8 GPUs a node (80k GPUs for 10k nodes)."""

    def sample(self, nodes, now):
        out = {}
        for name in nodes:
            i = int(name[1:])
            if i % 500 == 11:
                out[name] = NodeSample(name, now, error="connection failed: refused")
                continue
            model = H100 if name[0] == "h" else L40S
            gpus = []
            for g in range(8):
                f = {
                    "DCGM_FI_DEV_GPU_TEMP": 40.0 + g,
                    "DCGM_FI_DEV_FB_TOTAL": 81559.0 if model == H100 else 46068.0,
                }
                if g == 0 and i % 100 == 7:
                    f["DCGM_FI_DEV_ROW_REMAP_PENDING"] = 1.0
                if g == 1 and i % 100 == 13:
                    f["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = 1.0
                if g == 2 and i % 250 == 3:
                    f["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = 1.0
                gpus.append(GpuReading(g, f"GPU-{name}-{g}", model, fields=f))
            out[name] = NodeSample(name, now, tuple(gpus), expected_gpus=8)
        return out
