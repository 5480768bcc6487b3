"""Ordered measurement records of a node's tenant-relevant state, read under an injectable root.

Input: a ``MeasureSpec`` (root prefix, the measured set of ``places``, the agent's config file, optional extra
module names: the fake backend's implant file) and per-GPU reports (``gpu.gpu_reports``). Output: the ordered
``Record`` list a quote carries, in this fixed order (the chain is order-sensitive)::

    kernel/osrelease        kernel       /proc/sys/kernel/osrelease
    kernel/cmdline          kernel       /proc/cmdline
    kernel/modules          modules      per loaded module: name, size, srcversion, taint (+ fake implants)
    kernel/module-files     modules      per loaded module: sha256 of its .ko file (modules.dep)
    kernel/tainted          kernel       /proc/sys/kernel/tainted (sticky: an unsigned module stays visible)
    kernel/knobs            kernel       core_pattern, modprobe, hotplug, binfmt_misc (places.KERNEL_KNOBS)
    <persistence point>...  persistence  one record per configured path (places.PERSISTENCE)
    home/<user>...          home         per local passwd home: start-up files, .ssh, user units
    tenant/leftovers        tenant       entries owned by a tenant uid in places.TENANT_DIRS, job areas
                                         (on a shared node not those of the jobs still running there:
                                         ``present``, each a ``probes.CoResident``)
    tenant/ipc              tenant       SysV shm / msg / sem owned by a tenant uid
    tenant/processes        tenant       processes running as a tenant uid
    hooks/code              hooks        the installed prolog_epilog package (the Prolog gate itself)
    hooks/python            hooks        interpreter + stdlib + site-packages + scripts (places.python_env)
    agent/code              agent        the installed node_agent package files
    agent/config            agent        the agent's config file
    gpu/<index>...          gpu          model, VBIOS, ECC / MIG / persistence mode, driver
    gpu/identity            identity     the GPU UUIDs (node-specific: a class policy wildcards it)
    identity/...            identity     /etc/hosts, SSH host keys (places.NODE_SPECIFIC, wildcarded too)
    meta/time               volatile     the quote time (always wildcarded)

A persistence point is a file or a directory; its value is a manifest, one line per entry, sorted by
relative path: ``<relpath> <sha256 of content> <mode octal> <uid>:<gid>``, so content, mode and owner all
count and a NEW file changes the record; a symlink is recorded as ``link:<target>`` and never followed (a
unit dir is full of ``.wants`` links; following one could leave the root), unreadable entries as
``unreadable:<errno name>``. A missing path gives the distinct value ``absent`` (an empty directory gives the
empty manifest). Walks stop after ``MAX_ENTRIES`` entries, noted in the manifest, so one huge directory
cannot stall a hand-over. A manifest over ``MAX_VALUE_CHARS`` travels as its tree digest
(``tree <sha256 of the manifest> <entries>``): the record still changes with any byte, only the diff shown
is shorter (the Python environment: thousands of files).

Loaded modules. The kernel exposes no hash of a loaded module's memory, so a module is recorded by what
does change with its contents: its size in ``/proc/modules``, its ``srcversion`` (a digest of its sources,
``/sys/module/<m>/srcversion``), its taint flags, and the sha256 of the file ``modules.dep`` names for it
(what ``modinfo -n`` resolves; read here directly so it works under a fixture root and spawns no process per
module). A module loaded from elsewhere (``insmod /tmp/x.ko``) under an allowed name differs in size or
srcversion, and an unsigned or out-of-tree one sets a sticky kernel taint bit. ``RECHECK`` lists the records
cheap enough for every Prolog to recompute (``recheck_records``) against the digests of the last verdict.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from node_agent.attest import places, probes
from node_agent.attest.chain import ABSENT, Record, canonical, sha256_hex

DEFAULT_PERSISTENCE = places.PERSISTENCE
MAX_ENTRIES = 20000
MAX_PYTHON_ENTRIES = 200_000
"""The Python environment is walked whole (a venv + stdlib is ~5-10k files; a dev box's 50k)."""
MAX_VALUE_CHARS = 64 * 1024
FAKE_MODULES_FILE = "fake-modules"
"""``STATE_DIR/fake-modules``: extra kernel-module names (one a line) the fake backend's measurement adds to
``/proc/modules`` -- the "implant" fault of the demos (``fleetyield-agent attest implant --module X``)."""
RECHECK = ("kernel/modules", "kernel/tainted", "kernel/knobs", "/etc/ld.so.preload")
"""What can change between quotes without a reboot and is cheap (< 10 ms): the Prolog's re-check."""
MAX_CACHED = 200_000
_VALUES: dict[tuple[str, int, int, int, int, int, int, int, int], str] = {}
"""What this process's earlier walks recorded for an entry (``<sha256> <mode> <uid>:<gid>``, ``link:...``,
``dir ...``), keyed by path, device, inode, size, mtime, ctime, mode, uid and gid.
Why a cache: the Python environment and /boot are ~100-300 MB on a node, seconds of sha256 per quote; a
long-running agent re-hashes only what changed. Any write to a file moves its ctime, which no unprivileged
call can set back (only root, by resetting the clock, could hide a rewrite from it; a fresh agent, e.g.
after the reboot a failed verdict leads to, hashes everything). Every entry is still lstat'ed on every walk:
the cache saves the hashing and the formatting, never the look. The Prolog's short-lived re-check does not
benefit and does not need it (its records are small)."""
_HOOKS_DIR = Path(__file__).resolve().parent.parent.parent / "prolog_epilog"


@dataclass(frozen=True)
class MeasureSpec:
    root: Path = Path("/")
    persistence: tuple[str, ...] = DEFAULT_PERSISTENCE
    agent_config_file: Path | None = None
    extra_modules_file: Path | None = None
    agent_package_dir: Path = field(default_factory=lambda: Path(__file__).resolve().parent.parent)
    hooks_package_dir: Path = _HOOKS_DIR
    python_env: tuple[str, ...] = field(default_factory=places.python_env)
    homes: tuple[str, ...] | None = None
    """Home directories measured; None: every home of ``<root>/etc/passwd`` (and /root)."""
    areas: tuple[str, ...] = ("/tmp/fy-job-{job_id}",)
    """The hooks' per-job area templates; any existing match after the wipe is a leftover."""
    tenant_uid_min: int = places.TENANT_UID_MIN

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
    """The loaded module names (+ fake implants), sorted."""
    text = probes.loaded_modules(spec.root, _extra_modules(spec))
    return [line.split()[0] for line in text.splitlines() if line.strip()]


def _entry_value(path: str, st: os.stat_result) -> str:
    """What the manifest records for one entry after its relative path (see the module docstring)."""
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)
    key += (st.st_gid,)
    value = _VALUES.get(key)
    if value is not None:
        return value
    mode = f"{stat.S_IMODE(st.st_mode):04o} {st.st_uid}:{st.st_gid}"
    if stat.S_ISLNK(st.st_mode):
        try:
            value = f"link:{os.readlink(path)} {mode}"
        except OSError as exc:
            return f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')} {mode}"
    elif stat.S_ISDIR(st.st_mode):
        value = f"dir {mode}"
    elif not stat.S_ISREG(st.st_mode):
        value = f"type:{stat.S_IFMT(st.st_mode):o} {mode}"
    else:
        h = hashlib.sha256()
        try:
            # O_NOFOLLOW|O_NONBLOCK: a file swapped for a link or a FIFO after the lstat: not followed
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                while chunk := os.read(fd, 1 << 20):
                    h.update(chunk)
            finally:
                os.close(fd)
        except OSError as exc:  # not cached: the next walk tries again
            return f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')} {mode}"
        value = f"{h.hexdigest()} {mode}"
    if len(_VALUES) >= MAX_CACHED:
        _VALUES.clear()
    _VALUES[key] = value
    return value


