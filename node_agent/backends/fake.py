"""Fake GPU backend: N GPUs of one model, deterministic under a seed, persisted in the state dir.

Input: state dir, node name, GPU count/model/seed and a clock. Output: ``GpuSample``s whose
values are a pure function of (seed, GPU index, persisted state, ``now``), so the same
seed and the same virtual times give the same metrics; fault injection / clearing / GPU
reset mutate ``STATE_DIR/fake_state.json`` under the state lock and return the
``AgentEvent``s they cause. Restarts keep the state (faults, counters, XID history).
"""

from __future__ import annotations

import hashlib
import threading
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path

from node_agent import state as st
from node_agent.backends.base import Backend, BackendError, GpuInfo, GpuSample
from node_agent.faults import RECOVERY_ACTIONS, CorruptFault, DegradeFault, XidFault, xid_text
from node_agent.gpu_models import GpuModel, get_model
from node_agent.protocol import AgentEvent

FAKE_DRIVER_VERSION = "550.90.07"
HGX_BUS_IDS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
XID_LOG_MAX = 1000
THROTTLE_THERMAL_BITS = 0x8 | 0x20 | 0x40  # HW slowdown | SW thermal | HW thermal
THROTTLE_ONSET_C = 5.0
GSP_XIDS = frozenset({119, 120})
FB_RESERVED_FRACTION = 0.0067  # H100 80GB: nvidia-smi shows ~551 MiB reserved of 81559
PCIE_BYTES_PER_S = 50e9  # PCIe Gen5 x16, one direction

Spec = XidFault | DegradeFault | CorruptFault


