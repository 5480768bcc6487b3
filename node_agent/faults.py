"""Fault specifications for the fake backend (pydantic models at the CLI/socket/scenario boundary).

Input: a JSON-like dict (from ``fleetyield-agent fault ...``, the control socket or a
scenario file). Output: a validated ``FaultSpec`` (``XidFault`` | ``DegradeFault`` |
``CorruptFault``) or a ``FaultSpecError`` with a clear message. Nothing is applied here.

``reset_fixes`` defaults (documented choice): true for every fault except quiet corruption
(``corrupt``: a reset does not fix bad silicon) and XID 64 (row-remap failure: the spare
rows are exhausted, the part needs an RMA). Any spec may override it explicitly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from node_agent.xid_catalog import fatal_xids, xid_text

__all__ = ["xid_text"]  # re-exported: the collector and the backends name it from here

NOT_RESET_FIXABLE_XIDS = frozenset({64})


class FaultSpecError(ValueError):
    """A fault spec or scenario file is invalid; the message says what and where."""


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: int = Field(ge=0, le=63)
    reset_fixes: bool | None = None
    note: str = ""

    def fixed_by_reset(self) -> bool:
        return True if self.reset_fixes is None else self.reset_fixes


RECOVERY_ACTIONS: dict[str, int] = {  # nvmlDeviceGpuRecoveryAction_t (nvml.h; DCGM field 1523 carries it)
    "none": 0,
    "gpu_reset": 1,
    "node_reboot": 2,
    "drain_p2p": 3,
    "drain_and_reset": 4,
}


class XidFault(_Base):
    kind: Literal["xid"] = "xid"
    xid: int = Field(ge=1, le=999)
    # What the driver asks for while the fault lasts (R570+ drivers report it; XID 154 announces a change):
    # the fake GPU reports it as DCGM_FI_DEV_GPU_RECOVERY_ACTION. Default none: no driver action requested.
    recovery_action: Literal["none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset"] = "none"

    def fixed_by_reset(self) -> bool:
        if self.reset_fixes is not None:
            return self.reset_fixes
        return self.xid not in NOT_RESET_FIXABLE_XIDS

    @property
    def fatal(self) -> bool:
        return self.xid in fatal_xids()


class DegradeFault(_Base):
    """Gradual degradation; ``rate`` is per second of (injected) clock time.

    * ``nvlink_crc``: NVLink CRC flit errors grow by ``rate``/s (data CRC by rate/4).
    * ``ecc``: correctable (SBE) ECC errors grow by ``rate``/s; every 10 SBEs remap one
      row (correctable remapped rows). At ``threshold`` remapped rows a remap is pending;
      at 2 x ``threshold`` remapping fails and ``capacity_loss_mib`` of HBM is lost
      (FB total shrinks).
    * ``thermal``: GPU temperature rises by ``rate`` C/s up to ``max_delta_c``; past +5 C the
      GPU throttles (throttle reason bits set, thermal violation time grows, SM clock drops).
    """

    kind: Literal["degrade"] = "degrade"
    mode: Literal["nvlink_crc", "ecc", "thermal"]
    rate: float = Field(gt=0, le=1e6)
    threshold: int = Field(default=64, ge=1)
    capacity_loss_mib: int = Field(default=1024, ge=0)
    max_delta_c: float = Field(default=20.0, gt=0, le=80)


class CorruptFault(_Base):
    """Quiet data corruption: no metric changes; only the active check finds it."""

    kind: Literal["corrupt"] = "corrupt"

    def fixed_by_reset(self) -> bool:
        return False if self.reset_fixes is None else self.reset_fixes


FaultSpec = Annotated[XidFault | DegradeFault | CorruptFault, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[XidFault | DegradeFault | CorruptFault] = TypeAdapter(FaultSpec)


def parse_fault(data: Any, where: str = "fault spec") -> XidFault | DegradeFault | CorruptFault:
    """Validate ``data`` into a fault spec or raise ``FaultSpecError``."""
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()
        )
        raise FaultSpecError(f"bad {where}: {problems}") from None
