from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_rig import Rig, make_rig

from node_agent import fatal
from node_agent.backends.base import BackendError
from node_agent.faults import FaultSpecError, parse_fault


def _inject(rig: Rig, **spec: object) -> dict:
    return rig.agent.inject(parse_fault(spec))


def _gpu_series(rig: Rig, gpu: int) -> list[tuple[str, dict]]:
    return [
        (f.name, s.labels)
        for f in rig.families().values()
        for s in f.samples
        if s.labels.get("gpu") == str(gpu)
    ]


def test_xid79_removes_only_that_gpu(rig: Rig) -> None:
    before_other = _gpu_series(rig, 1)
    _inject(rig, kind="xid", xid=79, gpu=2)
    assert _gpu_series(rig, 2) == []
    assert _gpu_series(rig, 1) == before_other
    fams = rig.families()
    assert fams["fleetyield_agent_gpus_visible"].samples[0].value == 3
    assert fams["fleetyield_agent_gpus_expected"].samples[0].value == 4
    kinds = {(p["kind"], p["gpu"]) for p in fatal.read_pending(rig.state_dir)}
    assert kinds == {("xid", 2), ("gpu_missing", 2)}


def test_xid48_bumps_dbe_and_remaps(rig: Rig) -> None:
    assert rig.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) == 0
    _inject(rig, kind="xid", xid=48, gpu=0)
    assert rig.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0) == 1
    assert rig.value("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 0) == 1
    assert rig.value("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 0) == 1
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_PENDING", 0) == 1
    assert rig.value("DCGM_FI_DEV_XID_ERRORS", 0, err_code="48", err_msg="Double Bit ECC Error") == 48
    assert rig.value("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1) == 0
    assert rig.value("fleetyield_gpu_xid_errors", 0, xid="48") == 1
    assert rig.value("DCGM_EXP_XID_ERRORS_COUNT", 0, xid="48") == 1


def test_xid48_on_page_retirement_model(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "s", gpus=1, model="l40s")
    _inject(rig, kind="xid", xid=48, gpu=0)
    assert rig.value("DCGM_FI_DEV_RETIRED_DBE", 0) == 1
    assert rig.value("DCGM_FI_DEV_RETIRED_PENDING", 0) == 1


def test_xid64_sets_remap_failure_and_survives_reset(rig: Rig) -> None:
    _inject(rig, kind="xid", xid=64, gpu=1)
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1) == 1
    rig.agent.reset(1)
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1) == 1
    assert [p["xid"] for p in fatal.read_pending(rig.state_dir)] == [64]
    assert len(rig.agent.list_faults(1)) == 1


def test_a_recovery_action_shows_while_its_fault_lasts(rig: Rig) -> None:
    assert rig.value("DCGM_FI_DEV_GPU_RECOVERY_ACTION", 2) == 0  # none requested
    _inject(rig, kind="xid", xid=154, gpu=2, recovery_action="gpu_reset")
    assert rig.value("DCGM_FI_DEV_GPU_RECOVERY_ACTION", 2) == 1
    assert rig.value("DCGM_FI_DEV_GPU_RECOVERY_ACTION", 1) == 0  # that GPU's only
    rig.agent.reset(2)  # the reset it asked for clears it
    assert rig.value("DCGM_FI_DEV_GPU_RECOVERY_ACTION", 2) == 0
    _inject(rig, kind="xid", xid=154, gpu=2, recovery_action="node_reboot", reset_fixes=False)
    rig.agent.reset(2)  # a reset is not what it asked for: still there
    assert rig.value("DCGM_FI_DEV_GPU_RECOVERY_ACTION", 2) == 2


def test_xid74_nvlink_counters_jump(rig: Rig) -> None:
    _inject(rig, kind="xid", xid=74, gpu=3)
    assert rig.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 3) > 0
    assert rig.value("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 3) > 0
    assert rig.value("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 3) == 1
    assert rig.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 2) == 0


def test_other_xid_only_records(rig: Rig) -> None:
    before = rig.text()
    _inject(rig, kind="xid", xid=13, gpu=0)
    assert rig.value("DCGM_FI_DEV_XID_ERRORS", 0) == 13
    assert rig.value("fleetyield_gpu_xid_errors", 0, xid="13") == 1
    assert fatal.read_pending(rig.state_dir) == []
    assert before != rig.text()


def test_xid_repeats_are_counted_and_window_expires(rig: Rig) -> None:
    for _ in range(3):
        _inject(rig, kind="xid", xid=31, gpu=0)
        rig.clock.advance(10)
    assert rig.value("fleetyield_gpu_xid_errors", 0, xid="31") == 3
    assert rig.value("DCGM_EXP_XID_ERRORS_COUNT", 0, xid="31") == 3
    rig.clock.advance(400)
    assert rig.value("DCGM_EXP_XID_ERRORS_COUNT", 0, xid="31") is None
    assert rig.value("DCGM_EXP_XID_ERRORS_COUNT", 0) == 0
    assert rig.value("fleetyield_gpu_xid_errors", 0, xid="31") == 3


def test_nvlink_degradation_grows_with_clock(rig: Rig) -> None:
    _inject(rig, kind="degrade", mode="nvlink_crc", rate=2.0, gpu=1)
    rig.clock.advance(10)
    assert rig.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1) == 20
    rig.clock.advance(10)
    assert rig.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 1) == 40
    assert rig.value("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 1) == 10


def test_ecc_degradation_ends_in_remap_failure_and_capacity_loss(rig: Rig) -> None:
    _inject(rig, kind="degrade", mode="ecc", rate=10.0, threshold=5, capacity_loss_mib=2048, gpu=0)
    rig.clock.advance(3)  # 30 SBE -> 3 rows
    assert rig.value("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0) == 30
    assert rig.value("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 0) == 3
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_PENDING", 0) == 0
    rig.clock.advance(3)  # 6 rows >= 5
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_PENDING", 0) == 1
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0) == 0
    assert rig.value("DCGM_FI_DEV_FB_TOTAL", 0) == 81559
    rig.clock.advance(5)  # 11 rows >= 10
    assert rig.value("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0) == 1
    assert rig.value("DCGM_FI_DEV_FB_TOTAL", 0) == 81559 - 2048


def test_thermal_degradation_throttles(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "a")
    healthy = make_rig(tmp_path / "b", clock=rig.clock)  # same seed: the baseline at the same times
    _inject(rig, kind="degrade", mode="thermal", rate=1.0, max_delta_c=15, gpu=2)
    rig.clock.advance(2)
    assert rig.value("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 2) == 0
    rig.clock.advance(20)
    assert rig.value("DCGM_FI_DEV_GPU_TEMP", 2) == healthy.value("DCGM_FI_DEV_GPU_TEMP", 2) + 15  # type: ignore[operator]
    assert rig.value("DCGM_FI_DEV_SM_CLOCK", 2) < healthy.value("DCGM_FI_DEV_SM_CLOCK", 2)  # type: ignore[operator]
    assert rig.value("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 2) == 0x68
    assert rig.value("DCGM_FI_DEV_THERMAL_VIOLATION", 2) == 17_000_000_000  # ns


def test_corruption_changes_no_metric_but_fails_check(rig: Rig) -> None:
    before = rig.text()
    _inject(rig, kind="corrupt", gpu=1)
    assert rig.text() == before
    report = rig.agent.check()
    assert not report.ok
    assert [r.status for r in report.results] == ["pass", "fail", "pass", "pass"]
    assert [p["kind"] for p in fatal.read_pending(rig.state_dir)] == ["check_failed"]
    rig.agent.reset(1)  # corruption is not fixed by a reset (documented default)
    assert not rig.agent.check(1).ok


def test_check_reports_missing_gpu(rig: Rig) -> None:
    _inject(rig, kind="xid", xid=79, gpu=0)
    assert rig.agent.check(0).results[0].status == "missing"


def test_reset_clears_reset_fixable_faults(rig: Rig) -> None:
    _inject(rig, kind="xid", xid=79, gpu=0)
    _inject(rig, kind="degrade", mode="ecc", rate=10.0, gpu=0)
    _inject(rig, kind="xid", xid=95, gpu=0, reset_fixes=False)
    rig.clock.advance(5)
    out = rig.agent.reset(0)
    assert out["fatal_entries_dropped"] == 2
    remaining = rig.agent.list_faults(0)
    assert [f["spec"]["xid"] for f in remaining] == [95]
    assert rig.value("DCGM_FI_DEV_GPU_TEMP", 0) is not None  # back on the bus
    assert rig.value("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0) == 0  # volatile counters reset
    assert rig.value("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 0) == 50  # aggregate kept, growth stopped
    rig.clock.advance(5)
    assert rig.value("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 0) == 50
    assert [p["xid"] for p in fatal.read_pending(rig.state_dir)] == [95]
    assert len(rig.backend.state.gpus[0].resets) == 1  # type: ignore[union-attr]


def test_state_survives_restart(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "s")
    _inject(rig, kind="xid", xid=79, gpu=3)
    _inject(rig, kind="degrade", mode="nvlink_crc", rate=1.0, gpu=0)
    rig.clock.advance(30)
    text = rig.text()
    again = make_rig(tmp_path / "s", clock=rig.clock)
    assert again.text() == text
    assert again.value("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0) == 30


def test_restart_with_other_flags_is_refused(tmp_path: Path) -> None:
    make_rig(tmp_path / "s", gpus=4)
    with pytest.raises(BackendError, match="use matching flags"):
        make_rig(tmp_path / "s", gpus=8)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "xid", "gpu": 0}, "xid: Field required"),
        ({"kind": "xid", "gpu": 0, "xid": 0}, "greater than or equal to 1"),
        ({"kind": "melt", "gpu": 0}, "does not match any of the expected tags"),
        ({"kind": "degrade", "gpu": 0, "mode": "ecc", "rate": -1}, "greater than 0"),
        ({"kind": "degrade", "gpu": 0, "mode": "sideways", "rate": 1}, "mode"),
        ({"kind": "corrupt", "gpu": 0, "bogus": 1}, "Extra inputs are not permitted"),
    ],
)
def test_bad_fault_specs_give_clear_errors_and_change_nothing(rig: Rig, spec: dict, message: str) -> None:
    before = (rig.state_dir / "fake_state.json").read_bytes()
    with pytest.raises(FaultSpecError, match=message):
        rig.agent.inject(parse_fault(spec))
    assert (rig.state_dir / "fake_state.json").read_bytes() == before


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "xid", "gpu": 9, "xid": 48}, "no GPU 9"),
        ({"kind": "degrade", "gpu": 0, "mode": "nvlink_crc", "rate": 1}, "no NVLinks"),
    ],
)
def test_inapplicable_specs_change_nothing(tmp_path: Path, spec: dict, message: str) -> None:
    rig = make_rig(tmp_path / "s", gpus=2, model="l40s")
    before = (rig.state_dir / "fake_state.json").read_bytes()
    with pytest.raises(BackendError, match=message):
        rig.agent.inject(parse_fault(spec))
    assert (rig.state_dir / "fake_state.json").read_bytes() == before
    assert not (rig.state_dir / "fatal.json").exists()
    assert json.loads(before)["gpus"][0]["faults"] == []


def test_an_xid_storm_is_one_event_with_a_count(rig: Rig) -> None:
    from node_agent.push import spooled

    def xid95_events() -> list[str]:
        return [e.event_id for _, e in spooled(rig.state_dir) if e.kind == "xid" and e.xid == 95]

    for _ in range(5):
        _inject(rig, kind="xid", xid=95, gpu=0)
        rig.clock.advance(10)
    _inject(rig, kind="xid", xid=95, gpu=1)  # another GPU: its own event
    assert len(xid95_events()) == 2
    assert [p["gpu"] for p in fatal.read_pending(rig.state_dir)] == [0, 1]
    assert rig.agent.folded[(0, 95)][1] == 4  # the count: four repeats of the first
    assert rig.value("fleetyield_gpu_xid_errors", 0, xid="95") == 5  # the scrape counts each one

    rig.clock.advance(300)  # past the window of the first: new evidence
    _inject(rig, kind="xid", xid=95, gpu=0)
    assert len(xid95_events()) == 3
    rig.agent.reset(0)  # after a reset the same XID is news at once
    _inject(rig, kind="xid", xid=95, gpu=0)
    assert len(xid95_events()) == 4
    assert rig.agent.folded[(0, 95)][1] == 0
