"""The measured set: every place a tenant can change that outlives a job, as data (stdlib only).

A clean node is one where nothing a tenant could change persists into the next job. A tenant runs code as
its own uid, and -- through a container escape, a sudo rule or a kernel bug -- possibly as root; so the set
is every location that (a) a job can write, with or without root, and (b) is read again after the job:
by the boot, by a scheduler, by a login, by the loader, by the kernel, by the Slurm hooks or by the next
job. Grouped by what re-runs the planted content (``PERSISTENCE`` holds the system-wide paths, each measured
as a content manifest, so a NEW file in a directory changes the record as surely as an edited one):

* scheduled tasks: cron (``/etc/crontab``, ``cron.d``, ``cron.{hourly,daily,weekly,monthly}``, the user
  crontabs in ``/var/spool/cron``), anacron, ``at`` jobs (``/var/spool/at``; Debian's under
  ``/var/spool/cron/atjobs``), systemd timers (they live in the unit directories below);
* init and services, system and user level: systemd units (``/etc/systemd``, ``/run/systemd/system``,
  ``/usr/lib/systemd`` and ``/lib/systemd`` incl. generators, ``/usr/local/lib/systemd``), lingering users
  (``/var/lib/systemd/linger``: their user units start at boot), ``/etc/init.d``, ``/etc/rc*.d``,
  ``/etc/rc.local``, ``/etc/inittab``, ``tmpfiles.d`` and ``binfmt.d`` (files and interpreters made at boot);
* shell and session start-up: ``/etc/profile``, ``profile.d``, ``bash.bashrc``, ``/etc/bash.bash_logout``,
  ``/etc/environment``, ``/etc/zsh``, ``csh.*``, ``/etc/update-motd.d``, ``/etc/xdg/autostart``;
* dynamic loader and module loading: ``/etc/ld.so.preload``, ``ld.so.conf(.d)``, ``/etc/ld.so.cache``,
  ``/etc/modprobe.d``, ``/etc/modules``, ``modules-load.d`` (``/etc``, ``/usr/lib``, ``/lib``),
  ``/usr/local/lib`` and ``/usr/local/{bin,sbin}`` (searched before ``/usr/bin`` by root's PATH and the
  loader);
* device rules: ``/etc/udev/rules.d``, ``/usr/lib/udev/rules.d``, ``/lib/udev/rules.d`` (RUN+= is root code);
* privilege and authentication: ``/etc/sudoers(.d)``, ``/etc/pam.d``, ``/etc/security``, ``/etc/polkit-1``,
  ``/etc/nsswitch.conf``, ``/etc/passwd``, ``/etc/shadow``, ``/etc/group``, ``/etc/gshadow``, ``/etc/ssh``
  (``sshd_config(.d)``; the host keys are per node, see ``NODE_SPECIFIC``);
* root-run hooks of other daemons: ``/etc/apt/apt.conf.d`` (Pre/Post-Invoke), ``/etc/logrotate.d``
  (postrotate), ``/etc/network/if-*.d``, ``/etc/NetworkManager/dispatcher.d``, ``/etc/dhcp``,
  ``/etc/sysctl.d`` and ``/etc/sysctl.conf`` (``kernel.core_pattern = |/tmp/x`` runs as root on a crash);
* boot: ``/boot`` (kernel, initramfs, GRUB config), ``/etc/default/grub``, ``/etc/initramfs-tools``,
  ``/etc/dracut.conf.d``;
* the Slurm hooks and their gate: ``/etc/slurm`` (slurm.conf, plugstack.conf: SPANK plugins run in slurmstepd
  as root, prolog.d / epilog.d, job_submit.lua), ``/etc/fleetyield`` (hooks.conf).

Per user, for every home directory of the node's local ``/etc/passwd`` (``HOME_FILES``): shell start-up files,
``.ssh`` (authorized_keys, rc, environment), user systemd units (``.config/systemd/user``), autostart,
``.pam_environment``, ``.forward``. Home directories of directory-service users (LDAP/SSSD) are not in the
local passwd and usually on a shared file system: they are the user's own, not the node's, and reading them
could hang a hand-over on NFS; a site with local homes lists them in ``attest.homes``.

Measured elsewhere (``measure``): the kernel (release, cmdline, taint, the runtime knobs in ``KERNEL_KNOBS``:
``core_pattern``, ``modprobe``, ``hotplug``, binfmt_misc registrations), every loaded module by content, the
Python environment the agent and the hooks run from (interpreter + stdlib + site-packages, byte caches
included: Python runs a ``__pycache__`` file in place of its source, and a ``.pth`` file at every start),
the hooks' own package, and what tenants left behind in shared writable places (``TENANT_DIRS``, SysV IPC,
processes).

Not measured, on purpose (benign churn; a false positive at every hand-over would teach admins to ignore the
gate): logs (``/var/log``), caches (``/var/cache``), package databases (``/var/lib/dpkg``, ``/var/lib/apt``:
they change only with packages, whose payload is measured where it runs from), ``/var/lib`` daemon state,
``/run`` except the unit directory, ``/etc/mtab``, ``/etc/resolv.conf`` (DHCP rewrites it), ``/etc/adjtime``,
machine-id, and the bulk of ``/usr/bin`` / ``/usr/lib`` (gigabytes per quote: that is measured boot's and
IMA's job, or a read-only image's; add paths to ``attest.persistence`` to measure more).
"""

