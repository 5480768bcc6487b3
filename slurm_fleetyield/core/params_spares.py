"""Parameters of hot spares (core/spares.py); core/params.py gathers them into ``Params``.

Every default states where it comes from; the two ASSUMPTIONs are swept in the simulator.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from slurm_fleetyield.core.params_base import _FROZEN


class SpareParams(BaseModel):
    """Hot spares (core/spares.py): green nodes held empty of ordinary work for gangs that lose a node."""

    model_config = _FROZEN

    enabled: bool = Field(
        False,
        description="Hold hot spares: nodes carrying fy_spare, fy_ok_gang and fy_ok_preempt but no class "
        "feature, sized by the expected gang GPU-seconds a spare saves against those it stands idle. "
        "false: no fy_spare, fy_ok_gang or fy_ok_preempt feature anywhere (outputs as without this section).",
    )
    gang_min_nodes: int = Field(2, ge=2, description="A job of at least this many nodes is a gang.")
    min: int = Field(0, ge=0, description="Admin floor on spares while any gang runs or pends.")
    restart_wait_s: float = Field(
        3_600.0,
        gt=0,
        description="ASSUMPTION (swept in the simulator): how long a requeued gang waits for busy nodes when "
        "no spare is free; what each spare saves the gang it serves.",
    )
    refill_s: float = Field(
        14_400.0,
        gt=0,
        description="ASSUMPTION (swept in the simulator): how long a newly designated spare takes to empty "
        "(and to be replaced once used); the window the gang faults are counted over and what a spare stands "
        "idle for.",
    )
    max_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="At most this share of the managed nodes are spares (and spares plus stake-withheld GPUs "
        "never exceed stake.withhold_cap_fraction of the in-service GPUs).",
    )
    preemptible_qos: str = Field(
        "fy_preemptible",
        min_length=1,
        description="Slurm QOS whose jobs a gang may evict from a spare (PreemptMode=REQUEUE): their GPUs do "
        "not count as busy when spares are chosen.",
    )