def fake_uuid(seed: int, hostname: str, index: int) -> str:
    h = hashlib.sha256(f"{seed}:{hostname}:{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def fake_pci_bus_id(index: int) -> str:
    bus = HGX_BUS_IDS[index] if index < len(HGX_BUS_IDS) else 0xE0 + index
    return f"00000000:{bus:02X}:00.0"


class FakeBackend(Backend):
    name = "fake"

    def __init__(
        self,
        state_dir: Path,
        node: str,
        gpus: int = 8,
        model: str = "h100",
        seed: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        if not 1 <= gpus <= 64:
            raise BackendError(f"--gpus must be between 1 and 64, got {gpus}")
        self.state_dir = Path(state_dir)
        self.node = node
        self.gpus = gpus
        self.model: GpuModel = get_model(model)
        self.seed = seed
        self._clock = clock
        self.state: st.FakeState | None = None
        self.in_transaction = False  # caller already holds the state lock
        self.stall: threading.Event | None = None
        """Tests: while set to an unset Event, ``sample`` and ``reset_gpu`` block on it (a hung NVML call)."""

    # ---------------------------------------------------------------- lifecycle
    def start(self, now: float | None = None) -> None:
        with st.locked(self.state_dir):
            self.state = self._load_or_create(now)

    def _load_or_create(self, now: float | None) -> st.FakeState:
        existing = st.load(self.state_dir)
        if existing is not None:
            want = (self.model.key, self.gpus, self.seed, self.node)
            have = (existing.model, len(existing.gpus), existing.seed, existing.hostname)
            if want != have:
                raise BackendError(
                    f"state dir {self.state_dir} holds a fake node (model, gpus, seed, hostname)={have}, "
                    f"but the flags ask for {want}; use matching flags or another --state-dir"
                )
            return existing
        boot = now if now is not None else (self._clock() if self._clock else 0.0)
        state = st.FakeState(
            model=self.model.key,
            seed=self.seed,
            hostname=self.node,
            boot_time=boot,
            driver_version=FAKE_DRIVER_VERSION,
            gpus=[
                st.GpuState(index=i, uuid=fake_uuid(self.seed, self.node, i), pci_bus_id=fake_pci_bus_id(i))
                for i in range(self.gpus)
            ],
        )
        st.save(self.state_dir, state)
        return state

    def _st(self) -> st.FakeState:
        if self.state is None:
            raise BackendError("fake backend not started")
        return self.state

    def _save(self) -> None:
        if self.in_transaction:
            st.save(self.state_dir, self._st())
            return
        with st.locked(self.state_dir):
            st.save(self.state_dir, self._st())

    def driver_version(self) -> str:
        return self._st().driver_version

    def expected_gpus(self) -> int:
        return len(self._st().gpus)

    def _gpu(self, index: int) -> st.GpuState:
        gpus = self._st().gpus
        if not 0 <= index < len(gpus):
            raise BackendError(f"no GPU {index}: this node has GPUs 0..{len(gpus) - 1}")
        return gpus[index]

    def infos(self) -> list[GpuInfo]:
        return [self.info(g) for g in self._st().gpus]

    def info(self, g: st.GpuState) -> GpuInfo:
        return GpuInfo(g.index, g.uuid, g.pci_bus_id, f"nvidia{g.index}", self.model.name)

    @staticmethod
    def is_missing(g: st.GpuState) -> bool:
        return any(isinstance(f.spec, XidFault) and f.spec.xid == 79 for f in g.faults)

    @staticmethod
    def is_corrupt(g: st.GpuState) -> bool:
        return any(isinstance(f.spec, CorruptFault) for f in g.faults)

    # ---------------------------------------------------------------- faults
    def validate(self, spec: Spec) -> None:
        self._gpu(spec.gpu)
        if isinstance(spec, DegradeFault) and spec.mode == "nvlink_crc" and self.model.nvlinks == 0:
            raise BackendError(f"GPU model {self.model.key} has no NVLinks: cannot degrade nvlink_crc")

    def inject(self, spec: Spec, now: float) -> tuple[st.ActiveFault, list[AgentEvent]]:
        """Apply ``spec`` (validated first: a bad spec changes nothing) and persist."""
        self.validate(spec)
        g = self._gpu(spec.gpu)
        fault = st.ActiveFault(fault_id=uuidlib.uuid4().hex[:12], started_at=now, spec=spec)
        events: list[AgentEvent] = []
        if isinstance(spec, XidFault):
            self._apply_xid(g, spec.xid)
            g.last_xid = spec.xid
            g.xid_totals[str(spec.xid)] = g.xid_totals.get(str(spec.xid), 0) + 1
            g.xid_log.append((now, spec.xid))
            del g.xid_log[:-XID_LOG_MAX]
            events.append(
                self._event(g, now, "xid", spec.xid, spec.fatal, f"XID {spec.xid}: {xid_text(spec.xid)}")
            )
            if spec.xid == 79:
                events.append(self._event(g, now, "gpu_missing", None, True, "GPU fell off the bus (XID 79)"))
        fault.event_ids = [e.event_id for e in events]
        g.faults.append(fault)
        self._save()
        return fault, events

    def _event(
        self, g: st.GpuState, now: float, kind: str, xid: int | None, fatal: bool, msg: str
    ) -> AgentEvent:
        return AgentEvent(
            event_id=str(uuidlib.uuid4()),
            time=now,
            node=self.node,
            gpu=g.index,
            uuid=g.uuid,
            kind=kind,
            xid=xid,
            fatal=fatal,
            message=msg,  # type: ignore[arg-type]
        )

    def _apply_xid(self, g: st.GpuState, xid: int) -> None:
        c = g.counters
        remap = self.model.row_remapping

        def bump(key: str, by: float = 1) -> None:
            c[key] = c.get(key, 0) + by

        if xid in (48, 94, 95):
            bump("ecc_dbe_vol")
            bump("ecc_dbe_agg")
        if xid == 48:
            if remap:
                bump("remap_unc")
                c["remap_pending"] = 1
            else:
                bump("retired_dbe")
                c["retired_pending"] = 1
        elif xid == 95 and remap:
            c["remap_pending"] = 1
        elif xid == 63:
            if remap:
                bump("remap_cor")
                c["remap_pending"] = 1
            else:
                c["retired_pending"] = 1
        elif xid == 64:
            if remap:
                c["remap_failure"] = 1
            else:
                c["retired_pending"] = 1
        elif xid == 74:
            bump("nvlink_crc_flit", 100)
            bump("nvlink_crc_data", 25)
            bump("nvlink_replay", 10)
            bump("nvlink_recovery", 1)

    def list_faults(self, gpu: int | None = None) -> list[dict]:
        out = []
        for g in self._st().gpus:
            if gpu is not None and g.index != gpu:
                continue
            for f in g.faults:
                out.append(
                    {
                        "fault_id": f.fault_id,
                        "gpu": g.index,
                        "started_at": f.started_at,
                        "reset_fixes": f.spec.fixed_by_reset(),
                        "spec": f.spec.model_dump(mode="json"),
                    }
                )
        return out

    def clear(self, now: float, gpu: int | None = None, fault_id: str | None = None) -> list[st.ActiveFault]:
        """Remove faults by id, or all faults of ``gpu`` (all GPUs when both are None)."""
        if gpu is not None:
            self._gpu(gpu)
        removed: list[st.ActiveFault] = []
        for g in self._st().gpus:
            if gpu is not None and g.index != gpu:
                continue
            keep = []
            for f in g.faults:
                if fault_id is None or f.fault_id == fault_id:
                    self._bake(g, f, now, keep_volatile=True)
                    removed.append(f)
                else:
                    keep.append(f)
            g.faults = keep
        if fault_id is not None and not removed:
            raise BackendError(f"no active fault with id {fault_id!r}")
        self._save()
        return removed

    def _bake(self, g: st.GpuState, f: st.ActiveFault, now: float, keep_volatile: bool) -> None:
        """Fold a degradation's contribution into the persisted counters (counters never go back)."""
        if not isinstance(f.spec, DegradeFault):
            return
        keys = st.MONOTONIC_KEYS + (st.VOLATILE_KEYS if keep_volatile else ())
        for key, value in self._degrade(f, now).items():
            if key in keys:
                if key in ("remap_failure",):
                    g.counters[key] = max(g.counters.get(key, 0), value)
                else:
                    g.counters[key] = g.counters.get(key, 0) + value

    def _hang(self) -> None:
        stall = self.stall
        if stall is not None:
            stall.wait()

    def reset_gpu(self, index: int, now: float) -> list[AgentEvent]:
        self._hang()
        g = self._gpu(index)
        kept, cleared = [], []
        for f in g.faults:
            (cleared if f.spec.fixed_by_reset() else kept).append(f)
        for f in cleared:
            self._bake(g, f, now, keep_volatile=False)
        g.faults = kept
        for key in st.VOLATILE_KEYS + st.FLAG_KEYS:
            g.counters.pop(key, None)
        g.last_xid = 0
        g.resets.append(now)
        self._save()
        msg = f"GPU reset: cleared {len(cleared)} fault(s), {len(kept)} not fixable by reset remain"
        return [self._event(g, now, "gpu_reset", None, False, msg)]

    # ---------------------------------------------------------------- sampling
    def _u(self, index: int, key: str, bucket: int) -> float:
        h = hashlib.blake2b(f"{self.seed}|{index}|{key}|{bucket}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2**64

    def _degrade(self, f: st.ActiveFault, now: float) -> dict[str, float]:
        spec = f.spec
        assert isinstance(spec, DegradeFault)
        dt = max(0.0, now - f.started_at)
        if spec.mode == "nvlink_crc":
            n = int(spec.rate * dt)
            return {"nvlink_crc_flit": n, "nvlink_crc_data": n // 4}
        if spec.mode == "ecc":
            sbe = int(spec.rate * dt)
            rows = sbe // 10
            out: dict[str, float] = {"ecc_sbe_vol": sbe, "ecc_sbe_agg": sbe}
            if self.model.row_remapping:
                out["remap_cor"] = rows
                if rows >= spec.threshold:
                    out["remap_pending"] = 1
                if rows >= 2 * spec.threshold:
                    out["remap_failure"] = 1
                    out["fb_lost_mib"] = spec.capacity_loss_mib
            else:
                out["retired_sbe"] = rows
                if rows >= spec.threshold:
                    out["retired_pending"] = 1
                if rows >= 2 * spec.threshold:
                    out["fb_lost_mib"] = spec.capacity_loss_mib
            return out
        delta = min(spec.rate * dt, spec.max_delta_c)
        out = {"temp_delta": delta}
        onset = THROTTLE_ONSET_C / spec.rate
        if dt >= onset:
            out["throttle"] = 1
            out["thermal_violation_us"] = int((dt - onset) * 1e6)
        return out

    def _duty(self, index: int) -> float:
        """The GPU's own load level (25-35): its utilisation runs from here to 65 points above, so GPUs of
        one node differ in mean power and energy, as real ones under different jobs do."""
        return 25 + 10 * self._u(index, "duty", 0)

    def _profiling(self, index: int, bucket: int, util: int, m: GpuModel) -> dict[str, float]:
        """The five default DCP fields, tied to ``util``: the graphics engine is active a little less than
        NVML's utilisation says (that counts any kernel running), tensor pipes and DRAM a share of that, PCIe
        traffic a share of the link's ~50 GB/s (Gen5 x16) per direction."""
        busy = util / 100
        gr = busy * (0.85 + 0.15 * self._u(index, "gr", bucket))
        return {
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(gr, 6),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(gr * (0.2 + 0.5 * self._u(index, "tensor", bucket)), 6),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(gr * (0.3 + 0.5 * self._u(index, "dram", bucket)), 6),
            "DCGM_FI_PROF_PCIE_TX_BYTES": int(PCIE_BYTES_PER_S * busy * 0.2 * self._u(index, "tx", bucket)),
            "DCGM_FI_PROF_PCIE_RX_BYTES": int(PCIE_BYTES_PER_S * busy * 0.4 * self._u(index, "rx", bucket)),
        }

    def sample(self, now: float) -> list[GpuSample]:
        self._hang()
        s = self._st()
        m = self.model
        bucket = int(now // 5)
        elapsed = max(0.0, now - s.boot_time)
        out: list[GpuSample] = []
        for g in s.gpus:
            if self.is_missing(g):
                continue
            c: dict[str, float] = dict(g.counters)
            temp_delta = 0.0
            throttle = False
            for f in g.faults:
                if isinstance(f.spec, DegradeFault):
                    for key, value in self._degrade(f, now).items():
                        if key == "temp_delta":
                            temp_delta += value
                        elif key == "throttle":
                            throttle = True
                        elif key in ("remap_pending", "retired_pending", "remap_failure"):
                            c[key] = max(c.get(key, 0), value)
                        else:
                            c[key] = c.get(key, 0) + value
            gsp_dead = any(isinstance(f.spec, XidFault) and f.spec.xid in GSP_XIDS for f in g.faults)
            recovery = max(
                (RECOVERY_ACTIONS[f.spec.recovery_action] for f in g.faults if isinstance(f.spec, XidFault)),
                default=0,
            )
            duty = self._duty(g.index)
            util = 0 if gsp_dead else int(duty + 65 * self._u(g.index, "util", bucket))
            sm_clock = int(m.sm_clock_max_mhz * (0.85 + 0.15 * self._u(g.index, "sm", bucket)))
            if throttle:
                sm_clock = int(sm_clock * 0.7)
            temp = int(32 + util * 0.35 + 3 * self._u(g.index, "temp", bucket) + temp_delta)
            power = round(m.power_idle_w + (m.power_max_w - m.power_idle_w) * util / 100, 3)
            fb_total = m.fb_total_mib - int(c.get("fb_lost_mib", 0))
            fb_reserved = int(m.fb_total_mib * FB_RESERVED_FRACTION)  # driver/firmware carve-out
            fb_used = int((fb_total - fb_reserved) * (0.05 + 0.85 * self._u(g.index, "fb", bucket)))
            # mean power over the GPU's life: idle plus its duty's share of the dynamic range (the mean of
            # ``util`` is duty + 32.5), so the energy counter grows at this GPU's own average draw
            mean_power = m.power_idle_w + (m.power_max_w - m.power_idle_w) * (duty + 32.5) / 100
            v: dict[str, float] = {
                "DCGM_FI_DEV_SM_CLOCK": sm_clock,
                "DCGM_FI_DEV_MEM_CLOCK": m.mem_clock_mhz,
                "DCGM_FI_DEV_GPU_TEMP": temp,
                "DCGM_FI_DEV_POWER_USAGE": power,
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": int(mean_power * elapsed * 1000),
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": int(c.get("pcie_replay", 0)),
                "DCGM_FI_DEV_GPU_UTIL": util,
                "DCGM_FI_DEV_MEM_COPY_UTIL": int(util * 0.4),
                "DCGM_FI_DEV_ENC_UTIL": 0,
                "DCGM_FI_DEV_DEC_UTIL": 0,
                "DCGM_FI_DEV_XID_ERRORS": g.last_xid,
                "DCGM_FI_DEV_FB_FREE": fb_total - fb_reserved - fb_used,
                "DCGM_FI_DEV_FB_USED": fb_used,
                "DCGM_FI_DEV_FB_RESERVED": fb_reserved,
                "DCGM_FI_DEV_FB_TOTAL": fb_total,
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": int(c.get("ecc_sbe_vol", 0)),
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": int(c.get("ecc_dbe_vol", 0)),
                "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": int(c.get("ecc_sbe_agg", 0)),
                "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": int(c.get("ecc_dbe_agg", 0)),
                "DCGM_FI_DEV_POWER_VIOLATION": int(c.get("power_violation_us", 0)) * 1000,  # ns
                "DCGM_FI_DEV_THERMAL_VIOLATION": int(c.get("thermal_violation_us", 0)) * 1000,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": THROTTLE_THERMAL_BITS if throttle else 0,
                "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
                "DCGM_FI_DEV_GPU_RECOVERY_ACTION": recovery,
            }
            v.update(self._profiling(g.index, bucket, util, m))
            if m.has_memory_temp:
                v["DCGM_FI_DEV_MEMORY_TEMP"] = temp + 6
            if m.row_remapping:
                v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = int(c.get("remap_unc", 0))
                v["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = int(c.get("remap_cor", 0))
                v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = int(c.get("remap_failure", 0))
                v["DCGM_FI_DEV_ROW_REMAP_PENDING"] = int(c.get("remap_pending", 0))
            else:
                v["DCGM_FI_DEV_RETIRED_SBE"] = int(c.get("retired_sbe", 0))
                v["DCGM_FI_DEV_RETIRED_DBE"] = int(c.get("retired_dbe", 0))
                v["DCGM_FI_DEV_RETIRED_PENDING"] = int(c.get("retired_pending", 0))
            if m.nvlinks:
                v["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] = int(c.get("nvlink_crc_flit", 0))
                v["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"] = int(c.get("nvlink_crc_data", 0))
                v["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] = int(c.get("nvlink_replay", 0))
                v["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"] = int(c.get("nvlink_recovery", 0))
                v["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = int(elapsed * m.nvlinks * 1000)
            out.append(
                GpuSample(
                    info=self.info(g),
                    values=v,
                    last_xid=g.last_xid,
                    xid_log=list(g.xid_log),
                    xid_totals={int(k): n for k, n in g.xid_totals.items()},
                )
            )
        return out
