"""Slurm through its own CLI: read nodes and jobs, execute a plan.

Input: the ``scontrol`` / ``squeue`` binaries (22.05 text output, 24.11+ JSON) reached through an injected
command runner. Output: ``SlurmNode`` / ``JobView`` values for the core, and an ``ApplyReport`` after
executing a ``Plan``. Nothing here decides anything: ``apply`` runs exactly the actions it is given, in order.

Why the CLI and not pyslurm: pyslurm must be built against the exact libslurm of the cluster, and the Slurm
versions Debian ships have no matching release. The CLI is stable, versioned and what admins already trust.

Hostlists are always expanded and compressed by Slurm itself (``scontrol show hostnames|hostlist``): a
hand-rolled parser would disagree with Slurm on some corner (zero padding, multi-dimensional ranges).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurm_fleetyield.core.model import CanaryResult, JobView, SlurmNode, WorkloadClass
from slurm_fleetyield.core.plan import (
    Action,
    CancelCanaries,
    DrainNode,
    Plan,
    RebootNode,
    RequeueJobs,
    ResumeNode,
    SignalJobs,
    SubmitCanary,
    UpdateNodes,
)
from slurm_fleetyield.ports import ActionResult, ApplyReport

log = logging.getLogger(__name__)

JSON_NODES_SINCE = (24, 11)
"""``scontrol show node --json`` is read from this version on; older versions are read as ``-o`` text."""

WORKLOAD_COMMENT_PREFIX = "fy:"
"""Jobs declare their workload class in their comment: ``--comment=fy:decode``."""

NOT_SLURM_KINDS = frozenset({"reset_gpu", "power_cycle", "propose_drain", "withdraw_proposal"})
"""Plan actions ``apply`` skips: the daemon's executor hands them to the node agent, the BMC (Redfish) and
the gate."""

CANARY_JOB_PREFIX = "fy_canary_"
"""Canary jobs are named ``fy_canary_<token>`` (``SubmitCanary.job_name``); the token names the round."""

SACCT_CANARY_FORMAT = "JobID,JobName,State,ExitCode,End,NodeList"

_HOSTLIST_SEPARATOR = "fyhostlistsep"
"""A sentinel host name (no digits, so Slurm never merges it into a range) between batched hostlists."""


# --------------------------------------------------------------------------------------------------------
# Running commands
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str], float], CommandResult]
"""The subprocess seam: ``runner(argv, timeout_s)``. Tests inject a recorder; production runs processes."""


class SlurmCommandError(RuntimeError):
    """A Slurm command failed (non-zero exit, timeout, missing binary, unparsable output)."""

    def __init__(self, command: Sequence[str], returncode: int | None, stderr: str) -> None:
        self.command = tuple(command)
        self.returncode = returncode
        self.stderr = stderr.strip()
        super().__init__(f"{' '.join(self.command)!r} failed (rc={returncode}): {self.stderr[:500]}")


def run_command(argv: Sequence[str], timeout_s: float) -> CommandResult:
    """Run ``argv`` (no shell) with a timeout; timeouts and missing binaries become ``SlurmCommandError``."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(argv, None, f"timed out after {timeout_s:g}s") from None
    except OSError as exc:  # FileNotFoundError, PermissionError
        raise SlurmCommandError(argv, 127, str(exc)) from None
    return CommandResult(proc.returncode, proc.stdout, proc.stderr)


# --------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------

# A key starts a new field only after whitespace: values may contain spaces (OS=Linux 6.1 #1 SMP ...) and
# '=' (CfgTRES=cpu=16,mem=...), but never whitespace followed by an identifier and '='.
_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")
# Slurm appends "[user@time]" to a node's reason; the reason text itself may contain anything.
_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_NULL = {"", "(null)", "N/A", "none", "None"}