def manifest(path: Path | str, limit: int = MAX_ENTRIES, label: str = "") -> str:
    """The manifest of one persistence point (see the module docstring); ``absent`` when missing.
    ``label``: a prefix for every line (``tree_manifest``'s path)."""
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        return f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}"
    if not stat.S_ISDIR(top.st_mode):
        return f"{label}. {_entry_value(str(path), top)}"
    lines: list[str] = []
    stack = [(str(path), label)]
    while stack:
        directory, prefix = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            where = prefix if prefix != label else f"{label}."
            lines.append(f"{where} unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}")
            continue
        for entry in entries:
            if len(lines) >= limit:
                lines.append(f"{label}... truncated after {limit} entries")
                stack.clear()
                break
            rel = f"{prefix}{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                lines.append(f"{rel} unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}")
                continue
            lines.append(f"{rel} {_entry_value(entry.path, st)}")  # str paths: pathlib costs 2x the walk
            if stat.S_ISDIR(st.st_mode):
                stack.append((entry.path, rel + "/"))
    lines.sort()
    return "\n".join(lines)


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
    if len(value) > MAX_VALUE_CHARS:
        value = f"tree {sha256_hex(value)} {value.count(chr(10)) + 1}"
    records.append(Record(len(records), kind, name, sha256_hex(value), value))


