"""Persisted fake-backend state (``STATE_DIR/fake_state.json``) with an advisory file lock.

Input: a state directory. Output: ``FakeState`` loaded/saved atomically (temp file +
rename) while holding ``STATE_DIR/state.lock`` (``fcntl.flock``), so the running server and
an offline ``fleetyield-agent fault ...`` never interleave writes. Also ``serve_lock``:
the exclusive lock the server holds for its lifetime (how the CLI knows one is running).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from node_agent.faults import CorruptFault, DegradeFault, XidFault

STATE_FILE = "fake_state.json"
LOCK_FILE = "state.lock"
SERVE_LOCK_FILE = "serve.lock"

MONOTONIC_KEYS = (
    "ecc_sbe_agg",
    "ecc_dbe_agg",
    "retired_sbe",
    "retired_dbe",
    "remap_cor",
    "remap_unc",
    "nvlink_crc_flit",
    "nvlink_crc_data",
    "nvlink_replay",
    "nvlink_recovery",
    "pcie_replay",
    "thermal_violation_us",
    "power_violation_us",
    "fb_lost_mib",
    "remap_failure",
)
VOLATILE_KEYS = ("ecc_sbe_vol", "ecc_dbe_vol")
FLAG_KEYS = ("remap_pending", "retired_pending")


class ActiveFault(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fault_id: str
    started_at: float
    spec: XidFault | DegradeFault | CorruptFault = Field(discriminator="kind")
    event_ids: list[str] = Field(default_factory=list)


class GpuState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int
    uuid: str
    pci_bus_id: str
    counters: dict[str, float] = Field(default_factory=dict)
    last_xid: int = 0
    xid_totals: dict[str, int] = Field(default_factory=dict)
    xid_log: list[tuple[float, int]] = Field(default_factory=list)
    faults: list[ActiveFault] = Field(default_factory=list)
    resets: list[float] = Field(default_factory=list)


class ScenarioProgress(BaseModel):
    started_at: float
    applied: int = 0


class FakeState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    model: str
    seed: int
    hostname: str
    boot_time: float
    driver_version: str
    gpus: list[GpuState]
    scenarios: dict[str, ScenarioProgress] = Field(default_factory=dict)


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold the state lock (blocking) for the duration of the block."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def load(state_dir: Path) -> FakeState | None:
    path = state_dir / STATE_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return FakeState.model_validate_json(raw)


def save(state_dir: Path, state: FakeState) -> None:
    write_atomic(state_dir / STATE_FILE, state.model_dump_json(indent=1).encode())


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ServeLock:
    """Exclusive lifetime lock of a running server on ``STATE_DIR/serve.lock``."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / SERVE_LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> bool:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def server_running(state_dir: Path) -> bool:
    """True when some process holds the serve lock of ``state_dir``."""
    lock = ServeLock(state_dir)
    if lock.acquire():
        lock.release()
        return False
    return True


def as_jsonable(obj: Any) -> Any:
    return obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
