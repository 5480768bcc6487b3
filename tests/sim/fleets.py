"""The fault-heavy synthetic fleet the sim tests record from (precursor episodes, fatal faults within days).

``fault_heavy(nodes=, days=, seed=, ...)``: a ``Simulation`` of the ``fleetyield`` policy on that fleet; any
``make_config`` option overrides the defaults.
"""

from __future__ import annotations

from typing import Any

from slurm_fleetyield.sim import runner

FAULT_HEAVY: dict[str, Any] = dict(
    workload="synthetic",
    node_rate_per_1000_node_days=400.0,
    precursor_share=0.5,
    lead_h=6.0,
    control_interval_s=1800.0,
)


def fault_heavy(policy: str = "fleetyield", **options: Any) -> runner.Simulation:
    cfg = runner.make_config(**{**FAULT_HEAVY, **options})
    return runner.Simulation(cfg, policy, runner.build_inputs(cfg))