def tree_manifest(root: Path, paths: Iterable[str], limit: int = MAX_ENTRIES) -> str:
    """One manifest over several absolute paths (each under ``root``), prefixed by the path."""
    parts = []
    for p in paths:
        body = manifest(root / p.lstrip("/"), limit, label=f"{p} ")
        if body == ABSENT or body.startswith("unreadable:"):
            body = f"{p} {body}"
        parts.append(body or f"{p} (empty)")
    return "\n".join(parts)


def home_manifest(root: Path, home: str) -> str:
    return tree_manifest(root, [f"{home.rstrip('/')}/{name}" for name in places.HOME_FILES])


def _extra_modules(spec: MeasureSpec) -> list[str]:
    if spec.extra_modules_file is None:
        return []
    extra = _read_text(spec.extra_modules_file)
    if extra == ABSENT or extra.startswith("unreadable:"):
        return []
    return [line.strip() for line in extra.splitlines() if line.strip()]


def _without_node_specific(point: str, value: str) -> str:
    patterns = [pat for _name, directory, pat in places.NODE_SPECIFIC if directory == point]
    if not patterns:
        return value
    keep = [
        ln
        for ln in value.splitlines()
        if not any(fnmatch.fnmatchcase(ln.split(" ", 1)[0], p) for p in patterns)
    ]
    return "\n".join(keep)


def _node_specific(spec: MeasureSpec, directory: str, pattern: str) -> str:
    base = spec.under_root(directory)
    try:
        names = sorted(n for n in os.listdir(base) if fnmatch.fnmatchcase(n, pattern))
    except OSError:
        return ABSENT
    return "\n".join(f"{n} {manifest(base / n)}" for n in names)


def quick_records(spec: MeasureSpec, names: Iterable[str] = RECHECK) -> dict[str, str]:
    """name -> digest of the cheap records (``RECHECK``): what the Prolog recomputes every job."""
    out: dict[str, str] = {}
    for name in names:
        if name == "kernel/modules":
            value = probes.loaded_modules(spec.root, _extra_modules(spec))
        elif name == "kernel/tainted":
            value = _read_text(spec.under_root("/proc/sys/kernel/tainted"))
        elif name == "kernel/knobs":
            value = probes.kernel_knobs(spec.root, places.KERNEL_KNOBS, manifest)
        elif name.startswith("/"):
            value = manifest(spec.under_root(name))
        else:
            raise ValueError(f"{name!r} is not a record the re-check can recompute (one of {RECHECK})")
        holder: list[Record] = []
        _rec(holder, "", name, value)
        out[name] = holder[0].digest
    return out


