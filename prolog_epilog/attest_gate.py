"""Attestation steps of the Slurm hooks (stdlib only; ``cryptography`` imported lazily for one check).

Input / output, per function:

* ``wipe(job_id, areas, deadline, ...)`` (Epilog): remove the job's scratch/tmp areas, ask the agent to
  scrub the job's GPUs, drop the job's hpc_job mapping; returns a report dict, never raises.
* ``invalidate_verdict(path)`` (Epilog, first step): the node's verdict stops counting the moment a job
  ends, so the next Prolog can only pass on a verdict made *after* this job (by ``request_handover``).
* ``request_handover(agent_state_dir, job_id, timeout_s)`` (Epilog, last step): the agent's nonce ->
  quote -> verdict exchange with the controller, over the agent's unix socket.
* ``check_verdict(path, node, now, max_age_s, controller_pubkey_path)`` (Prolog): ``(allow, reason)``.
* ``recheck(path, root, names, agent_state_dir)`` (Prolog, after ``check_verdict`` allowed): recompute the
  cheap records (loaded modules, kernel taint and knobs, ld.so.preload: what can change between quotes
  without a reboot) and deny when one differs from the digest the signed verdict passed -- a module loaded
  after the hand-over fails the next Prolog. Imports ``node_agent.attest.measure`` (stdlib only) lazily.
* ``wipe_tenant(uid, user, root, ...)`` (Epilog): what the job's uid left in the shared writable places.

Area templates name one per-job directory each, e.g. ``/tmp/fy-job-{job_id}`` or
``/scratch/{user}/{job_id}``; placeholders are ``{job_id}`` (digits only) and ``{user}`` (a POSIX user
name). The template's *root* is its directory part before the first placeholder (``/tmp``, ``/scratch``);
the wipe never leaves it: the path below the root is walked one component at a time with
``O_NOFOLLOW|O_DIRECTORY`` relative to the previous directory's fd (``openat``), so a symlink planted by the
tenant anywhere on the way (``/scratch/alice -> /etc``) or swapped in during the walk is refused, not
followed, and the tree is removed through directory fds (``unlinkat``), never through path strings. A
symlink at the area itself or inside it is unlinked (the link, not its target). Work stops at ``deadline``
(``time.monotonic()``), reported as ``incomplete``.

Ed25519 and the stdlib: verifying the controller's signature needs ``cryptography``, which the Prolog
imports lazily, only when a verdict is checked: measured at ~9-13 ms (import) + ~0.1 ms (verify) on the
dev container, inside the Prolog's 2 s deadline (see bench/bench_attest.py). The verdict file is also
required to be a regular file owned by root (or the hook's user) and not group/world writable.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterable
from typing import Any

MAX_VERDICT_BYTES = 1 << 20
MAX_DEPTH = 256
CLOCK_SKEW_S = 60.0
AGENT_SOCKET = "agent.sock"
KEY_TYPE = "fleetyield-ed25519"
_PLACEHOLDERS = ("{job_id}", "{user}")


# ---------------------------------------------------------------------------------------------- wipe
def _valid_user(user: str | None) -> bool:
    """A POSIX-ish user name: ``[A-Za-z_][A-Za-z0-9._-]{0,63}`` (so never '', '.', '..' or a '/')."""
    return (
        bool(user)
        and len(user) <= 64  # type: ignore[arg-type]
        and user.isascii()  # type: ignore[union-attr]
        and (user[0].isalpha() or user[0] == "_")  # type: ignore[index]
        and all(c.isalnum() or c in "._-" for c in user)  # type: ignore[union-attr]
    )


def split_template(template: str) -> tuple[str, list[str]]:
    """(root, components below the root) of an area template; ``ValueError`` when unusable."""
    if not template.startswith("/"):
        raise ValueError(f"area template {template!r} must be an absolute path")
    first = min((template.find(p) for p in _PLACEHOLDERS if p in template), default=-1)
    if first < 0:
        raise ValueError(f"area template {template!r} has no {{job_id}} or {{user}} placeholder")
    root = template[: template.rfind("/", 0, first) + 1].rstrip("/") or "/"
    rest = template[len(root) :].strip("/").split("/")
    if root == "/":
        raise ValueError(f"area template {template!r}: its root would be '/'; give a real root")
    if any(part in ("", ".", "..") for part in rest) or ".." in root.split("/"):
        raise ValueError(f"area template {template!r} has an empty, '.' or '..' component")
    return root, rest


def expand(template: str, job_id: str, user: str | None) -> tuple[str, list[str]]:
    root, parts = split_template(template)
    if not (job_id.isascii() and job_id.isdigit() and len(job_id) <= 12):
        raise ValueError(f"job id {job_id!r} is not a Slurm job id")
    if "{user}" in template and not _valid_user(user):
        raise ValueError(f"user {user!r} is not a safe user name")
    out = []
    for part in parts:
        value = part.replace("{job_id}", job_id).replace("{user}", user or "")
        if "{" in value or "}" in value or "/" in value or value in ("", ".", ".."):
            raise ValueError(f"area template {template!r} expands to a bad component {value!r}")
        out.append(value)
    return root, out


class _Deadline(Exception):
    pass


def _remove_tree(parent_fd: int, name: str, deadline: float, counts: dict[str, int], depth: int) -> None:
    if time.monotonic() > deadline:
        raise _Deadline
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError:  # not a directory, or a symlink (ELOOP/ENOTDIR): remove the entry itself
        os.unlink(name, dir_fd=parent_fd)
        counts["files"] += 1
        return
    try:
        if depth > MAX_DEPTH:
            raise OSError(f"tree deeper than {MAX_DEPTH} levels")
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for entry_name, is_dir in entries:
            if time.monotonic() > deadline:
                raise _Deadline
            if is_dir:
                _remove_tree(fd, entry_name, deadline, counts, depth + 1)
            else:
                os.unlink(entry_name, dir_fd=fd)
                counts["files"] += 1
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
    counts["dirs"] += 1


def wipe_area(template: str, job_id: str, user: str | None, deadline: float) -> dict[str, Any]:
    """Remove one expanded area; never raises. ``status``: removed | absent | refused | incomplete | error."""
    report: dict[str, Any] = {"template": template, "files": 0, "dirs": 0}
    try:
        root, parts = expand(template, job_id, user)
    except ValueError as exc:
        return {**report, "status": "refused", "reason": str(exc)}
    report["path"] = os.path.join(root, *parts)
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(os.path.realpath(root), os.O_RDONLY | os.O_DIRECTORY))
        except FileNotFoundError:
            return {**report, "status": "absent"}
        for part in parts[:-1]:
            try:
                fds.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            except FileNotFoundError:
                return {**report, "status": "absent"}
            except OSError as exc:
                return {
                    **report,
                    "status": "refused",
                    "reason": f"{part!r} is a symlink or not a dir ({exc})",
                }
        last = parts[-1]
        try:
            os.lstat(last, dir_fd=fds[-1])
        except FileNotFoundError:
            return {**report, "status": "absent"}
        counts = {"files": 0, "dirs": 0}
        try:
            _remove_tree(fds[-1], last, deadline, counts, 0)
            status = "removed"
        except _Deadline:
            status = "incomplete"
        return {**report, **counts, "status": status}
    except OSError as exc:
        return {**report, "status": "error", "reason": str(exc)}
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


TENANT_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock", "/var/crash")
"""Shared places any uid can write (node_agent.attest.places.TENANT_DIRS: kept equal by a test)."""
CRONTABS = ("/var/spool/cron/crontabs", "/var/spool/cron", "/var/spool/cron/tabs")
AT_SPOOLS = ("/var/spool/cron/atjobs", "/var/spool/at")
LINGER_DIR = "/var/lib/systemd/linger"


def _open_dir(root: str, path: str) -> int:
    return os.open(os.path.realpath(os.path.join(root, path.lstrip("/"))), os.O_RDONLY | os.O_DIRECTORY)


def _sweep_owned(
    dir_fd: int, uid: int, deadline: float, counts: dict[str, int], removed: list[str], shown: str, depth: int
) -> None:
    """Remove every entry of ``dir_fd`` owned by ``uid``; descend into sticky world-writable dirs of other
    owners (``/tmp/.X11-unix``) one level at a time. fd-relative, links never followed."""
    with os.scandir(dir_fd) as it:
        names = [e.name for e in it]
    for name in names:
        if time.monotonic() > deadline:
            raise _Deadline
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if st.st_uid == uid:
            _remove_tree(dir_fd, name, deadline, counts, 0)
            removed.append(f"{shown}/{name}")
        elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and depth < 4:
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                _sweep_owned(sub, uid, deadline, counts, removed, f"{shown}/{name}", depth + 1)
            finally:
                os.close(sub)


def _unlink_named(root: str, directory: str, name: str, removed: list[str]) -> None:
    try:
        fd = _open_dir(root, directory)
    except OSError:
        return
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)
            removed.append(f"{directory}/{name}")
    except OSError:
        pass
    finally:
        os.close(fd)


def running_jobs(spool_dir: str | None, job_id: str) -> list[dict[str, Any]]:
    """The other jobs the Prolog recorded on this node (``<spool>/jobs/*.json``, written by root):
    ``{"job_id", "uid"}`` each, for the hand-over of a shared node. A record root did not write, or one
    naming no job id or uid, is skipped: only the Prolog's own records may keep a tenant out of the check."""
    if not spool_dir:
        return []
    out = []
    jobs = os.path.join(spool_dir, "jobs")
    try:
        names = sorted(os.listdir(jobs))
    except OSError:
        return []
    for name in names:
        other = name[:-5] if name.endswith(".json") else None
        if not other or other == job_id or not other.replace("_", "").isdigit():
            continue
        try:
            fd = os.open(os.path.join(jobs, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    continue
                doc = json.loads(os.read(fd, 1 << 16))
            finally:
                os.close(fd)
        except (OSError, ValueError):
            continue
        uid = str(doc.get("uid")) if isinstance(doc, dict) else ""  # the Prolog's $SLURM_JOB_UID
        if uid.isdigit():
            out.append({"job_id": other, "uid": int(uid)})
    return out


def other_jobs_of(spool_dir: str | None, uid: int, job_id: str) -> list[str]:
    """Ids of the other jobs of ``uid`` the Prolog recorded on this node (``running_jobs``)."""
    return [j["job_id"] for j in running_jobs(spool_dir, job_id) if str(j["uid"]) == str(uid)]


def wipe_tenant(
    uid: int | None,
    user: str | None,
    job_id: str,
    deadline: float,
    *,
    root: str = "/",
    uid_min: int = 1000,
    spool_dir: str | None = None,
) -> dict[str, Any]:
    """Remove what the job's uid can have left in shared writable places; never raises.

    ``TENANT_DIRS`` entries the uid owns, its crontab (by name: on RHEL root owns it), its ``at`` jobs, its
    systemd linger flag (user units at boot). Skipped, and said, for a system uid (below ``uid_min``) and
    while another job of the same uid runs here (its files are in use). SysV IPC objects are removed with
    ``ipcrm`` on a real root only. ``status``: removed | skipped | incomplete | error.
    """
    report: dict[str, Any] = {"uid": uid, "removed": [], "files": 0, "dirs": 0}
    if uid is None or uid < uid_min or not _valid_user(user):
        return {**report, "status": "skipped", "reason": f"uid {uid} / user {user!r} is not a tenant's"}
    busy = other_jobs_of(spool_dir, uid, job_id)
    if busy:
        return {**report, "status": "skipped", "reason": f"uid {uid} still runs job(s) {', '.join(busy)}"}
    counts = {"files": 0, "dirs": 0}
    removed: list[str] = report["removed"]
    status = "removed"
    try:
        for top in TENANT_DIRS:
            try:
                fd = _open_dir(root, top)
            except OSError:
                continue
            try:
                _sweep_owned(fd, uid, deadline, counts, removed, top, 0)
            finally:
                os.close(fd)
        for directory in CRONTABS:
            _unlink_named(root, directory, str(user), removed)
        _unlink_named(root, LINGER_DIR, str(user), removed)
        for spool in AT_SPOOLS:
            try:
                fd = _open_dir(root, spool)
            except OSError:
                continue
            try:
                for name in os.listdir(fd):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if st.st_uid == uid and stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=fd)
                        removed.append(f"{spool}/{name}")
            finally:
                os.close(fd)
        if os.path.realpath(root) == "/":
            removed += _remove_ipc(uid)
    except _Deadline:
        status = "incomplete"
    except OSError as exc:
        return {**report, **counts, "status": "error", "reason": str(exc)}
    return {**report, **counts, "status": status}


def _remove_ipc(uid: int) -> list[str]:
    """``ipcrm`` every SysV shm / msg / sem object of ``uid`` (they outlive the job's processes)."""
    import subprocess

    out = []
    for kind, flag in (("shm", "-m"), ("msg", "-q"), ("sem", "-s")):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as fh:
                rows = fh.read().splitlines()
        except OSError:
            continue
        header = rows[0].split() if rows else []
        if "uid" not in header or len(header) < 2:
            continue
        col, id_col = header.index("uid"), 1
        for row in rows[1:]:
            cells = row.split()
            if len(cells) > col and cells[col] == str(uid):
                cmd = ["ipcrm", flag, cells[id_col]]
                done = subprocess.run(cmd, capture_output=True, timeout=2, check=False)
                if done.returncode == 0:
                    out.append(f"ipc {kind} {cells[id_col]}")
    return out


def agent_call(state_dir: str, request: dict[str, Any], timeout_s: float) -> Any:
    """One JSON request over the agent's control socket; raises ``RuntimeError`` with the agent's message."""
    path = os.path.join(state_dir, AGENT_SOCKET)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > 1 << 22:
                raise RuntimeError("agent answer larger than 4 MiB")
    doc = json.loads(buf)
    if not isinstance(doc, dict) or not doc.get("ok"):
        raise RuntimeError(str(doc.get("error") if isinstance(doc, dict) else doc))
    return doc.get("result")


def wipe(
    job_id: str,
    areas: Iterable[str],
    deadline: float,
    *,
    user: str | None = None,
    gpus: list[int] | None = None,
    agent_state_dir: str | None = None,
    hpc_job_dir: str | None = None,
) -> dict[str, Any]:
    """The Epilog's wipe: areas, then the GPU scrub request, then the hpc_job mapping. Never raises.

    ``ok`` is true when every area is removed or absent and the scrub (when asked) was acknowledged.
    """
    report: dict[str, Any] = {"job_id": job_id, "areas": [], "scrub": None, "mapping_removed": None}
    for template in areas:
        report["areas"].append(wipe_area(template, job_id, user, deadline))
    if agent_state_dir:
        left = deadline - time.monotonic()
        if left <= 0:
            report["scrub"] = {"error": "deadline passed before the scrub request"}
        else:
            try:
                report["scrub"] = agent_call(agent_state_dir, {"op": "scrub", "gpus": gpus or []}, left)
            except Exception as exc:  # agent down, old agent without the op, timeout: report, never raise
                report["scrub"] = {"error": f"{type(exc).__name__}: {exc}"}
    if hpc_job_dir:
        from prolog_epilog._hooklib import remove_hpc_job_mapping

        try:
            report["mapping_removed"] = remove_hpc_job_mapping(hpc_job_dir, job_id)[0]
        except OSError as exc:
            report["mapping_removed"] = {"error": str(exc)}
    areas_ok = all(a["status"] in ("removed", "absent") for a in report["areas"])
    scrub = report["scrub"]
    scrub_ok = scrub is None or (isinstance(scrub, dict) and "error" not in scrub)
    report["ok"] = areas_ok and scrub_ok
    return report


# ---------------------------------------------------------------------------------------------- verdicts
def invalidate_verdict(path: str) -> bool:
    """Rename the node's verdict to ``<path>.prev`` (kept for forensics). True when one existed."""
    try:
        os.replace(path, path + ".prev")
        return True
    except FileNotFoundError:
        return False


def request_handover(
    agent_state_dir: str,
    job_id: str | None,
    timeout_s: float,
    co_resident: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Ask the agent for the hand-over (nonce -> quote -> verdict file). Raises on any failure.
    ``co_resident``: the jobs still running on this shared node (``running_jobs``)."""
    request: dict[str, Any] = {"op": "handover", "job_id": job_id}
    if co_resident:
        request["co_resident"] = co_resident
    return agent_call(agent_state_dir, request, timeout_s)


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def load_public_key(path: str) -> Any:
    """An Ed25519 public key from a ``fleetyield-ed25519 <base64> <name>`` line (imports cryptography)."""
    with open(path, encoding="ascii") as fh:
        fields = fh.read().split()
    if len(fields) < 2 or fields[0] != KEY_TYPE:
        raise ValueError(f"expected a '{KEY_TYPE} <base64> <name>' line in {path}")
    raw = base64.b64decode(fields[1], validate=True)
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


def verdict_signature_ok(verdict: dict[str, Any], public_key: Any) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        sig = base64.b64decode(str(verdict.get("signature", "")), validate=True)
        public_key.verify(sig, canonical({k: v for k, v in verdict.items() if k != "signature"}))
    except (InvalidSignature, ValueError):
        return False
    return True


def _read_verdict(path: str) -> dict[str, Any]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise ValueError(f"owned by uid {st.st_uid}, not root")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(f"mode {stat.S_IMODE(st.st_mode):04o} is group/world writable")
        data = os.read(fd, MAX_VERDICT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_VERDICT_BYTES:
        raise ValueError("larger than 1 MiB")
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def failure_reason(verdict: dict[str, Any]) -> str:
    """``fleetyield: attestation failed (<differing records>)``: the drain reason (kept short for Slurm)."""
    names = [str(d.get("name")) for d in verdict.get("differences") or [] if isinstance(d, dict)]
    detail = ", ".join(names[:6]) + (f", +{len(names) - 6} more" if len(names) > 6 else "")
    if not detail:
        detail = "; ".join(str(r) for r in (verdict.get("reasons") or [])[:2]) or "no reason given"
    return f"fleetyield: attestation failed ({detail})"


def recheck(path: str, root: str, names: Iterable[str], agent_state_dir: str | None) -> tuple[bool, str]:
    """The Prolog's re-check of what can change between quotes: ``(allow, reason)``, fail-closed.

    Run after ``check_verdict`` allowed (so the file is a fresh, signed pass for this node). The fake
    backend's implant file (``<agent_state_dir>/fake-modules``) is counted when it exists, as the agent does.
    """
    from pathlib import Path

    from node_agent.attest.measure import FAKE_MODULES_FILE, MeasureSpec, quick_records

    wanted = [n for n in names if n]
    if not wanted:
        return True, "no re-check configured"
    try:
        verdict = _read_verdict(path)
    except (OSError, ValueError) as exc:
        return False, f"fleetyield: attestation verdict unusable ({path}: {exc})"
    passed = verdict.get("digests")
    if not isinstance(passed, dict):
        return False, "fleetyield: attestation verdict carries no digests to re-check (controller too old?)"
    extra = Path(agent_state_dir) / FAKE_MODULES_FILE if agent_state_dir else None
    spec = MeasureSpec(
        root=Path(root), extra_modules_file=extra if extra and extra.exists() else None, python_env=()
    )
    try:
        now = quick_records(spec, wanted)
    except ValueError as exc:
        return False, f"fleetyield: attest_recheck: {exc}"
    changed = [n for n in wanted if passed.get(n) != now[n]]
    if changed:
        return False, f"fleetyield: attestation failed ({', '.join(changed)} changed since the hand-over)"
    return True, f"re-checked {len(wanted)} record(s)"


def check_verdict(
    path: str, node: str, now: float, max_age_s: float, controller_pubkey_path: str | None
) -> tuple[bool, str]:
    """The Prolog's attestation gate: ``(allow, reason)``; fail-closed (missing, stale, bad -> deny).

    With ``controller_pubkey_path`` None the controller signature is not checked here (the agent checked it
    before writing the file); ownership and mode are always checked.
    """
    try:
        verdict = _read_verdict(path)
    except FileNotFoundError:
        return False, f"fleetyield: no attestation verdict ({path} missing: node not attested since last job)"
    except (OSError, ValueError) as exc:
        return False, f"fleetyield: attestation verdict unusable ({path}: {exc})"
    if controller_pubkey_path:
        try:
            public = load_public_key(controller_pubkey_path)
        except (OSError, ValueError, ImportError) as exc:
            return False, f"fleetyield: cannot load controller key {controller_pubkey_path}: {exc}"
        if not verdict_signature_ok(verdict, public):
            return False, "fleetyield: attestation verdict signature invalid"
    if verdict.get("node") != node:
        return False, f"fleetyield: attestation verdict is for {verdict.get('node')!r}, not {node!r}"
    issued = verdict.get("time")
    if not isinstance(issued, (int, float)):
        return False, "fleetyield: attestation verdict has no time"
    age = now - float(issued)
    if age > max_age_s:
        return False, f"fleetyield: attestation verdict stale ({age:.0f}s old, max {max_age_s:.0f}s)"
    if age < -CLOCK_SKEW_S:
        return False, f"fleetyield: attestation verdict from the future ({-age:.0f}s ahead)"
    if verdict.get("status") != "pass":
        return False, failure_reason(verdict)
    return True, f"attested {age:.0f}s ago (pcr {str(verdict.get('quote_pcr', ''))[:12]})"
