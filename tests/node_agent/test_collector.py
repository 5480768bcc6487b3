from __future__ import annotations

import re
from pathlib import Path

from agent_rig import Rig, make_rig
from prometheus_client.parser import text_string_to_metric_families

from node_agent.collector import DCGM_FIELDS

GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
EXPECTED_HELP = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since boot (in mJ)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
    ),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("counter", "Throttling duration due to thermal constraints (in ns)."),
    "DCGM_FI_DEV_POWER_VIOLATION": ("counter", "Throttling duration due to power constraints (in ns)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": (
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*)",
    ),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads "
        "- in bytes per second.",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads "
        "- in bytes per second.",
    ),
    "DCGM_EXP_XID_ERRORS_COUNT": (  # a gauge in dcgm-exporter's counters CSV (old and 4.x alike)
        "gauge",
        "Count of XID Errors within user-specified time window (see xid-count-window-size param).",
    ),
}


def _series_lines(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def _label_names(line: str) -> list[str]:
    return re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', line[line.index("{") : line.rindex("}")])


def test_help_and_type_lines_match_dcgm_exporter(rig: Rig) -> None:
    text = rig.text()
    for name, (mtype, help_text) in EXPECTED_HELP.items():
        assert f"# HELP {name} {help_text}\n# TYPE {name} {mtype}\n" in text, name


def test_every_gpu_series_has_dcgm_label_order(rig: Rig) -> None:
    text = rig.text()
    for name, _, _ in DCGM_FIELDS:
        for line in _series_lines(text, name):
            names = _label_names(line)
            assert names[:7] == GPU_LABELS, line
            if name == "DCGM_FI_DEV_XID_ERRORS":
                assert names[7:] == ["err_code", "err_msg"]
            else:
                assert names[7:] == []
    assert len(_series_lines(text, "DCGM_FI_DEV_GPU_TEMP")) == 4


def test_parsed_families_and_label_values(rig: Rig) -> None:
    fams = {f.name: f for f in text_string_to_metric_families(rig.text())}
    temp = fams["DCGM_FI_DEV_GPU_TEMP"]
    assert [s.labels["gpu"] for s in temp.samples] == ["0", "1", "2", "3"]
    s0 = temp.samples[0].labels
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", s0["UUID"])
    assert s0["pci_bus_id"] == "00000000:18:00.0"
    assert s0["device"] == "nvidia0"
    assert s0["modelName"] == "NVIDIA H100 80GB HBM3"
    assert s0["Hostname"] == "node-a"
    assert fams["DCGM_FI_DEV_FB_TOTAL"].samples[0].value == 81559
    assert fams["fleetyield_agent_gpus_expected"].samples[0].value == 4
    assert fams["fleetyield_agent_gpus_visible"].samples[0].value == 4
    assert fams["fleetyield_agent_info"].samples[0].labels == {"backend": "fake", "version": "0.1.0"}
    xc = fams["DCGM_EXP_XID_ERRORS_COUNT"].samples[0]
    assert list(xc.labels)[-1] == "window_size_in_ms" and xc.labels["window_size_in_ms"] == "300000"


def test_lowercase_hostname_and_hpc_job_mapping(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "1").write_text("1234\n5678\n")
    (jobs / "notagpu").write_text("99\n")
    rig = make_rig(tmp_path / "s", gpus=2, lowercase_hostname=True, job_mapping_dir=jobs)
    lines = _series_lines(rig.text(), "DCGM_FI_DEV_GPU_TEMP")
    assert _label_names(lines[0]) == [*GPU_LABELS[:5], "hostname", "DCGM_FI_DRIVER_VERSION"]
    gpu1 = [line for line in lines if 'gpu="1"' in line]
    assert [_label_names(line)[-1] for line in gpu1] == ["hpc_job", "hpc_job"]
    assert {re.search(r'hpc_job="(\d+)"', line).group(1) for line in gpu1} == {"1234", "5678"}  # type: ignore[union-attr]


def test_l40s_omits_unsupported_fields(tmp_path: Path) -> None:
    rig = make_rig(tmp_path / "s", gpus=1, model="l40s")
    fams = rig.families()
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in fams
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" not in fams
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" not in fams
    assert fams["DCGM_FI_DEV_RETIRED_DBE"].samples[0].value == 0
    assert fams["DCGM_FI_DEV_FB_TOTAL"].samples[0].value == 46068


PROF_FIELDS = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)


def test_fake_profiling_fields_follow_utilisation(rig: Rig) -> None:
    """The five default DCP fields on every fake GPU, in DCGM's units, and never busier than NVML says."""
    fams = rig.families()
    for name in PROF_FIELDS:
        assert len(fams[name].samples) == 4, name
    for t in range(0, 600, 5):  # many 5 s buckets: many utilisation draws
        for s in rig.backend.sample(1_700_000_000.0 + t):
            v = s.values
            util = v["DCGM_FI_DEV_GPU_UTIL"]
            gr, tensor, dram, tx, rx = (v[f] for f in PROF_FIELDS)
            assert 0 < gr <= util / 100 and 0 < tensor < gr and 0 < dram < gr
            assert 0 <= tx <= 50e9 * util / 100 and 0 <= rx <= 50e9 * util / 100


def test_gsp_dead_gpu_is_idle_in_profiling_too(rig: Rig) -> None:
    from node_agent.faults import parse_fault

    rig.agent.inject(parse_fault({"kind": "xid", "gpu": 1, "xid": 119}))
    assert rig.value("DCGM_FI_DEV_GPU_UTIL", 1) == 0
    assert all(rig.value(f, 1) == 0 for f in PROF_FIELDS)


def test_fb_reserved_and_the_nvml_v2_sum(rig: Rig) -> None:
    """NVML v2 memory: total = free + used + reserved (dcgm-exporter's FB_RESERVED is the carve-out)."""
    for gpu in range(4):
        total, free, used, reserved = (
            rig.value(f"DCGM_FI_DEV_FB_{k}", gpu) for k in ("TOTAL", "FREE", "USED", "RESERVED")
        )
        assert reserved is not None and 0 < reserved < 1024
        assert free is not None and used is not None and total == free + used + reserved


def test_energy_grows_at_each_gpus_own_mean_power(rig: Rig) -> None:
    """Energy used to be one formula for every GPU whatever its power; now each GPU's counter grows at its
    own average draw: GPUs differ, and over a long window energy / time matches the mean power sampled."""
    t0 = rig.clock.now
    start = [rig.value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", g) for g in range(4)]
    powers: list[list[float]] = [[] for _ in range(4)]
    hours = 6
    for step in range(hours * 720):  # every 5 s bucket of six hours
        rig.clock.now = t0 + 5 * step
        for g, s in enumerate(rig.backend.sample(rig.clock.now)):
            powers[g].append(s.values["DCGM_FI_DEV_POWER_USAGE"])
    rig.clock.now = t0 + hours * 3600
    end = [rig.value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", g) for g in range(4)]
    watts = [(e - s) / 1000 / (hours * 3600) for s, e in zip(start, end, strict=True)]  # type: ignore[operator]
    assert len({round(w, 3) for w in watts}) == 4  # no two GPUs alike
    for w, p in zip(watts, powers, strict=True):
        assert abs(w - sum(p) / len(p)) / w < 0.02, (w, sum(p) / len(p))
