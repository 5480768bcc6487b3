"""prolog_epilog/attest_gate.wipe_tenant: every shared place a job can write is cleared of its uid's files,
nothing of another owner is touched, links are not followed, a uid with another job here is left alone."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from attest_rig import Clock, Controller, make_root

from node_agent.attest import places
from node_agent.attest.service import Attestor
from prolog_epilog import attest_gate as gate

UID = 1234

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid need root to make")


def _own(path: Path, uid: int = UID) -> Path:
    os.lchown(path, uid, uid)
    return path


def _plant(root: Path) -> dict[str, Path]:
    for d in ("tmp", "var/tmp", "dev/shm", "dev/mqueue", "run/lock", "var/crash"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp/.x").mkdir()
    (root / "tmp/.x/miner").write_text("x")
    for p in (root / "tmp/.x", root / "tmp/.x/miner"):
        _own(p)
    planted = {
        "tmp_tree": root / "tmp/.x",
        "var_tmp": _own(_write(root / "var/tmp/m.sh")),
        "shm": _own(_write(root / "dev/shm/payload")),
        "mqueue": _own(_write(root / "dev/mqueue/q")),
        "lock": _own(_write(root / "run/lock/l")),
        "crash": _own(_write(root / "var/crash/core")),
        "x11": _own(_write(root / "tmp/.X11-unix/X9")),
        "crontab": _write(root / "var/spool/cron/crontabs/alice"),  # root-owned on RHEL: by name
        "at": _own(_write(root / "var/spool/cron/atjobs/a0001")),
        "linger": _write(root / "var/lib/systemd/linger/alice"),
    }
    return planted


def _write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_place_is_cleared_and_nothing_else(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    planted = _plant(root)
    others = [_own(_write(root / "tmp/bob.txt"), 4321), _write(root / "tmp/root.txt"),
              _write(root / "var/spool/cron/crontabs/bob"), root / "tmp/.X11-unix/.keep"]  # fmt: skip
    victim = _write(tmp_path / "outside/precious")
    _own(victim)
    os.symlink(tmp_path / "outside", root / "dev/shm/link")
    _own(root / "dev/shm/link")
    report = gate.wipe_tenant(UID, "alice", "7", time.monotonic() + 10, root=str(root))
    assert report["status"] == "removed", report
    assert [name for name, p in planted.items() if os.path.lexists(p)] == []
    assert all(p.exists() for p in others) and victim.exists()  # the link went, not its target
    assert not os.path.lexists(root / "dev/shm/link")


def test_the_wiped_node_attests_clean(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    root = attestor.spec.root
    _plant(root)
    assert "tenant/leftovers" in [d["name"] for d in ctl.handover(attestor, clock.now)["differences"]]
    gate.wipe_tenant(UID, "alice", "7", time.monotonic() + 10, root=str(root))
    # the fixture's golden state had no mqueue/lock/crash dirs: those dirs themselves are not tenant files
    v = ctl.handover(attestor, clock.now)
    assert "tenant/leftovers" not in [d["name"] for d in v["differences"]], v["differences"]


def test_system_uids_and_busy_tenants_are_skipped(tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    kept = _own(_write(root / "tmp/f"), 100)
    assert (
        gate.wipe_tenant(100, "messagebus", "7", time.monotonic() + 10, root=str(root))["status"] == "skipped"
    )
    assert gate.wipe_tenant(0, "root", "7", time.monotonic() + 10, root=str(root))["status"] == "skipped"
    mine = _own(_write(root / "tmp/g"))
    spool = tmp_path / "spool"
    _write(spool / "jobs/7.json", json.dumps({"uid": str(UID)}))  # this job
    _write(spool / "jobs/8.json", json.dumps({"uid": str(UID)}))  # another job of the same uid
    report = gate.wipe_tenant(UID, "alice", "7", time.monotonic() + 10, root=str(root), spool_dir=str(spool))
    assert report["status"] == "skipped" and "8" in report["reason"]
    assert kept.exists() and mine.exists()
    (spool / "jobs/8.json").unlink()
    report = gate.wipe_tenant(UID, "alice", "7", time.monotonic() + 10, root=str(root), spool_dir=str(spool))
    assert report["status"] == "removed" and not mine.exists()


def test_hook_and_agent_agree_on_the_shared_places() -> None:
    assert gate.TENANT_DIRS == places.TENANT_DIRS
