"""Constants and builders shared by the gate tests."""

from __future__ import annotations

from slurm_fleetyield.gate.proposal import Proposal

T0 = 1_700_000_000.0  # injected clock: every test runs at fixed, readable times
PID = "p-0123456789ab"
NODE = "gpu-017"


def make_proposal(**kw: object) -> Proposal:
    args: dict[str, object] = dict(
        id=PID,
        node=NODE,
        gpus=(3,),
        risk=0.82,
        evidence="GPU 3: 14 row-remap pending, XID 94 x2 in 1h; risk 0.82 > drain 0.75",
        affected_jobs=(101, 102),
        now=T0,
        ttl_s=3600,
    )
    args.update(kw)
    return Proposal.new(**args)  # type: ignore[arg-type]