from __future__ import annotations

import os
import sys

PERSISTENCE: tuple[str, ...] = (
    # dynamic loader first: the one file that changes every process on the node
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/ld.so.cache",
    # scheduled tasks
    "/etc/crontab",
    "/etc/cron.d",
    "/etc/cron.hourly",
    "/etc/cron.daily",
    "/etc/cron.weekly",
    "/etc/cron.monthly",
    "/etc/anacrontab",
    "/var/spool/cron",
    "/var/spool/anacron",
    "/var/spool/at",
    # init and services, system and user level
    "/etc/systemd",
    "/run/systemd/system",
    "/usr/lib/systemd",
    "/lib/systemd",
    "/usr/local/lib/systemd",
    "/var/lib/systemd/linger",
    "/etc/init.d",
    "/etc/rc.local",
    "/etc/rc0.d",
    "/etc/rc1.d",
    "/etc/rc2.d",
    "/etc/rc3.d",
    "/etc/rc4.d",
    "/etc/rc5.d",
    "/etc/rc6.d",
    "/etc/rcS.d",
    "/etc/inittab",
    "/etc/tmpfiles.d",
    "/usr/lib/tmpfiles.d",
    "/etc/binfmt.d",
    "/usr/lib/binfmt.d",
    # shell and session start-up
    "/etc/profile",
    "/etc/profile.d",
    "/etc/bash.bashrc",
    "/etc/bash.bash_logout",
    "/etc/bashrc",
    "/etc/environment",
    "/etc/zsh",
    "/etc/csh.cshrc",
    "/etc/csh.login",
    "/etc/update-motd.d",
    "/etc/xdg/autostart",
    # module loading
    "/etc/modprobe.d",
    "/usr/lib/modprobe.d",
    "/lib/modprobe.d",
    "/etc/modules",
    "/etc/modules-load.d",
    "/usr/lib/modules-load.d",
    "/lib/modules-load.d",
    "/usr/local/lib",
    "/usr/local/bin",
    "/usr/local/sbin",
    # device rules
    "/etc/udev",
    "/usr/lib/udev/rules.d",
    "/lib/udev/rules.d",
    # privilege and authentication
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/pam.d",
    "/etc/security",
    "/etc/polkit-1",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/shadow",
    "/etc/group",
    "/etc/gshadow",
    "/etc/ssh",
    # root-run hooks of other daemons
    "/etc/apt/apt.conf.d",
    "/etc/logrotate.conf",
    "/etc/logrotate.d",
    "/etc/network",
    "/etc/NetworkManager/dispatcher.d",
    "/etc/dhcp",
    "/etc/sysctl.conf",
    "/etc/sysctl.d",
    # boot
    "/boot",
    "/etc/default/grub",
    "/etc/initramfs-tools",
    "/etc/dracut.conf.d",
    # the Slurm hooks and their gate
    "/etc/slurm",
    "/etc/fleetyield",
)

HOME_FILES: tuple[str, ...] = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".cshrc",
    ".tcshrc",
    ".login",
    ".ssh",
    ".config/systemd/user",
    ".config/autostart",
    ".config/environment.d",
    ".local/share/systemd/user",
    ".pam_environment",
    ".forward",
    ".xinitrc",
    ".xsession",
)
"""Per home directory: start-up files, keys and user units (a directory is measured whole)."""

NODE_SPECIFIC: tuple[tuple[str, str, str], ...] = (
    ("identity/hosts", "/etc", "hosts"),
    ("identity/ssh-host-keys", "/etc/ssh", "ssh_host_*"),
)
"""(record, directory, name pattern): files that differ from node to node by design (docker writes each
container's /etc/hosts; every node has its own SSH host keys). They are recorded (kind ``identity``) and left
out of their directory's manifest, so a class policy learnt from one golden node wildcards them like the GPU
UUIDs instead of failing every other node; a site pins them per node in the policy's ``nodes`` table."""

KERNEL_KNOBS: tuple[str, ...] = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/kernel/hotplug",
    "/proc/sys/kernel/modules_disabled",
    "/proc/sys/fs/binfmt_misc",
)
"""Runtime settings that make the kernel run a program as root (a crash, a module request, a uevent, an
exec of a registered binary format): changed without touching a file on disk, gone at reboot."""

TENANT_DIRS: tuple[str, ...] = (
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/dev/mqueue",
    "/run/lock",
    "/var/crash",
)
"""Shared places any uid can write. After the wipe nothing a tenant owns may be left there."""

TENANT_UID_MIN = 1000
"""uids from here up are tenants (login.defs UID_MIN); below are the system's own (their churn in /tmp,
e.g. systemd-private-* dirs, is not a leftover)."""


def python_env() -> tuple[str, ...]:
    """The interpreter and library trees this process runs from: what the agent and the hooks import."""
    import sysconfig  # here, not at import: the Prolog's re-check imports this module and never calls it

    paths = sysconfig.get_paths()
    found: list[str] = [os.path.realpath(sys.executable)]
    found += [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts") if k in paths]
    out: list[str] = []
    for p in sorted(set(filter(None, found))):  # a tree inside another listed one is walked once
        if not any(p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return tuple(out)
