"""Implants a tenant could leave, one per place of the measured set: each fails the hand-over naming the
record that moved (before #27 item 13 each of these passed); benign churn does not."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from attest_rig import MODULE_DIR, Clock, Controller

from node_agent.attest.probes import CoResident
from node_agent.attest.service import Attestor

TENANT_UID = 1000


def tenant_owned(path: Path) -> None:
    """Give ``path`` to a tenant uid (as root; a non-root test user is a tenant uid already)."""
    if os.geteuid() == 0:
        os.lchown(path, TENANT_UID, TENANT_UID)
    else:
        assert os.getuid() >= TENANT_UID, "run as root or as a uid >= 1000"


def _write(root: Path, rel: str, text: str, mode: int | None = None, tenant: bool = False) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    if mode is not None:
        os.chmod(p, mode)
    if tenant:
        tenant_owned(p)


def _append(root: Path, rel: str, text: str) -> None:
    with open(root / rel, "a", encoding="utf-8") as fh:
        fh.write(text)


IMPLANTS: list[tuple[str, str, str, str]] = [
    # (category, path under root, content, the record that must name it)
    ("cron", "etc/cron.hourly/update", "#!/bin/sh\n/tmp/.x/m\n", "/etc/cron.hourly"),
    ("cron", "etc/crontab", "@reboot root /tmp/.x/m\n", "/etc/crontab"),
    ("user crontab", "var/spool/cron/crontabs/alice", "@reboot /tmp/.x/m\n", "/var/spool/cron"),
    ("at job", "var/spool/cron/atjobs/a0001", "/tmp/.x/m\n", "/var/spool/cron"),
    ("systemd timer", "etc/systemd/system/m.timer", "[Timer]\nOnBootSec=1\n", "/etc/systemd"),
    ("vendor unit", "usr/lib/systemd/system/m.service", "[Service]\nExecStart=/m\n", "/usr/lib/systemd"),
    ("linger", "var/lib/systemd/linger/alice", "", "/var/lib/systemd/linger"),
    ("init.d", "etc/init.d/m", "#!/bin/sh\n/tmp/.x/m &\n", "/etc/init.d"),
    ("rc.local", "etc/rc.local", "#!/bin/sh\n/tmp/.x/m &\n", "/etc/rc.local"),
    ("tmpfiles", "etc/tmpfiles.d/m.conf", "L+ /etc/ld.so.preload - - - - /tmp/x.so\n", "/etc/tmpfiles.d"),
    ("root user unit", "root/.config/systemd/user/m.service", "[Service]\nExecStart=/m\n", "home/root"),
    ("service user unit", "var/lib/slurm/.config/systemd/user/m.service", "[Service]\n", "home/slurm"),
    ("profile.d", "etc/profile.d/zz.sh", "LD_PRELOAD=/tmp/x.so\n", "/etc/profile.d"),
    ("bash.bashrc", "etc/bash.bashrc", "/tmp/.x/m &\n", "/etc/bash.bashrc"),
    ("environment", "etc/environment", "LD_PRELOAD=/tmp/x.so\n", "/etc/environment"),
    ("root .profile", "root/.profile", "/tmp/.x/m &\n", "home/root"),
    ("service .bashrc", "var/lib/slurm/.bashrc", "/tmp/.x/m &\n", "home/slurm"),
    ("ld.so.conf.d", "etc/ld.so.conf.d/00-x.conf", "/tmp/.x\n", "/etc/ld.so.conf.d"),
    ("modprobe.d", "etc/modprobe.d/x.conf", "install nvidia /tmp/.x/m\n", "/etc/modprobe.d"),
    ("modules-load.d", "etc/modules-load.d/x.conf", "rootkit_x\n", "/etc/modules-load.d"),
    ("PATH hijack", "usr/local/bin/sudo", "#!/bin/sh\n/tmp/.x/m\n", "/usr/local/bin"),
    ("udev rule", "etc/udev/rules.d/99-x.rules", 'ACTION=="add", RUN+="/tmp/.x/m"\n', "/etc/udev"),
    ("sudoers.d", "etc/sudoers.d/alice", "alice ALL=(ALL) NOPASSWD: ALL\n", "/etc/sudoers.d"),
    ("pam", "etc/pam.d/common-auth", "auth sufficient pam_permit.so\n", "/etc/pam.d"),
    ("security", "etc/security/limits.d/x.conf", "* hard core unlimited\n", "/etc/security"),
    ("nsswitch", "etc/nsswitch.conf", "passwd: files evil\n", "/etc/nsswitch.conf"),
    ("shadow", "etc/shadow", "toor::0:0:::::\n", "/etc/shadow"),
    ("group", "etc/group", "sudo:x:27:alice\n", "/etc/group"),
    ("sshd_config", "etc/ssh/sshd_config.d/x.conf", "PermitRootLogin yes\n", "/etc/ssh"),
    ("service authorized_keys", "var/lib/slurm/.ssh/authorized_keys", "ssh-ed25519 AAAA x\n", "home/slurm"),
    ("SPANK plugin", "etc/slurm/plugstack.conf", "optional /tmp/.x/spank.so\n", "/etc/slurm"),
    ("hooks config", "etc/fleetyield/hooks.conf", "attest=false\n", "/etc/fleetyield"),
    ("sysctl.d", "etc/sysctl.d/99-x.conf", "kernel.core_pattern=|/tmp/.x/m\n", "/etc/sysctl.d"),
    (
        "apt hook",
        "etc/apt/apt.conf.d/99x",
        "APT::Update::Pre-Invoke {1};\n",
        "/etc/apt/apt.conf.d",
    ),
    (
        "logrotate",
        "etc/logrotate.d/x",
        "postrotate\n/tmp/.x/m\n",
        "/etc/logrotate.d",
    ),
    ("motd", "etc/update-motd.d/99-x", "#!/bin/sh\n/tmp/.x/m\n", "/etc/update-motd.d"),
    ("boot", "boot/grub/grub.cfg", "linux /vmlinuz init=/tmp/.x/m\n", "/boot"),
    (
        "python .pth",
        "usr/lib/python3/dist-packages/zz.pth",
        "import evil\n",
        "hooks/python",
    ),
    ("sitecustomize", "usr/lib/python3.11/sitecustomize.py", "import os\n", "hooks/python"),
    ("byte cache", "usr/lib/python3.11/__pycache__/os.cpython-311.pyc", "\x00evil", "hooks/python"),
    ("core_pattern", "proc/sys/kernel/core_pattern", "|/tmp/.x/m\n", "kernel/knobs"),
    ("modprobe knob", "proc/sys/kernel/modprobe", "/tmp/.x/m\n", "kernel/knobs"),
    (
        "binfmt_misc",
        "proc/sys/fs/binfmt_misc/x",
        "interpreter /tmp/.x/m\n",
        "kernel/knobs",
    ),
    ("taint", "proc/sys/kernel/tainted", "12289\n", "kernel/tainted"),
    ("module srcversion", "sys/module/nvidia/srcversion", "EV1L00\n", "kernel/modules"),
    ("job area", "tmp/fy-job-41/out.bin", "left behind\n", "tenant/leftovers"),
]


@pytest.mark.parametrize(("category", "rel", "text", "record"), IMPLANTS, ids=[i[0] for i in IMPLANTS])
def test_implant_fails_the_handover_naming_its_record(
    ctl: Controller, attestor: Attestor, clock: Clock, category: str, rel: str, text: str, record: str
) -> None:
    assert ctl.handover(attestor, clock.now)["status"] == "pass"  # the golden node passes
    root = attestor.spec.root
    if (root / rel).exists():
        _append(root, rel, text)
    else:
        _write(root, rel, text)
    v = ctl.handover(attestor, clock.now + 10)
    names = [d["name"] for d in v["differences"]]
    assert v["status"] == "fail" and record in names, (category, names)


@pytest.mark.parametrize(
    "rel",
    ["tmp/.x/miner", "var/tmp/m.sh", "dev/shm/payload", "tmp/.X11-unix/X9"],
    ids=["tmp", "var-tmp", "dev-shm", "inside-sticky-system-dir"],
)
def test_tenant_files_in_shared_places_are_leftovers(
    ctl: Controller, attestor: Attestor, clock: Clock, rel: str
) -> None:
    root = attestor.spec.root
    _write(root, rel, "#!/bin/sh\n", 0o755, tenant=True)
    if rel.startswith("tmp/.x/"):
        tenant_owned(root / "tmp/.x")
    v = ctl.handover(attestor, clock.now)
    assert v["status"] == "fail" and [d["name"] for d in v["differences"]] == ["tenant/leftovers"]
    assert "uid=1000" in (v["differences"][0]["actual_value"] or "")


def test_tenant_ipc_and_processes_are_leftovers(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    root = attestor.spec.root
    _append(root, "proc/sysvipc/shm", "  1234  7  600  4096  99  99  0  1000  1000  1000  1000\n")
    _write(root, "proc/4242/status", "Name:\tminer\nPid:\t4242\nUid:\t1000\t1000\t1000\t1000\n")
    v = ctl.handover(attestor, clock.now)
    assert sorted(d["name"] for d in v["differences"]) == ["tenant/ipc", "tenant/processes"]


def test_on_a_shared_node_a_running_tenant_is_present_not_left_behind(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    """Job 41 of uid 1000 ends while job 42 of uid 1001 still runs here: 1001's files, IPC, processes and
    job area are its own; 1000's are leftovers. A Prolog record of a job whose uid runs nothing here (it
    ended without its Epilog) keeps nobody out. The verdict names who was still here."""
    root = attestor.spec.root
    _write(root, "tmp/fy-job-42/ckpt.bin", "mine\n")
    _write(root, "dev/shm/nccl-42", "x", tenant=True)
    if os.geteuid() == 0:
        os.lchown(root / "dev/shm/nccl-42", 1001, 1001)
    _append(root, "proc/sysvipc/shm", "  1234  7  600  4096  99  99  0  1001  1001  1001  1001\n")
    _write(root, "proc/4243/status", "Name:\ttrain.py\nPid:\t4243\nUid:\t1001\t1001\t1001\t1001\n")
    still_here = [CoResident("42", 1001)]
    v = ctl.handover(attestor, clock.now, still_here)
    assert (v["status"], v["differences"]) == ("pass", []), v["differences"]
    assert v["co_resident"] == ["job 42 uid 1001"]
    assert ctl.handover(attestor, clock.now + 1)["status"] == "fail"  # the same node judged as exclusive
    _write(root, "tmp/miner", "#!/bin/sh\n", 0o755, tenant=True)  # uid 1000's, its job over
    v = ctl.handover(attestor, clock.now + 2, still_here)
    assert [d["name"] for d in v["differences"]] == ["tenant/leftovers"], v["differences"]
    os.remove(root / "tmp/miner")
    stale = [CoResident("42", 1001), CoResident("40", 1000)]  # 1000 runs nothing: not present
    _write(root, "tmp/fy-job-40/x", "old\n")
    v = ctl.handover(attestor, clock.now + 3, stale)
    assert [d["name"] for d in v["differences"]] == ["tenant/leftovers"] and v["co_resident"] == [
        "job 42 uid 1001"
    ]
    assert "area /tmp/fy-job-40" in (v["differences"][0]["actual_value"] or "")
    with pytest.raises(ValueError, match="not a Slurm job id"):
        CoResident("4*", 1001)


def test_a_new_local_user_is_a_new_record_and_a_passwd_change(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    root = attestor.spec.root
    _append(root, "etc/passwd", "toor:x:0:0::/var/lib/toor:/bin/sh\n")
    _write(root, "var/lib/toor/.ssh/authorized_keys", "ssh-ed25519 AAAA x\n")
    problems = {d["name"]: d["problem"] for d in ctl.handover(attestor, clock.now)["differences"]}
    assert problems == {"/etc/passwd": "not_allowed", "home/toor": "unexpected_record"}


def test_mode_and_owner_count_not_only_content(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    root = attestor.spec.root
    os.chmod(root / "etc/profile", 0o666)  # world-writable: anyone may plant later
    assert [d["name"] for d in ctl.handover(attestor, clock.now)["differences"]] == ["/etc/profile"]
    os.chmod(root / "etc/profile", 0o644)
    assert ctl.handover(attestor, clock.now)["status"] == "pass"
    if os.geteuid() == 0:
        os.chown(root / "etc/profile", TENANT_UID, TENANT_UID)
        assert [d["name"] for d in ctl.handover(attestor, clock.now)["differences"]] == ["/etc/profile"]


def test_allowed_module_name_with_other_contents_fails(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    root = attestor.spec.root
    (root / MODULE_DIR / "updates/dkms/nvidia.ko.xz").write_text("same name, other bytes")
    v = ctl.handover(attestor, clock.now)
    assert [d["name"] for d in v["differences"]] == ["kernel/module-files"]
    # loaded from elsewhere under the same name: another size in /proc/modules
    (root / MODULE_DIR / "updates/dkms/nvidia.ko.xz").write_text("nvidia module bytes")
    text = (root / "proc/modules").read_text().replace("nvidia 2 1", "nvidia 9 1")
    (root / "proc/modules").write_text(text)
    v = ctl.handover(attestor, clock.now)
    assert [d["name"] for d in v["differences"]] == ["kernel/modules"]


def test_the_hooks_package_is_measured(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    copy = tmp_path / "hooks-copy"
    shutil.copytree(attestor.spec.hooks_package_dir, copy, ignore=shutil.ignore_patterns("__pycache__"))
    attestor.spec = replace(attestor.spec, hooks_package_dir=copy)
    ctl.learn_from(attestor, clock.now)
    assert ctl.handover(attestor, clock.now)["status"] == "pass"
    _append(copy, "prolog.py", "\nimport os  # planted\n")
    assert [d["name"] for d in ctl.handover(attestor, clock.now)["differences"]] == ["hooks/code"]


def test_benign_churn_still_passes(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    """Logs, caches, package and daemon state, system daemons' private /tmp dirs: not measured."""
    root = attestor.spec.root
    for rel in ("var/log/syslog", "var/log/slurm/slurmd.log", "var/cache/apt/pkgcache.bin",
                "var/lib/dpkg/status", "var/lib/slurm/slurmd/cred_state", "etc/resolv.conf",
                "tmp/systemd-private-abc-chrony.service-x/tmp/f", "run/slurm/slurmd.pid"):  # fmt: skip
        _write(root, rel, "churn\n")
    assert ctl.handover(attestor, clock.now + 60)["status"] == "pass"


def test_node_specific_files_are_identity_records(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    """Another node of the class has its own /etc/hosts and SSH host keys: it passes the class policy."""
    root = attestor.spec.root
    _write(root, "etc/hosts", "10.0.0.7 gpu-h100-1\n")
    _write(root, "etc/ssh/ssh_host_ed25519_key", "node one's key\n", 0o600)
    ctl.learn_from(attestor, clock.now)
    _write(root, "etc/hosts", "10.0.0.8 gpu-h100-2\n")
    _write(root, "etc/ssh/ssh_host_ed25519_key", "node two's key\n", 0o600)
    v = ctl.handover(attestor, clock.now)
    assert v["status"] == "pass", v["differences"]
    quote = attestor.quote("ab" * 32, clock.now)
    values = {r["name"]: r.get("value", "") for r in quote["records"]}
    assert "ssh_host_ed25519_key" in values["identity/ssh-host-keys"]
    assert "ssh_host" not in values["/etc/ssh"]