def parse_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` / ``slurm-wlm 24.11.1`` -> (22, 5, 8)."""
    match = _VERSION_RE.search(text)
    if not match:
        raise ValueError(f"no Slurm version in {text.strip()!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def parse_kv_line(line: str) -> dict[str, str]:
    """Split one ``scontrol show ... -o`` line into fields (values may hold spaces and '=')."""
    fields: dict[str, str] = {}
    matches = list(_KEY_RE.finditer(line))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(match.group(1), line[match.end() : end].strip())
    return fields


@dataclass(frozen=True, slots=True)
class Reason:
    text: str
    user: str | None = None
    time: str | None = None


def parse_reason(line: str) -> Reason | None:
    """The ``Reason=... [user@time]`` field of a node line, or None when the node has no reason.

    The reason is free text (it may contain ``key=value`` pairs); it ends at its ``[user@time]`` suffix
    when Slurm printed one, otherwise at the next field or the end of the line.
    """
    idx = line.find("Reason=")
    while idx > 0 and not line[idx - 1].isspace():
        idx = line.find("Reason=", idx + 1)
    if idx < 0:
        return None
    rest = line[idx + len("Reason=") :]
    suffix = re.search(r"\s*\[(?P<user>[^@\]\s]*)@(?P<time>[^\]\s]*)\]", rest)
    if suffix:
        text = rest[: suffix.start()].strip()
        return Reason(text, suffix.group("user") or None, suffix.group("time") or None)
    following = _KEY_RE.search(rest)
    text = rest[: following.start()] if following else rest
    text = text.strip()
    return None if text in _NULL else Reason(text)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses: ``gpu:a:2(S:0,1),gpu:b:1`` -> two items."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def parse_gres(gres: str) -> tuple[str | None, int]:
    """``gpu:h100:8(S:0)`` -> ("h100", 8); ``gpu:8`` -> (None, 8); several gpu entries add up."""
    gpu_type: str | None = None
    count = 0
    if gres.strip() in _NULL:
        return None, 0
    for item in split_top_level(gres):
        spec = item.split("(", 1)[0]
        parts = spec.split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            count += 1
            continue
        tail = parts[-1]
        # "gpu:h100:8", "gpu:8", "gpu:h100" (count 1), counts may carry a suffix ("8K" is not used for gpus)
        if tail.isdigit():
            count += int(tail)
            if len(parts) >= 3 and gpu_type is None:
                gpu_type = parts[1]
        else:
            count += 1
            if gpu_type is None:
                gpu_type = tail
    return gpu_type, count


def parse_states(state: str) -> frozenset[str]:
    """``IDLE+DRAIN`` -> {IDLE, DRAIN}; a trailing ``*`` (not responding) becomes NOT_RESPONDING."""
    states: set[str] = set()
    for part in state.split("+"):
        part = part.strip().upper()
        if not part:
            continue
        if part.endswith("*"):
            states.add("NOT_RESPONDING")
            part = part.rstrip("*")
        if part:
            states.add(part)
    return frozenset(states)


def _csv(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        if value.strip() in _NULL:
            return ()
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(str(v) for v in value if str(v))


def _int(value: object, default: int = 0) -> int:
    if isinstance(value, dict):  # Slurm JSON "number" objects: {"set": true, "infinite": false, "number": 5}
        if not value.get("set", True) or value.get("infinite"):
            return default
        value = value.get("number", default)
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True, slots=True)
class NodeDetail:
    """What ``read_nodes`` learned beyond ``SlurmNode`` (who set the reason, when)."""

    reason_user: str | None = None
    reason_time: str | None = None


def parse_node_line(line: str) -> tuple[SlurmNode, NodeDetail] | None:
    """One ``scontrol show node -o`` line (22.05 text) -> SlurmNode, or None for a blank line."""
    line = line.strip()
    if not line:
        return None
    reason = parse_reason(line)
    head = line
    if reason is not None:  # the reason is free text: keep it out of the key=value split
        head = line[: line.find("Reason=")]
    fields = parse_kv_line(head)
    name = fields.get("NodeName")
    if not name:
        raise ValueError(f"no NodeName in {line[:120]!r}")
    gpu_type, gpu_count = parse_gres(fields.get("Gres", ""))
    node = SlurmNode(
        name=name,
        states=parse_states(fields.get("State", "")),
        reason=reason.text if reason else "",
        available_features=_csv(fields.get("AvailableFeatures", fields.get("Features"))),
        active_features=_csv(fields.get("ActiveFeatures")),
        weight=_int(fields.get("Weight"), 1),
        gpu_type=gpu_type,
        gpu_count=gpu_count,
        partitions=_csv(fields.get("Partitions")),
        boot_time=_sacct_time(fields.get("BootTime", "")),
    )
    return node, NodeDetail(reason.user if reason else None, reason.time if reason else None)


def parse_nodes_text(text: str) -> dict[str, tuple[SlurmNode, NodeDetail]]:
    out: dict[str, tuple[SlurmNode, NodeDetail]] = {}
    for line in text.splitlines():
        parsed = parse_node_line(line)
        if parsed is not None:
            out[parsed[0].name] = parsed
    return out


def parse_nodes_json(text: str) -> dict[str, tuple[SlurmNode, NodeDetail]]:
    """``scontrol show node --json`` (data_parser v0.0.40+, Slurm 24.11+)."""
    doc = json.loads(text)
    out: dict[str, tuple[SlurmNode, NodeDetail]] = {}
    for raw in doc.get("nodes", []):
        state = raw.get("state", [])
        states = parse_states("+".join(state)) if isinstance(state, list) else parse_states(str(state))
        gpu_type, gpu_count = parse_gres(str(raw.get("gres") or ""))
        reason_time = raw.get("reason_changed_at")
        node = SlurmNode(
            name=raw["name"],
            states=states,
            reason=str(raw.get("reason") or ""),
            available_features=_csv(raw.get("features")),
            active_features=_csv(raw.get("active_features")),
            weight=_int(raw.get("weight"), 1),
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            partitions=_csv(raw.get("partitions")),
            boot_time=float(_int(raw.get("boot_time"))) or None,
        )
        detail = NodeDetail(
            reason_user=str(raw.get("reason_set_by_user") or "") or None,
            reason_time=str(_int(reason_time)) if reason_time not in (None, 0) else None,
        )
        out[node.name] = (node, detail)
    return out


_WORKLOAD_RE = re.compile(r"(?:^|[^A-Za-z0-9_])" + re.escape(WORKLOAD_COMMENT_PREFIX) + r"([A-Za-z_]+)")


def workload_from_comment(comment: str | None) -> WorkloadClass | None:
    """``fy:decode`` anywhere in the comment (first match wins) -> WorkloadClass.DECODE; unknown -> None."""
    match = _WORKLOAD_RE.search(comment or "")
    if not match:
        return None
    try:
        return WorkloadClass(match.group(1).lower())
    except ValueError:
        return None


def _gpus_from_tres(tres: str | None) -> int:
    """``cpu=8,mem=64G,node=1,gres/gpu=8`` -> 8 (typed entries ``gres/gpu:h100=8`` are the same GPUs)."""
    if not tres:
        return 0
    plain = typed = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            plain = _int(value)
        elif key.startswith("gres/gpu:"):
            typed += _int(value)
    return plain or typed


@dataclass(frozen=True, slots=True)
class _RawJob:
    job_id: int
    state: str
    nodelist: str
    requeue: bool | None
    comment: str
    gpus: int
    gres_detail: tuple[str, ...] = ()  # squeue --json: one "gpu:h100:2(IDX:0-1)" per allocated node
    qos: str = ""  # Slurm's QOS (squeue --json ``qos``, squeue -o %q)
    restarts: int = 0  # squeue --json ``restart_cnt``; the fallback: scontrol show job's ``Restarts=``


_IDX_RE = re.compile(r"\(IDX:([0-9,\-]*)\)")


def gpu_indices(detail: str) -> tuple[int, ...] | None:
    """``gpu:h100:2(IDX:0-1)`` -> (0, 1); ``gpu:2(IDX:0,3-4)`` -> (0, 3, 4); no IDX part -> None (unknown).
    Entries for other GRES (``gpu:1(IDX:0),nic:1``) keep only the GPU's indices."""
    out: list[int] = []
    found = False
    for part in split_top_level(detail):
        if not part.startswith("gpu"):
            continue
        m = _IDX_RE.search(part)
        if m is None:
            return None
        found = True
        for span in filter(None, m.group(1).split(",")):
            lo, _, hi = span.partition("-")
            try:
                a, b = int(lo), int(hi or lo)
            except ValueError:
                return None
            out.extend(range(a, b + 1))
    return tuple(sorted(set(out))) if found else None


def job_gpu_index(nodes: tuple[str, ...], detail: tuple[str, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Pair squeue's per-node ``gres_detail`` (one entry per allocated node, in nodelist order) with the
    expanded nodes; any doubt (count mismatch, an entry without IDX) leaves the job's indices unknown."""
    if not detail or len(detail) != len(nodes):
        return ()
    out = []
    for node, d in zip(nodes, detail, strict=True):
        idx = gpu_indices(d)
        if idx is None:
            return ()
        out.append((node, idx))
    return tuple(out)


def parse_jobs_json(text: str) -> list[_RawJob]:
    """``squeue --json``: 22.05 (v0.0.38: scalar job_state) and 23.02+ (job_state list, number objects)."""
    doc = json.loads(text)
    jobs = []
    for raw in doc.get("jobs", []):
        state = raw.get("job_state", "")
        if isinstance(state, list):
            state = state[0] if state else ""
        requeue = raw.get("requeue")
        detail = raw.get("gres_detail") or ()
        jobs.append(
            _RawJob(
                job_id=_int(raw.get("job_id")),
                state=str(state).upper(),
                nodelist=str(raw.get("nodes") or ""),
                requeue=bool(requeue) if requeue is not None else None,
                comment=str(raw.get("comment") or ""),
                gpus=_gpus_from_tres(raw.get("tres_alloc_str") or raw.get("tres_req_str")),
                gres_detail=tuple(str(d) for d in detail) if isinstance(detail, list) else (),
                qos=str(raw.get("qos") or ""),
                restarts=_int(raw.get("restart_cnt")),
            )
        )
    return jobs


SQUEUE_FORMAT = "%A|%T|%N|%b|%q|%k"
"""Fallback ``squeue -h -o`` format: job id (unique per array element), state, nodelist, gres per node,
QOS, comment (last: it may hold '|')."""


def parse_jobs_text(text: str) -> list[_RawJob]:
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) < 6:
            raise ValueError(f"unexpected squeue line {line[:120]!r} (want {SQUEUE_FORMAT!r})")
        job_id, state, nodelist, gres, qos, comment = parts
        # %b is the per-node GRES request: "gres/gpu:h100:8", "gres:gpu:8" (older), "N/A"
        normalized = ",".join(
            item.removeprefix("gres/").removeprefix("gres:") for item in split_top_level(gres)
        )
        jobs.append(
            _RawJob(
                job_id=_int(job_id),
                state=state.strip().upper(),
                nodelist=nodelist.strip() if nodelist.strip() not in _NULL else "",
                requeue=None,
                comment=comment.strip() if comment.strip() not in _NULL else "",
                gpus=parse_gres(normalized)[1],
                qos=qos.strip() if qos.strip() not in _NULL else "",
            )
        )
    return jobs


def parse_show_jobs(text: str) -> dict[int, tuple[bool, int]]:
    """``scontrol show job -o``: JobId -> (Requeue=1, Restarts=N: how often Slurm requeued and restarted
    the job)."""
    out: dict[int, tuple[bool, int]] = {}
    for line in text.splitlines():
        fields = parse_kv_line(line)
        if "JobId" in fields:
            requeue = fields.get("Requeue", "1").strip() == "1"
            out[_int(fields["JobId"])] = (requeue, _int(fields.get("Restarts", "0")))
    return out


def _sacct_time(text: str) -> float | None:
    """sacct's ``End``: ``2026-01-12T10:00:00`` (the caller's local time), epoch digits, or Unknown/None."""
    text = text.strip()
    if not text or text in _NULL or text == "Unknown":
        return None
    if text.isdigit():
        return float(text)
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _sacct_exit(text: str) -> int | None:
    """``ExitCode`` ``<code>:<signal>`` -> code (a signal makes it 128+signal, as a shell would report)."""
    code, _, sig = text.strip().partition(":")
    try:
        c, s = int(code), int(sig or 0)
    except ValueError:
        return None
    return 128 + s if s and not c else c


def parse_sacct_canaries(text: str, tokens: Mapping[str, str]) -> list[CanaryResult]:
    """``sacct -X -n -P -o JobID,JobName,State,ExitCode,End,NodeList`` lines of canary jobs.

    ``tokens`` maps a round's token to its node: a line whose name is not a known round is skipped. The
    state's first word is kept (``CANCELLED by 0`` -> CANCELLED); array/het suffixes leave the id's digits.
    """
    out: list[CanaryResult] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 6:
            raise ValueError(f"unexpected sacct line {line[:120]!r}")
        job_id, name, state, exit_code, end, nodelist = parts[:6]
        token = name.removeprefix(CANARY_JOB_PREFIX)
        digits = re.match(r"\d+", job_id.strip())
        if not name.startswith(CANARY_JOB_PREFIX) or token not in tokens or not digits:
            continue
        node = nodelist.strip() if nodelist.strip() not in _NULL | {"None assigned"} else tokens[token]
        out.append(
            CanaryResult(
                node=node,
                job_id=int(digits.group()),
                token=token,
                state=(state.split() or [""])[0].upper(),
                exit_code=_sacct_exit(exit_code),
                end_time=_sacct_time(end),
            )
        )
    return out


SACCT_JOB_FORMAT = "JobID,State,ExitCode,Start,End,NodeList"
TERMINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "CANCELLED",
        "OUT_OF_MEMORY",
        "REQUEUED",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


@dataclass(frozen=True, slots=True)
class JobAttempt:
    """One attempt of a job as sacct records it (``-D``: a requeued job has one line per attempt)."""

    job_id: int
    state: str
    exit_code: int | None
    start: float | None
    end: float | None
    nodelist: str


def parse_sacct_jobs(text: str) -> dict[int, list[JobAttempt]]:
    """``sacct -X -D -n -P -o JobID,State,ExitCode,Start,End,NodeList`` -> job id -> attempts."""
    out: dict[int, list[JobAttempt]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 6:
            raise ValueError(f"unexpected sacct line {line[:120]!r}")
        digits = re.match(r"\d+", parts[0].strip())
        if not digits:
            continue
        job_id = int(digits.group())
        nodelist = parts[5].strip()
        out.setdefault(job_id, []).append(
            JobAttempt(
                job_id=job_id,
                state=(parts[1].split() or [""])[0].upper(),
                exit_code=_sacct_exit(parts[2]),
                start=_sacct_time(parts[3]),
                end=_sacct_time(parts[4]),
                nodelist="" if nodelist in _NULL or nodelist == "None assigned" else nodelist,
            )
        )
    return out


def _time_limit(seconds: float) -> str:
    """Slurm ``--time`` in whole minutes (Slurm's resolution), at least one."""
    return str(max(1, math.ceil(seconds / 60.0)))


@dataclass(frozen=True, slots=True)
class CanarySpec:
    """How a canary job is submitted (``[canary]`` in the config)."""

    command: str = "fleetyield-agent check --state-dir /var/lib/fleetyield-agent --json"
    constraint: str = "fy_canary"
    time_limit_s: float | None = None  # None: the action's time_limit_s (core lifecycle params)
    partition: str | None = None
    extra_args: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------------
# The adapter
# --------------------------------------------------------------------------------------------------------


class SlurmCli:
    """``SlurmPort`` over ``scontrol``/``squeue``. All commands go through ``runner`` with ``timeout_s``."""

    def __init__(
        self,
        bin_dir: str | None = None,
        timeout_s: float = 30.0,
        runner: Runner = run_command,
        version: tuple[int, int, int] | None = None,
        canary: CanarySpec | None = None,
    ) -> None:
        self.canary = canary or CanarySpec()
        self._bin_dir = bin_dir
        self._timeout_s = timeout_s
        self._runner = runner
        self._version = version
        self._hostnames_cache: dict[str, tuple[str, ...]] = {}
        self.node_details: dict[str, NodeDetail] = {}
        """Reason user/time of each node at the last ``read_nodes`` (for explain/audit, not for decisions)."""
        self.calls = 0
        """Slurm commands executed by this adapter since it was created (reads and writes)."""

    # -- plumbing -------------------------------------------------------------------------------------

    def _bin(self, name: str) -> str:
        return os.path.join(self._bin_dir, name) if self._bin_dir else name

    def _run(self, *argv: str) -> str:
        return self._exec((self._bin(argv[0]), *argv[1:]))

    def _exec(self, command: tuple[str, ...]) -> str:
        self.calls += 1
        result = self._runner(command, self._timeout_s)
        if result.returncode != 0:
            raise SlurmCommandError(command, result.returncode, result.stderr or result.stdout)
        return result.stdout

    def version(self) -> tuple[int, int, int]:
        if self._version is None:
            out = self._run("scontrol", "--version")
            try:
                self._version = parse_version(out)
            except ValueError as exc:
                raise SlurmCommandError((self._bin("scontrol"), "--version"), 0, str(exc)) from None
        return self._version

    # -- hostlists ------------------------------------------------------------------------------------

    def expand_hostlists(self, expressions: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """Expand hostlist expressions with ``scontrol show hostnames``, all unknown ones in ONE call.

        Expressions are separated by a sentinel host name; Slurm keeps input order. If the sentinel count
        comes back wrong (a Slurm that sorts or merges), each expression is expanded on its own instead.
        Expansions are cached: a hostlist always expands to the same names.
        """
        wanted = {e for e in expressions if e}
        todo = sorted(e for e in wanted if e not in self._hostnames_cache and "[" in e)
        for expr in wanted:
            if "[" not in expr and expr not in self._hostnames_cache:
                self._hostnames_cache[expr] = tuple(h for h in expr.split(",") if h)
        if len(todo) == 1:
            self._hostnames_cache[todo[0]] = tuple(
                self._run("scontrol", "show", "hostnames", todo[0]).split()
            )
        elif todo:
            joined = ",".join(f"{e},{_HOSTLIST_SEPARATOR}" for e in todo)
            names = self._run("scontrol", "show", "hostnames", joined).split()
            groups: list[list[str]] = [[]]
            for name in names:
                if name == _HOSTLIST_SEPARATOR:
                    groups.append([])
                else:
                    groups[-1].append(name)
            # every expression names at least one host, so a well-ordered answer has no empty group
            if len(groups) == len(todo) + 1 and not groups[-1] and all(groups[:-1]):
                for expr, group in zip(todo, groups, strict=False):
                    self._hostnames_cache[expr] = tuple(group)
            else:
                log.warning("batched hostlist expansion came back out of order; expanding one by one")
                for expr in todo:
                    out = self._run("scontrol", "show", "hostnames", expr)
                    self._hostnames_cache[expr] = tuple(out.split())
        return {e: self._hostnames_cache[e] for e in wanted}

    def compress_hostlist(self, nodes: Sequence[str]) -> str:
        """``scontrol show hostlist a1,a2,a3`` -> ``a[1-3]``; a single node needs no call.

        Names are sorted first: Slurm keeps input order (``a[2,1]``), sorted input compresses best.
        """
        if len(nodes) == 1:
            return nodes[0]
        return self._run("scontrol", "show", "hostlist", ",".join(sorted(nodes))).strip()

    # -- reads ----------------------------------------------------------------------------------------

    def read_nodes(self) -> Mapping[str, SlurmNode]:
        if self.version()[:2] >= JSON_NODES_SINCE:
            command = ("scontrol", "show", "node", "--json")
            parse = parse_nodes_json
        else:
            command = ("scontrol", "show", "node", "-o")
            parse = parse_nodes_text
        out = self._run(*command)
        try:
            parsed = parse(out)
        except (ValueError, KeyError, TypeError) as exc:
            raise SlurmCommandError(command, 0, f"unparsable output: {exc}") from None
        self.node_details = {name: detail for name, (_, detail) in parsed.items()}
        return {name: node for name, (node, _) in parsed.items()}

    def read_jobs(self) -> Sequence[JobView]:
        try:
            raw = parse_jobs_json(self._run("squeue", "--json"))
        except (SlurmCommandError, ValueError, KeyError, TypeError) as exc:
            log.info("squeue --json unavailable (%s); falling back to squeue -o", exc)
            command = ("squeue", "-h", "-o", SQUEUE_FORMAT)
            try:
                raw = parse_jobs_text(self._run(*command))
            except ValueError as err:
                raise SlurmCommandError(command, 0, f"unparsable output: {err}") from None
            if raw:
                shown = parse_show_jobs(self._run("scontrol", "show", "job", "-o"))
                raw = [
                    replace(j, requeue=requeue, restarts=restarts)
                    for j in raw
                    for requeue, restarts in [shown.get(j.job_id, (None, 0))]
                ]
        return job_views(raw, self.expand_hostlists(j.nodelist for j in raw))

    # -- writes ---------------------------------------------------------------------------------------

    def commands_for(self, action: Action, hostlist: str | None = None) -> list[tuple[str, ...]]:
        """The Slurm commands that execute ``action`` (``hostlist``: the compressed NodeName value)."""
        scontrol = self._bin("scontrol")
        if isinstance(action, UpdateNodes):
            # Both lists in one call: Slurm checks Active against the NEW Available list, so replacing an
            # active fy_ feature works in one step. An empty value clears the list (verified on 22.05.8:
            # "AvailableFeatures= ActiveFeatures=" leaves AvailableFeatures=(null)).
            features = ",".join(action.features)
            return [
                (
                    scontrol,
                    "update",
                    f"NodeName={hostlist or ','.join(action.nodes)}",
                    f"AvailableFeatures={features}",
                    f"ActiveFeatures={features}",
                    f"Weight={action.weight}",
                )
            ]
        if isinstance(action, DrainNode):
            commands = [
                (scontrol, "update", f"NodeName={action.node}", "State=DRAIN", f"Reason={action.reason}")
            ]
            if action.requeue_jobs:
                commands.append(_requeue(scontrol, action.requeue_jobs))
            return commands
        if isinstance(action, RequeueJobs):
            return [_requeue(scontrol, action.jobs)]
        if isinstance(action, SignalJobs):
            # steps: no --batch/--full, every step of the job gets it (the training processes), not the batch
            # shell (which a signal it does not trap would kill); batch: only the batch script, which traps it
            where = ("--batch",) if action.target == "batch" else ()
            return [(self._bin("scancel"), *where, f"--signal={action.signal}", *map(str, action.jobs))]
        if isinstance(action, ResumeNode):
            return [(scontrol, "update", f"NodeName={action.node}", "State=RESUME")]
        if isinstance(action, RebootNode):
            # No ASAP and no nextstate: the node is already drained by us; a plain reboot keeps DRAIN and our
            # reason across the reboot (core/rehab_actions.py says why).
            command = [scontrol, "reboot"]
            if action.next_state:
                command.append(f"nextstate={action.next_state}")
            return [(*command, f"Reason={action.reason}", action.node)]
        if isinstance(action, SubmitCanary):
            spec = self.canary
            limit = spec.time_limit_s if spec.time_limit_s is not None else action.time_limit_s
            sbatch = (
                self._bin("sbatch"),
                "--parsable",
                "-w",
                action.node,
                f"--constraint={spec.constraint}",
                "--exclusive",
                # A canary's verdict is its one run on this node: a drain's requeue (quarantine requeues
                # running jobs) must not turn a failed check into a re-run or a CANCELLED.
                "--no-requeue",
                f"--time={_time_limit(limit)}",
                f"--job-name={action.job_name}",
                "--comment=fy:canary",
                "--output=/dev/null",
                *((f"--partition={spec.partition}",) if spec.partition else ()),
                *spec.extra_args,
                "--wrap",
                spec.command,
            )
            return [sbatch] * action.count
        if isinstance(action, CancelCanaries):
            return [(self._bin("scancel"), f"--name={action.job_name}")]
        raise TypeError(f"unknown action {action!r}")

    # -- accounting -----------------------------------------------------------------------------------

    def read_job_attempts(self, job_ids: Sequence[int]) -> dict[int, list[JobAttempt]]:
        """Every recorded attempt of the given jobs (one sacct call); needs slurmdbd."""
        if not job_ids:
            return {}
        ids = ",".join(str(j) for j in sorted(set(job_ids)))
        command = ("sacct", "-X", "-D", "-n", "-P", "-a", "-j", ids, "-o", SACCT_JOB_FORMAT)
        try:
            return parse_sacct_jobs(self._run(*command))
        except ValueError as exc:
            raise SlurmCommandError(command, 0, f"unparsable output: {exc}") from None

    # -- canaries -------------------------------------------------------------------------------------

    def read_canaries(self, tokens: Mapping[str, str], since: float) -> list[CanaryResult]:
        """Canary jobs of the given rounds (token -> node) since ``since``: sacct, then squeue for the ones
        accounting does not show yet (or at all, without slurmdbd: then only pending/running are seen)."""
        if not tokens:
            return []
        names = ",".join(f"{CANARY_JOB_PREFIX}{t}" for t in sorted(tokens))
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since))
        results: list[CanaryResult] = []
        command = ("sacct", "-X", "-n", "-P", "-a", f"--name={names}", "-S", start, "-o", SACCT_CANARY_FORMAT)
        try:
            results = parse_sacct_canaries(self._run(*command), tokens)
        except SlurmCommandError as exc:
            log.info("sacct unavailable for canaries (%s); squeue only", exc)
        except ValueError as exc:
            raise SlurmCommandError(command, 0, f"unparsable output: {exc}") from None
        seen = {r.job_id for r in results}
        command = ("squeue", "-h", "-n", names, "-o", "%A|%j|%T|%N")
        for line in self._run(*command).splitlines():
            parts = line.split("|")
            if len(parts) < 4 or not parts[0].strip().isdigit():
                continue
            job_id, token = int(parts[0]), parts[1].removeprefix(CANARY_JOB_PREFIX)
            if job_id in seen or token not in tokens:
                continue
            node = parts[3].strip() if parts[3].strip() not in _NULL else tokens[token]
            results.append(CanaryResult(node, job_id, token, parts[2].strip().upper()))
        return results

    def apply(self, plan: Plan) -> ApplyReport:
        """Execute every action in order. A failing action is recorded and the next one still runs.

        Actions of ``NOT_SLURM_KINDS`` are skipped (no result): the daemon's executor runs them (GPU resets
        through the agent, proposals through the gate). Drains are batched: a run of consecutive drains with
        the same reason is one ``scontrol update NodeName=<hostlist> State=DRAIN`` and one ``scontrol
        requeue`` of all their jobs (every node drained before any of its jobs is requeued, as one drain
        does); if the batch fails, its drains run one by one, so each gets its own result. A mass failure of
        1,000 nodes is then a handful of calls, not 2,000 (bench/bench_reconcile.py --mass-failure)."""
        start_calls = self.calls
        actions = [a for a in plan.actions if a.kind not in NOT_SLURM_KINDS]
        results: list[ActionResult] = []
        i = 0
        while i < len(actions):
            batch = _drain_batch(actions, i)
            drains = [a for a in batch if isinstance(a, DrainNode)]
            if len(drains) > 1 and (done := self._drain_together(drains)) is not None:
                results.extend(done)
            else:
                results.extend(self._apply_one(a) for a in batch)
            i += len(batch)
        return ApplyReport(tuple(results), calls=self.calls - start_calls)

    def _apply_one(self, action: Action) -> ActionResult:
        executed: tuple[str, ...] = ()
        try:
            hostlist = None
            if isinstance(action, UpdateNodes):
                hostlist = self.compress_hostlist(action.nodes)
            for command in self.commands_for(action, hostlist):
                executed = command
                self._exec(command)
            return ActionResult(action, True, executed)
        except SlurmCommandError as exc:
            log.error("slurm action failed: %s", exc)
            return ActionResult(action, False, exc.command, str(exc))

    def _drain_together(self, batch: Sequence[DrainNode]) -> list[ActionResult] | None:
        """One drain command over the batch's hostlist, then one requeue of their jobs; None if the drain
        failed (nothing of it is trusted: the caller drains one by one)."""
        scontrol = self._bin("scontrol")
        try:
            hostlist = self.compress_hostlist([d.node for d in batch])
            drain = (scontrol, "update", f"NodeName={hostlist}", "State=DRAIN", f"Reason={batch[0].reason}")
            self._exec(drain)
        except SlurmCommandError as exc:
            log.warning("batched drain of %d nodes failed, draining one by one: %s", len(batch), exc)
            return None
        jobs = tuple(dict.fromkeys(j for d in batch for j in d.requeue_jobs))
        if not jobs:
            return [ActionResult(d, True, drain) for d in batch]
        requeue = _requeue(scontrol, jobs)
        try:
            self._exec(requeue)
        except SlurmCommandError as exc:
            log.error("slurm action failed: %s", exc)
            return [
                ActionResult(d, False, requeue, str(exc)) if d.requeue_jobs else ActionResult(d, True, drain)
                for d in batch
            ]
        return [ActionResult(d, True, requeue if d.requeue_jobs else drain) for d in batch]


class DryRunSlurm:
    """Reads Slurm for real; ``apply`` only logs the commands it would run and reports zero calls."""

    def __init__(self, inner: SlurmCli, logger: logging.Logger | None = None) -> None:
        self.inner = inner
        self._log = logger or log

    def read_nodes(self) -> Mapping[str, SlurmNode]:
        return self.inner.read_nodes()

    def read_jobs(self) -> Sequence[JobView]:
        return self.inner.read_jobs()

    def apply(self, plan: Plan) -> ApplyReport:
        results = []
        for action in plan.actions:
            if action.kind in NOT_SLURM_KINDS:
                continue
            try:
                commands = self.inner.commands_for(action)
            except SlurmCommandError as exc:
                results.append(ActionResult(action, False, exc.command, f"dry-run: {exc.stderr}"))
                continue
            for command in commands:
                self._log.info("dry-run: would run %s", " ".join(command))
            results.append(ActionResult(action, True, commands[-1], "dry-run: not executed"))
        return ApplyReport(tuple(results), calls=0)

    def read_canaries(self, tokens: Mapping[str, str], since: float) -> list[CanaryResult]:
        return self.inner.read_canaries(tokens, since)

    def read_job_attempts(self, job_ids: Sequence[int]) -> dict[int, list[JobAttempt]]:
        return self.inner.read_job_attempts(job_ids)

    def expand_hostlists(self, expressions: Iterable[str]) -> dict[str, tuple[str, ...]]:
        return self.inner.expand_hostlists(expressions)

    @property
    def node_details(self) -> dict[str, NodeDetail]:
        return self.inner.node_details


def _drain_batch(actions: Sequence[Action], start: int) -> list[Action]:
    """``actions[start]`` and, if it is a drain, the consecutive drains after it with the same reason."""
    first = actions[start]
    if not isinstance(first, DrainNode):
        return [first]
    batch: list[Action] = [first]
    for a in actions[start + 1 :]:
        if not isinstance(a, DrainNode) or a.reason != first.reason:
            break
        batch.append(a)
    return batch


def job_views(raw: Sequence[_RawJob], expanded: Mapping[str, tuple[str, ...]]) -> list[JobView]:
    """The jobs as the decisions see them (both Slurm adapters): ``expanded``, each hostlist's nodes."""
    views = []
    for j in raw:
        nodes = expanded.get(j.nodelist, ())
        views.append(
            JobView(
                job_id=j.job_id,
                state=j.state,
                nodes=nodes,
                requeue=True if j.requeue is None else j.requeue,
                workload=workload_from_comment(j.comment),
                gpus=j.gpus,
                gpu_index=job_gpu_index(nodes, j.gres_detail),
                qos=j.qos,
                restarts=j.restarts,
            )
        )
    return views


def _requeue(scontrol: str, jobs: Sequence[int]) -> tuple[str, ...]:
    """``scontrol requeue 11,12``: back to PENDING (a drain's jobs, or premium reclaim's)."""
    return (scontrol, "requeue", ",".join(str(j) for j in jobs))
