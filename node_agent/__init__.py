"""FleetYield node agent: a dcgm-exporter-compatible GPU exporter with fault injection.

Input: a GPU backend (real NVML or a seeded fake). Output: Prometheus metrics on
``:9400/metrics``, a pending-fatal-events marker file for the Slurm prolog, and signed
fatal-event pushes to the controller. Nothing here does work at import time.
"""

from node_agent.version import __version__

__all__ = ["__version__"]
