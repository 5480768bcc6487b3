"""node_agent/attest/{chain,measure,gpu}: records, chain replay, absent vs empty, links never followed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from attest_rig import T0, make_root

from node_agent.attest.chain import ZERO_PCR, Record, record_bytes, replay
from node_agent.attest.measure import MeasureSpec, manifest, measure, module_names
from node_agent.attest.service import Attestor, implant_module


def test_chain_is_the_documented_hash_chain() -> None:
    records = [Record(0, "k", "a", "00" * 32), Record(1, "k", "b", "11" * 32)]
    pcr = ZERO_PCR
    for r in records:
        pcr = hashlib.sha256(pcr + hashlib.sha256(record_bytes(r)).digest()).digest()
    assert replay(records) == pcr.hex()
    assert replay(list(reversed(records))) != pcr.hex()  # order matters


def test_record_order_and_names(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    records = measure(MeasureSpec(root=root), [{"index": 0, "uuid": "GPU-x", "vbios": "v"}], T0)
    assert [r.index for r in records] == list(range(len(records)))
    names = [r.name for r in records]
    assert names[:3] == ["kernel/osrelease", "kernel/cmdline", "kernel/modules"]
    assert "/etc/ld.so.preload" in names and names[-1] == "meta/time"
    assert records[0].value == "6.1.0-28-amd64"
    modules = [line.split()[0] for line in (records[2].value or "").splitlines()]
    assert modules == ["extfoo", "nvidia", "nvidia_uvm"]
    assert "nvidia size=2 srcversion=ABC123 taint=PO" in (records[2].value or "")


def test_absent_and_empty_are_distinct(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert manifest(tmp_path / "missing") == "absent"
    assert manifest(tmp_path / "empty") == ""


def test_symlinks_are_recorded_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "units"
    d.mkdir()
    secret = tmp_path / "outside"
    secret.write_text("x")
    os.symlink(secret, d / "link.service")
    os.symlink(tmp_path, d / "loop")  # a loop back out of the dir must not be walked
    lines = manifest(d).splitlines()
    owner = f"{os.getuid()}:{os.getgid()}"
    assert lines == [f"link.service link:{secret} 0777 {owner}", f"loop link:{tmp_path} 0777 {owner}"]


def test_manifest_changes_with_content_and_mode(tmp_path: Path) -> None:
    d = tmp_path / "cron.d"
    d.mkdir()
    (d / "job").write_text("* * * * * root true\n")
    before = manifest(d)
    os.chmod(d / "job", 0o600)
    assert manifest(d) != before


def test_fake_implant_adds_a_module(attestor: Attestor) -> None:
    before = module_names(attestor.spec)
    implant_module(attestor.state_dir, "rootkit_x")
    assert module_names(attestor.spec) == sorted([*before, "rootkit_x"])


def test_gpu_records_from_the_fake_backend(attestor: Attestor) -> None:
    quote = attestor.quote("ab" * 32, T0)
    gpu = {r["name"]: r for r in quote["records"] if r["name"].startswith("gpu/")}
    assert set(gpu) == {"gpu/0", "gpu/1", "gpu/identity"}
    assert '"mig_mode":"0"' in gpu["gpu/0"]["value"] and "GPU-" in gpu["gpu/identity"]["value"]


def test_node_key_is_private_and_stable(attestor: Attestor) -> None:
    q1 = attestor.quote("ab" * 32, T0)
    key_file = attestor.state_dir / "node.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    attestor._key = None
    assert attestor.quote("cd" * 32, T0)["key_id"] == q1["key_id"]
