"""The measured values that are not a plain manifest of one path: modules, homes, tenant leftovers.

Input: a root prefix (``Path``; tests: a fixture tree standing for the node's disk and ``/proc``) and the
settings each probe names. Output: one text value per probe, deterministic for a given node state (sorted
lines, no times, no pids), which ``measure`` hashes into a record. Stdlib only: the Prolog's re-check calls
``loaded_modules`` and ``kernel_knobs`` too. See ``measure`` for the record list and why modules are
recorded this way.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from node_agent.attest.chain import ABSENT

MAX_TENANT_LINES = 2000
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


@dataclass(frozen=True, slots=True)
class CoResident:
    """A job still running on a shared node when another ends: its uid's files, IPC and processes and its
    own job areas are present by right, not left behind (the Epilog names them from the Prolog's records).
    """

    job_id: str
    uid: int

    def __post_init__(self) -> None:
        if not _JOB_ID.fullmatch(self.job_id):
            raise ValueError(f"co-resident job id {self.job_id!r} is not a Slurm job id")
        if type(self.uid) is not int or self.uid < 0:
            raise ValueError(f"co-resident uid {self.uid!r} is not a uid")

    def line(self) -> str:
        return f"job {self.job_id} uid {self.uid}"


_KO_SUFFIXES = (".ko", ".ko.xz", ".ko.gz", ".ko.zst")


def _under(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def _errname(exc: OSError) -> str:
    return f"unreadable:{errno.errorcode.get(exc.errno or 0, 'EIO')}"


def read_small(path: Path, limit: int = 1 << 20) -> str:
    """A small text file, stripped; ``absent`` or ``unreadable:<errno>`` (never follows a FIFO's block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        return _errname(exc)
    try:
        return os.read(fd, limit).decode("utf-8", errors="replace").strip()
    except OSError as exc:
        return _errname(exc)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return ABSENT
    except OSError as exc:
        return _errname(exc)
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    except OSError as exc:
        return _errname(exc)
    finally:
        os.close(fd)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- modules
def _proc_modules(root: Path) -> list[tuple[str, str]]:
    text = read_small(_under(root, "/proc/modules"), 1 << 22)
    if text == ABSENT or text.startswith("unreadable:"):
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if parts:
            out.append((parts[0], parts[1] if len(parts) > 1 else "?"))
    return out


def loaded_modules(root: Path, extra_names: Iterable[str] = ()) -> str:
    """``<name> size=<bytes> srcversion=<..> taint=<..>`` per loaded module, sorted (+ ``extra_names``)."""
    lines = {}
    for name, size in _proc_modules(root):
        sys_dir = _under(root, f"/sys/module/{name}")
        srcversion = read_small(sys_dir / "srcversion")
        taint = read_small(sys_dir / "taint") or "-"
        lines[name] = f"{name} size={size} srcversion={srcversion} taint={taint}"
    for name in extra_names:
        lines.setdefault(name, f"{name} size=? srcversion=? taint=? (fake implant)")
    return "\n".join(lines[n] for n in sorted(lines))


def _module_index(root: Path, release: str) -> dict[str, Path]:
    """Module name -> its file, from ``modules.dep`` (names normalised '-' -> '_', as the kernel does)."""
    for base in ("/lib/modules", "/usr/lib/modules"):
        moddir = _under(root, f"{base}/{release}")
        text = read_small(moddir / "modules.dep", 1 << 24)
        if text == ABSENT or text.startswith("unreadable:"):
            continue
        index: dict[str, Path] = {}
        for line in text.splitlines():
            rel = line.split(":", 1)[0].strip()
            base_name = rel.rsplit("/", 1)[-1]
            for suffix in _KO_SUFFIXES:
                if base_name.endswith(suffix):
                    index[base_name[: -len(suffix)].replace("-", "_")] = moddir / rel
                    break
        return index
    return {}


def module_files(root: Path, release: str) -> str:
    """``<name> <sha256 of its .ko file>`` per loaded module (``no-file`` when modules.dep lacks it)."""
    index = _module_index(root, release)
    lines = []
    for name, _size in sorted(_proc_modules(root)):
        path = index.get(name.replace("-", "_"))
        lines.append(f"{name} {file_sha256(path) if path is not None else 'no-file'}")
    return "\n".join(lines)


def kernel_knobs(root: Path, knobs: Iterable[str], manifest: Callable[[Path], str]) -> str:
    """``<path> <value>`` per knob; a directory (binfmt_misc) by its manifest of registrations."""
    lines = []
    for knob in knobs:
        path = _under(root, knob)
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            is_dir = False
        value = manifest(path).replace("\n", " | ") if is_dir else read_small(path)
        lines.append(f"{knob} {value}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- homes
def passwd_homes(root: Path) -> list[tuple[str, str]]:
    """(user, home) of the node's local passwd file, deduplicated by home, plus root's ``/root``."""
    text = read_small(_under(root, "/etc/passwd"), 1 << 24)
    seen: dict[str, str] = {}
    if text != ABSENT and not text.startswith("unreadable:"):
        for line in text.splitlines():
            fields = line.split(":")
            if len(fields) >= 6 and fields[5].startswith("/") and fields[5] != "/":
                seen.setdefault(os.path.normpath(fields[5]), fields[0])
    seen.setdefault("/root", "root")
    return sorted((user, home) for home, user in seen.items())


# ---------------------------------------------------------------------------------------------- tenants
def _tenant_entries(
    root: Path, top: str, uid_min: int, manifest: Callable[[Path], str], present: frozenset[int] = frozenset()
) -> list[str]:
    """Entries below ``top`` owned by a tenant uid (not one of ``present``: a tenant with a job still running
    here); descends into sticky world-writable system dirs (``/tmp/.X11-unix``) but not into a tenant's own
    tree (that is recorded whole by its manifest)."""
    out: list[str] = []
    stack = [(_under(root, top), top)]
    while stack and len(out) < MAX_TENANT_LINES:
        directory, shown = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            out.append(f"{shown} {_errname(exc)}")
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            path = f"{shown.rstrip('/')}/{entry.name}"
            if st.st_uid in present:
                continue
            if st.st_uid >= uid_min:
                digest = hashlib.sha256(manifest(Path(entry.path)).encode()).hexdigest()
                out.append(f"{path} uid={st.st_uid} {digest}")
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                stack.append((Path(entry.path), path))
    return out


def _area_glob(template: str) -> str:
    return template.replace("{job_id}", "*").replace("{user}", "*")


def tenant_leftovers(
    root: Path,
    dirs: Iterable[str],
    areas: Iterable[str],
    uid_min: int,
    manifest: Callable[[Path], str],
    present: Iterable[CoResident] = (),
) -> str:
    """What a tenant left in the shared writable places, and any job area still present (any owner).
    ``present``: the jobs still running on a shared node; their uids' entries and their own areas are not
    leftovers (they are judged when that uid's last job here ends)."""
    uids = frozenset(c.uid for c in present)
    running = [_area_glob(t.replace("{job_id}", c.job_id)) for t in areas for c in present]
    lines: list[str] = []
    for top in dirs:
        lines += _tenant_entries(root, top, uid_min, manifest, uids)
    for template in areas:
        lines += [
            f"area {p}"
            for p in _glob_under(root, _area_glob(template))
            if not any(fnmatch.fnmatchcase(p, r) for r in running)
        ]
    return "\n".join(sorted(set(lines)))


def _glob_under(root: Path, pattern: str) -> list[str]:
    current = ["/"]
    for part in pattern.strip("/").split("/"):
        nxt = []
        for base in current:
            if "*" not in part:
                if os.path.lexists(_under(root, base + part)):
                    nxt.append(base + part + "/")
                continue
            try:
                names = os.listdir(_under(root, base))
            except OSError:
                continue
            nxt += [base + n + "/" for n in names if fnmatch.fnmatchcase(n, part)]
        current = nxt
    return [c.rstrip("/") for c in current]


def tenant_ipc(root: Path, uid_min: int, present: frozenset[int] = frozenset()) -> str:
    """SysV shared memory, message queues and semaphores owned by a tenant uid (they outlive a job), but
    not by one of ``present`` (a tenant with a job still running here)."""
    lines = []
    for kind in ("shm", "msg", "sem"):
        text = read_small(_under(root, f"/proc/sysvipc/{kind}"), 1 << 22)
        if text == ABSENT or text.startswith("unreadable:"):
            continue
        rows = text.splitlines()
        header = rows[0].split() if rows else []
        if "uid" not in header:
            continue
        col = header.index("uid")
        key_col = header.index("key") if "key" in header else 0
        for row in rows[1:]:
            cells = row.split()
            uid = int(cells[col]) if len(cells) > col and cells[col].isdigit() else -1
            if uid >= uid_min and uid not in present:
                lines.append(f"{kind} key={cells[key_col]} uid={cells[col]}")
    return "\n".join(sorted(lines))


def _processes(root: Path) -> list[tuple[int | None, str | None]] | None:
    """(real uid, name) of each process in ``/proc/<pid>/status``; None when ``/proc`` cannot be listed."""
    proc = _under(root, "/proc")
    try:
        pids = [n for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return None
    out = []
    for pid in pids:
        uid = name = None
        for line in read_small(proc / pid / "status", 1 << 16).splitlines():
            if line.startswith("Uid:"):
                fields = line.split()
                uid = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
            elif line.startswith("Name:"):
                name = line.split(None, 1)[1] if " " in line or "\t" in line else ""
        out.append((uid, name))
    return out


def process_uids(root: Path) -> frozenset[int]:
    """The real uids of the processes running now."""
    return frozenset(uid for uid, _ in _processes(root) or () if uid is not None)


def tenant_processes(root: Path, uid_min: int, present: frozenset[int] = frozenset()) -> str:
    """``uid=<u> comm=<name>`` per process whose real uid is a tenant's, not one of ``present`` (a tenant
    with a job still running here); pids are not recorded."""
    procs = _processes(root)
    if procs is None:
        return ABSENT
    lines = [
        f"uid={uid} comm={name}"
        for uid, name in procs
        if uid is not None and uid >= uid_min and uid not in present
    ]
    return "\n".join(sorted(lines))
