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
        "Total number of NVLink bandwidth counters for all lanes",
    ),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": ("gauge", "vGPU License status"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("counter", "Throttling duration due to thermal constraints (in us)."),
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
