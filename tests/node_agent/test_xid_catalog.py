"""node_agent/xid_catalog.py: NVIDIA's catalog as shipped data, its provenance, the derived handling."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from node_agent.xid_catalog import (
    ACTION_HANDLING,
    REFINEMENTS,
    CatalogError,
    Handling,
    fatal_xids,
    load_catalog,
    parse_catalog,
    read_catalog,
    xid_text,
)

ROOT = Path(__file__).resolve().parents[2]
HEADER = "xid,mnemonic,description,immediate_action,investigatory_action\n"


def test_every_xid_nvidia_lists_is_there_once() -> None:
    cat = load_catalog()
    assert [e.xid for e in cat] == list(range(1, 173))
    by = cat.by_xid
    assert by[79].immediate_action == "RESTART_BM"
    assert by[48].immediate_action == "WORKFLOW_XID_48"
    assert by[154].mnemonic == "GPU_RECOVERY_ACTION_CHANGED"
    assert {by[x].immediate_action for x in range(144, 151)} == {"WORKFLOW_NVLINK5_ERR"}
    for x in (46, 62, 136, 140, 143, 155, 156, 158):
        assert by[x].immediate_action == "RESET_GPU", x
    assert by[162].immediate_action == ""  # PSHC_REENGAGED: the catalog names no action


def test_provenance_names_nvidias_page_and_when() -> None:
    prov = load_catalog().provenance
    assert prov["source"].startswith("https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html")
    assert prov["retrieved"][:4].isdigit()
    assert "R575" in prov["version"]


def test_handling_derived_from_the_immediate_action() -> None:
    cat = load_catalog()
    for e in cat:
        if e.xid in REFINEMENTS:
            assert e.handling is REFINEMENTS[e.xid][0]
        else:
            assert e.handling is ACTION_HANDLING[e.immediate_action]
    drain = set(cat.with_handling(Handling.DRAIN))
    # the list of reset/reboot XIDs ignored before, and the nine drained before
    assert {46, 62, 136, 140, 143, 155, 156, 158, *range(144, 151)} <= drain
    assert {48, 64, 74, 79, 95, 109, 110, 119, 120} <= drain
    assert not drain & {13, 31, 43, 45, 63, 92, 94, 154, 162}
    assert fatal_xids() == frozenset(drain)


def test_err_msg_is_the_catalogs_name() -> None:
    assert xid_text(154) == "GPU Recovery Action Changed"
    assert xid_text(48) == "Double Bit ECC Error"
    assert xid_text(1) == "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD"  # 'Unused' says nothing
    assert xid_text(0) == "No Error"
    assert xid_text(999) == "Unknown Error"


def test_shipped_as_package_data() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "data/*.csv" in pyproject["tool"]["setuptools"]["package-data"]["node_agent"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("x,y\n1,2\n", "columns must be"),
        (HEADER + "abc,M,D,RESET_GPU,\n", "line 3: xid must be a positive integer, got 'abc'"),
        (HEADER + "5,M,D,REBOOT_IT,\n", "immediate_action 'REBOOT_IT' of XID 5"),
        (HEADER + "5,M,D,RESET_GPU,\n5,M,D,RESET_GPU,\n", "line 4: xid '5' is repeated"),
        (HEADER, "no XID rows"),
    ],
)
def test_a_bad_catalog_names_file_line_field_and_value(body: str, needle: str) -> None:
    with pytest.raises(CatalogError, match=r"site\.csv") as err:
        parse_catalog("# source: somewhere\n" + body, "site.csv")
    assert needle in str(err.value)


def test_read_catalog_of_a_site(tmp_path: Path) -> None:
    path = tmp_path / "newer.csv"
    row = "200,NEW_ONE,New thing,RESET_GPU,\n"
    path.write_text("# source: https://example.invalid/xids\n" + HEADER + row)
    cat = read_catalog(path)
    assert [(e.xid, e.handling) for e in cat] == [(200, Handling.DRAIN)]
    assert cat.provenance == {"source": "https://example.invalid/xids"}
    with pytest.raises(CatalogError, match=r"missing\.csv: cannot read"):
        read_catalog(tmp_path / "missing.csv")
