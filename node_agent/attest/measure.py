"""Ordered measurement records of a node's tenant-relevant state, read under an injectable root.

Input: a ``MeasureSpec`` (root prefix, persistence points, the agent's config file, optional extra module
names: the fake backend's implant file) and per-GPU reports (``gpu.gpu_reports``). Output: the ordered
``Record`` list a quote carries, in this fixed order (the chain is order-sensitive)::

    kernel/osrelease        kernel       /proc/sys/kernel/osrelease
    kernel/cmdline          kernel       /proc/cmdline
    kernel/modules          modules      /proc/modules names, sorted (+ fake implants)
    <persistence point>...  persistence  one record per configured path, e.g. /etc/ld.so.preload
    agent/code              agent        the installed node_agent package files
    agent/config            agent        the agent's config file
    gpu/<index>...          gpu          model, VBIOS, ECC / MIG / persistence mode, driver
    gpu/identity            identity     the GPU UUIDs (node-specific: a class policy wildcards it)
    meta/time               volatile     the quote time (always wildcarded)

A persistence point is a file or a directory; its value is a manifest, one line per entry, sorted by
relative path: ``<relpath> <sha256 of content> <mode octal>``; a symlink is recorded as
``link:<target>`` and never followed (a unit dir is full of ``.wants`` links; following one could leave
the root), unreadable entries as ``unreadable:<errno name>``. A missing path gives the distinct value
``absent`` (an empty directory gives the empty manifest). Walks stop after ``MAX_ENTRIES`` entries, noted
in the manifest, so one huge directory cannot stall a hand-over.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.attest.chain import ABSENT, Record, canonical, sha256_hex

DEFAULT_PERSISTENCE = (
    "/etc/ld.so.preload",
    "/etc/systemd/system",
    "/run/systemd/system",
    "/etc/cron.d",
    "/var/spool/cron",
    "/etc/modules-load.d",
)
MAX_ENTRIES = 20000
FAKE_MODULES_FILE = "fake-modules"
"""``STATE_DIR/fake-modules``: extra kernel-module names (one a line) the fake backend's measurement adds to
``/proc/modules`` -- the "implant" fault of the demos (``fleetyield-agent attest implant --module X``)."""


@dataclass(frozen=True)
class MeasureSpec:
    root: Path = Path("/")
    persistence: tuple[str, ...] = DEFAULT_PERSISTENCE
    agent_config_file: Path | None = None
    extra_modules_file: Path | None = None
    agent_package_dir: Path = field(default_factory=lambda: Path(__file__).resolve().parent.parent)

    def under_root(self, path: str) -> Path:
        return self.root / path.lstrip("/")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        return f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}"


def module_names(spec: MeasureSpec) -> list[str]:
    names: set[str] = set()
    text = _read_text(spec.under_root("/proc/modules"))
    if text != ABSENT and not text.startswith("unreadable:"):
        names.update(line.split()[0] for line in text.splitlines() if line.strip())
    if spec.extra_modules_file is not None:
        extra = _read_text(spec.extra_modules_file)
        if extra != ABSENT and not extra.startswith("unreadable:"):
            names.update(line.strip() for line in extra.splitlines() if line.strip())
    return sorted(names)


def _file_line(rel: str, path: Path, st: os.stat_result) -> str:
    mode = f"{stat.S_IMODE(st.st_mode):04o}"
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"{rel} link:{os.readlink(path)} {mode}"
        except OSError as exc:
            return f"{rel} unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')} {mode}"
    if stat.S_ISDIR(st.st_mode):
        return f"{rel} dir {mode}"
    if not stat.S_ISREG(st.st_mode):
        return f"{rel} type:{stat.S_IFMT(st.st_mode):o} {mode}"
    h = hashlib.sha256()
    try:
        # O_NOFOLLOW|O_NONBLOCK: a file swapped for a link or a FIFO after the lstat: not followed/blocked.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            while chunk := os.read(fd, 1 << 16):
                h.update(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{rel} unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')} {mode}"
    return f"{rel} {h.hexdigest()} {mode}"


def manifest(path: Path) -> str:
    """The manifest of one persistence point (see the module docstring); ``absent`` when missing."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        return f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}"
    if not stat.S_ISDIR(top.st_mode):
        return _file_line(".", path, top)
    lines: list[str] = []
    stack = [(path, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            lines.append(f"{prefix or '.'} unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}")
            continue
        for entry in entries:
            if len(lines) >= MAX_ENTRIES:
                lines.append(f"... truncated after {MAX_ENTRIES} entries")
                stack.clear()
                break
            rel = f"{prefix}{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                lines.append(f"{rel} unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}")
                continue
            lines.append(_file_line(rel, Path(entry.path), st))
            if stat.S_ISDIR(st.st_mode):
                stack.append((Path(entry.path), rel + "/"))
    return "\n".join(sorted(lines))


def package_manifest(package_dir: Path) -> str:
    """``relpath sha256`` of every file of the installed agent package (bytecode caches excluded)."""
    lines = []
    for dirpath, dirnames, filenames in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            full = Path(dirpath) / name
            try:
                digest = hashlib.sha256(full.read_bytes()).hexdigest()
            except OSError as exc:
                digest = f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}"
            lines.append(f"{full.relative_to(package_dir).as_posix()} {digest}")
    return "\n".join(sorted(lines))


def _rec(records: list[Record], kind: str, name: str, value: str) -> None:
    records.append(Record(len(records), kind, name, sha256_hex(value), value))


def measure(spec: MeasureSpec, gpu_reports: Sequence[dict], now: float) -> list[Record]:
    """All records, in the documented order, indices 0..n-1."""
    records: list[Record] = []
    _rec(records, "kernel", "kernel/osrelease", _read_text(spec.under_root("/proc/sys/kernel/osrelease")))
    _rec(records, "kernel", "kernel/cmdline", _read_text(spec.under_root("/proc/cmdline")))
    _rec(records, "modules", "kernel/modules", "\n".join(module_names(spec)))
    for point in spec.persistence:
        _rec(records, "persistence", point, manifest(spec.under_root(point)))
    _rec(records, "agent", "agent/code", package_manifest(spec.agent_package_dir))
    config = ABSENT if spec.agent_config_file is None else manifest(spec.agent_config_file)
    _rec(records, "agent", "agent/config", config)
    uuids: list[str] = []
    for report in gpu_reports:
        static = {k: v for k, v in report.items() if k not in ("index", "uuid")}
        _rec(records, "gpu", f"gpu/{report['index']}", canonical(static).decode())
        uuids.append(f"{report['index']} {report.get('uuid', '')}")
    _rec(records, "identity", "gpu/identity", "\n".join(uuids))
    _rec(records, "volatile", "meta/time", str(int(now)))
    return records


def record_names(records: Iterable[Record]) -> list[str]:
    return [r.name for r in records]