def live_co_residents(spec: MeasureSpec, present: Sequence[probes.CoResident]) -> list[probes.CoResident]:
    """The co-resident jobs whose uid has a process on the node now (a running job does: its steps run as
    the uid); the others are records of jobs that ended without their Epilog, and count for nothing."""
    if not present:
        return []
    live = probes.process_uids(spec.root)
    return [c for c in present if c.uid in live]


def measure(
    spec: MeasureSpec, gpu_reports: Sequence[dict], now: float, present: Sequence[probes.CoResident] = ()
) -> list[Record]:
    """All records, in the documented order, indices 0..n-1. ``present``: jobs still running on a shared
    node (``probes.CoResident``): the tenant records leave out what is theirs, for those whose uid runs a
    process here now (``live_co_residents``: a stale Prolog record keeps nobody out)."""
    records: list[Record] = []
    root = spec.root
    release = _read_text(spec.under_root("/proc/sys/kernel/osrelease"))
    _rec(records, "kernel", "kernel/osrelease", release)
    _rec(records, "kernel", "kernel/cmdline", _read_text(spec.under_root("/proc/cmdline")))
    _rec(records, "modules", "kernel/modules", probes.loaded_modules(root, _extra_modules(spec)))
    _rec(records, "modules", "kernel/module-files", probes.module_files(root, release))
    _rec(records, "kernel", "kernel/tainted", _read_text(spec.under_root("/proc/sys/kernel/tainted")))
    _rec(records, "kernel", "kernel/knobs", probes.kernel_knobs(root, places.KERNEL_KNOBS, manifest))
    seen: dict[str, str] = {}
    for point in spec.persistence:
        # merged /usr: /lib/systemd is /usr/lib/systemd; measured once, the alias recorded as such (a link
        # replaced by a real directory changes the alias record)
        real = os.path.realpath(spec.under_root(point))
        if real in seen and real != str(spec.under_root(point)):
            _rec(records, "persistence", point, f"alias of {seen[real]}")
            continue
        seen.setdefault(real, point)
        _rec(records, "persistence", point, _without_node_specific(point, manifest(spec.under_root(point))))
    homes = probes.passwd_homes(root) if spec.homes is None else [(h, h) for h in spec.homes]
    for user, home in homes:
        _rec(records, "home", f"home/{user}", home_manifest(root, home))
    uids = frozenset(c.uid for c in present)
    leftovers = probes.tenant_leftovers(
        root, places.TENANT_DIRS, spec.areas, spec.tenant_uid_min, manifest, present
    )
    _rec(records, "tenant", "tenant/leftovers", leftovers)
    _rec(records, "tenant", "tenant/ipc", probes.tenant_ipc(root, spec.tenant_uid_min, uids))
    _rec(records, "tenant", "tenant/processes", probes.tenant_processes(root, spec.tenant_uid_min, uids))
    _rec(records, "hooks", "hooks/code", package_manifest(spec.hooks_package_dir))
    _rec(records, "hooks", "hooks/python", tree_manifest(root, spec.python_env, MAX_PYTHON_ENTRIES))
    _rec(records, "agent", "agent/code", package_manifest(spec.agent_package_dir))
    config = ABSENT if spec.agent_config_file is None else manifest(spec.agent_config_file)
    _rec(records, "agent", "agent/config", config)
    uuids: list[str] = []
    for report in gpu_reports:
        static = {k: v for k, v in report.items() if k not in ("index", "uuid")}
        _rec(records, "gpu", f"gpu/{report['index']}", canonical(static).decode())
        uuids.append(f"{report['index']} {report.get('uuid', '')}")
    _rec(records, "identity", "gpu/identity", "\n".join(uuids))
    for name, directory, pattern in places.NODE_SPECIFIC:
        _rec(records, "identity", name, _node_specific(spec, directory, pattern))
    _rec(records, "volatile", "meta/time", str(int(now)))
    return records


def record_names(records: Iterable[Record]) -> list[str]:
    return [r.name for r in records]
