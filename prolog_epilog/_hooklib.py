"""Shared plumbing of the Slurm Prolog/Epilog hooks (stdlib only, cheap to import).

Input: the hook config file and the environment slurmd gives a Prolog/Epilog. Output:
a ``HookConfig``, log lines (stderr + a log file), atomic file writes, a hard
whole-process deadline, and the dcgm-exporter ``--hpc-job-mapping-dir`` helpers.

Config file: ``/etc/fleetyield/hooks.conf`` (path overridable with the env variable
``FLEETYIELD_HOOKS_CONF``). Either flat ``KEY=VALUE`` lines (shell style, ``#``
comments, optional quotes, keys case-insensitive) or TOML (top level or a ``[hooks]``
table). Every key can also be overridden by an env variable ``FLEETYIELD_<KEY>`` (upper
case), e.g. ``FLEETYIELD_CONTROLLER_URL``. Note that slurmd builds the hook
environment from scratch, so on a real node only the file matters; env overrides are
for tests and manual runs, and a job's user cannot inject them.

Keys (defaults)::

    agent_state_dir = /var/lib/fleetyield-agent    # holds the agent's fatal.json
    hpc_job_dir     = /run/fleetyield/hpc-jobs     # dcgm-exporter --hpc-job-mapping-dir
    controller_url  =                              # e.g. http://fy-ctl:8700; empty: no gate query;
                                                   # several, comma-separated (two controllers in high
                                                   # availability): asked in turn, the first answer counts
    timeout_ms      = 200                          # controller gate HTTP timeout
    hard_timeout_ms = 2000                         # whole-hook deadline, then exit 0
    spool_dir       = /var/spool/fleetyield        # outcomes/ and jobs/ live here
    log_file        = /var/log/fleetyield/hooks.log  # empty: stderr only
    node_name       =                              # empty: $SLURMD_NODENAME, else short hostname
    hpc_job_mapping = true                         # write/remove the dcgm-exporter mapping
    attest          = false                        # tenant-isolation attestation (attest_gate.py)
    attest_areas    = /tmp/fy-job-{job_id}         # per-job areas the Epilog wipes, comma-separated
    attest_max_age_s = 3600                        # the Prolog denies on an older verdict
    attest_controller_pubkey =                     # controller's key line; empty: the agent checked it
    healthcheck_grace_s = 120                      # healthcheck.py: controller silent this long: drain here
    scontrol        = scontrol                     # healthcheck.py: scontrol to run (PATH, else /usr/bin)
    attest_root     = /                            # prefix of the re-checked paths (tests: a fixture)
    attest_recheck  = kernel/modules,kernel/tainted,kernel/knobs,/etc/ld.so.preload
                                                   # records the Prolog recomputes against the verdict
    attest_uid_min  = 1000                         # uids from here up are tenants (the Epilog's wipe)

How the hooks authenticate to a controller whose ``api`` listener has a web-config file (TLS, basic auth):
the agent's ``push_basic_auth``/``push_tls_config`` settings, named for ``controller_url`` (``_controller``
sends them with every request to the controller: the Prolog's gate query, the health check's /healthz)::

    controller_basic_auth_username      =          # a user of the web-config's basic_auth_users
    controller_basic_auth_password_file =          # its password, read at every request (never inline)
    controller_tls_config_ca_file       =          # CA of the controller's certificate (https:// URLs);
                                                   # empty: the system's trust store
    controller_tls_config_cert_file     =          # client certificate, when the web-config asks for one
    controller_tls_config_key_file      =          # its key (both or neither)

In TOML the two groups may also be tables shaped like the agent's: ``controller_basic_auth = {username =
"...", password_file = "..."}``, ``[hooks.controller_tls_config]``.

With ``attest`` on, the Epilog invalidates the node's verdict (``<agent_state_dir>/attest-verdict.json``),
wipes the job's areas, asks the agent to scrub its GPUs and then for a fresh hand-over; the Prolog
denies (fail-closed, unlike the controller gate) unless that verdict is a fresh, signed pass.

Why a bad config never blocks jobs: a non-zero Prolog makes Slurm drain the node and
requeue the job. A typo pushed fleet-wide by config management would otherwise drain
every GPU node at its next job start, i.e. take the whole cluster down because of a
reliability add-on. So a config file that cannot be read or parsed, an unknown key or a
bad value is logged loudly and the defaults are used; the defaults themselves are
fail-open (no controller query), and the agent's fatal marker is still honoured.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from types import FrameType

DEFAULT_CONF_PATH = "/etc/fleetyield/hooks.conf"
CONF_ENV = "FLEETYIELD_HOOKS_CONF"
ENV_PREFIX = "FLEETYIELD_"
DEFAULT_HARD_TIMEOUT_MS = 2000
VERDICT_FILE = "attest-verdict.json"

# Declared workload classes (keep in sync with job_submit.lua).
CLASSES = ("decode", "pretrain", "finetune", "batch", "canary")


class HookConfig:
    """Settings of the prolog and epilog (see the module docstring for the file format).

    A plain class, not a dataclass: ``dataclasses`` pulls in ``inspect`` (~8 ms), and
    this runs before every job.
    """

    DEFAULTS: dict[str, str | int | bool] = {
        "agent_state_dir": "/var/lib/fleetyield-agent",
        "hpc_job_dir": "/run/fleetyield/hpc-jobs",
        "controller_url": "",
        "timeout_ms": 200,
        "hard_timeout_ms": DEFAULT_HARD_TIMEOUT_MS,
        "spool_dir": "/var/spool/fleetyield",
        "log_file": "/var/log/fleetyield/hooks.log",
        "node_name": "",
        "hpc_job_mapping": True,
        "attest": False,
        "attest_areas": "/tmp/fy-job-{job_id}",
        "attest_max_age_s": 3600,
        "attest_controller_pubkey": "",
        "healthcheck_grace_s": 120,
        "scontrol": "scontrol",
        "attest_root": "/",
        "attest_recheck": "kernel/modules,kernel/tainted,kernel/knobs,/etc/ld.so.preload",
        "attest_uid_min": 1000,
        "controller_basic_auth_username": "",
        "controller_basic_auth_password_file": "",
        "controller_tls_config_ca_file": "",
        "controller_tls_config_cert_file": "",
        "controller_tls_config_key_file": "",
    }

    agent_state_dir: str
    hpc_job_dir: str
    controller_url: str
    timeout_ms: int
    hard_timeout_ms: int
    spool_dir: str
    log_file: str
    node_name: str
    hpc_job_mapping: bool
    attest: bool
    attest_areas: str
    attest_max_age_s: int
    attest_controller_pubkey: str
    healthcheck_grace_s: int
    scontrol: str
    attest_root: str
    attest_recheck: str
    attest_uid_min: int
    controller_basic_auth_username: str
    controller_basic_auth_password_file: str
    controller_tls_config_ca_file: str
    controller_tls_config_cert_file: str
    controller_tls_config_key_file: str

    def __init__(self, **values: str | int | bool) -> None:
        for key, default in self.DEFAULTS.items():
            setattr(self, key, values.pop(key, default))
        if values:
            raise TypeError(f"unknown config keys: {sorted(values)}")

    @property
    def controller_urls(self) -> list[str]:
        """``controller_url`` split at commas: the controllers to ask, in order."""
        return [u.strip() for u in str(self.controller_url).split(",") if u.strip()]

    @property
    def verdict_file(self) -> str:
        """Where the agent writes the node's attestation verdict (node_agent.attest.config.VERDICT_FILE)."""
        return os.path.join(self.agent_state_dir, VERDICT_FILE)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.DEFAULTS)
        return f"HookConfig({inner})"


class Logger:
    """Syslog-style lines to stderr (slurmd keeps a hook's output in its log: at error
    level when the hook fails, at debug2 otherwise) and appended to a log file."""

    def __init__(self, tag: str, job_id: str = "-") -> None:
        self.tag = tag
        self.job_id = job_id
        self.node = "-"
        self.log_file = ""
        self.lines: list[str] = []  # lines logged before the log file was known

    def set_log_file(self, path: str) -> None:
        self.log_file = path
        pending, self.lines = self.lines, []
        for line in pending:
            self._to_file(line)

    def __call__(self, level: str, msg: str) -> None:
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        line = f"{stamp} {self.node} {self.tag}[{os.getpid()}]: {level} job={self.job_id} {msg}\n"
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        if self.log_file:
            self._to_file(line)
        else:
            self.lines.append(line)

    def _to_file(self, line: str) -> None:
        # One O_APPEND write per line: concurrent hooks (several jobs starting on one node)
        # never interleave inside a line. Opened per line so logrotate's rename just works.
        try:
            directory = os.path.dirname(self.log_file)
            if directory:
                os.makedirs(directory, mode=0o755, exist_ok=True)
            fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            try:
                os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            self.log_file = ""  # stderr only from now on; never fail the hook over a log


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _coerce(key: str, raw: object) -> str | int | bool:
    kind = type(HookConfig.DEFAULTS[key])
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        return _parse_bool(str(raw))
    if kind is int:
        if isinstance(raw, bool):
            raise ValueError(f"not an integer: {raw!r}")
        value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        if value <= 0:
            raise ValueError(f"must be > 0: {value}")
        return value
    if not isinstance(raw, str):
        raise ValueError(f"not a string: {raw!r}")
    return raw.strip()


def _parse_simple(text: str) -> dict[str, str] | None:
    """Flat ``key = value`` lines; ``None`` when the text needs a real TOML parser."""
    out: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            if line.strip("[] ").lower() not in ("hooks", "fleetyield.hooks"):
                return None
            continue
        if "=" not in line:
            return None
        key, _, value = line.partition("=")
        key = key.strip().lower()
        if key.startswith("export "):
            key = key[len("export ") :].strip()
        value = value.strip()
        if value[:1] in ("'", '"'):
            quote = value[0]
            end = value.find(quote, 1)
            if end < 0:
                return None
            rest = value[end + 1 :].strip()
            if rest and not rest.startswith("#"):
                return None
            value = value[1:end]
        else:
            value = value.split(" #", 1)[0].strip()
            if value[:1] in ("[", "{"):
                return None
        out[key] = value
    return out


def _parse_file(text: str) -> Mapping[str, object]:
    simple = _parse_simple(text)
    if simple is not None:
        return simple
    import tomllib  # only for files the flat parser cannot read (a few ms)

    doc = tomllib.loads(text)
    hooks = doc.get("hooks")
    return _flatten(hooks if isinstance(hooks, dict) else doc)


def _flatten(table: Mapping[str, object]) -> dict[str, object]:
    """A table's sub-tables as prefixed keys: ``controller_basic_auth = {username = "u"}`` is
    ``controller_basic_auth_username = "u"``, the flat file's spelling."""
    out: dict[str, object] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update({f"{key}_{sub}": v for sub, v in value.items()})
        else:
            out[key] = value
    return out


def load_config(env: Mapping[str, str], log: Callable[[str, str], None]) -> HookConfig:
    """Defaults, then the config file, then ``FLEETYIELD_<KEY>`` env overrides.

    Never raises: every problem is logged and the offending value keeps its default.
    """
    path = env.get(CONF_ENV) or DEFAULT_CONF_PATH
    values: dict[str, object] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        if CONF_ENV in env:
            log("ERROR", f"config file {path} ({CONF_ENV}) not found; using defaults")
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        log("ERROR", f"cannot read config file {path}: {exc}; using defaults")
        text = ""
    if text:
        try:
            values.update({str(k).lower(): v for k, v in _parse_file(text).items()})
        except Exception as exc:
            log("ERROR", f"config file {path} does not parse ({exc}); using defaults")
            values = {}
    for key in HookConfig.DEFAULTS:
        env_value = env.get(ENV_PREFIX + key.upper())
        if env_value is not None:
            values[key] = env_value
    changes: dict[str, str | int | bool] = {}
    for key, raw in values.items():
        if key not in HookConfig.DEFAULTS:
            log("ERROR", f"config {path}: unknown key {key!r} ignored")
            continue
        try:
            changes[key] = _coerce(key, raw)
        except (ValueError, TypeError) as exc:
            log("ERROR", f"config {path}: bad value for {key!r} ({exc}); keeping default")
    return HookConfig(**changes)


def node_name(config: HookConfig, env: Mapping[str, str]) -> str:
    if config.node_name:
        return config.node_name
    if env.get("SLURMD_NODENAME"):
        return env["SLURMD_NODENAME"]
    import socket

    return socket.gethostname().split(".", 1)[0]


def valid_job_id(job_id: str | None) -> bool:
    """Slurm job ids are unsigned integers; anything else is not used in file names."""
    return bool(job_id) and job_id.isascii() and job_id.isdigit() and len(job_id) <= 12  # type: ignore[union-attr]


def parse_gpu_list(raw: str | None) -> list[int]:
    """``"0,2-3"`` -> ``[0, 2, 3]``; non-numeric entries (UUIDs, ``NoDevFiles``) are skipped."""
    out: list[int] = []
    if not raw:
        return out
    for part in raw.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if lo.isdigit() and (not sep or hi.isdigit()):
            start, end = int(lo), int(hi) if sep else int(lo)
            if end - start > 1024:
                continue
            out.extend(range(start, end + 1))
    return sorted(set(out))


def job_gpus(env: Mapping[str, str]) -> list[int]:
    """The job's GPU indices on this node, as the hook sees them.

    Prolog/Epilog run outside the job's cgroup, so ``CUDA_VISIBLE_DEVICES`` there holds
    the real device indices (a job on /dev/nvidia3 sees "0" inside but the hook sees
    "3"). ``SLURM_JOB_GPUS`` is documented for the Prolog (newer Slurm sets it in the
    Epilog too); ``GPU_DEVICE_ORDINAL`` is the last resort.
    """
    for name in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        gpus = parse_gpu_list(env.get(name))
        if gpus:
            return gpus
    return []


def class_from(comment: str | None, partition: str | None) -> tuple[str | None, str | None]:
    """(class, source) the way job_submit.lua derives it: ``fy:<class>`` in the comment,
    else a partition named like a class. Unknown ``fy:`` values give (None, None)."""
    for token in (comment or "").replace(",", " ").replace(";", " ").split():
        if token.lower().startswith("fy:"):
            value = token[3:].lower()
            return (value, "comment") if value in CLASSES else (None, None)
    for part in (partition or "").split(","):
        if part.strip().lower() in CLASSES:
            return part.strip().lower(), "partition"
    return None, None


def atomic_write(path: str, data: bytes, mode: int = 0o644, tmp_name: str | None = None) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory + rename.

    Temp names start with a dot and are never all digits, so dcgm-exporter (which only
    reads files whose name parses as an integer) never sees a half-written file.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, tmp_name or f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        _fill(fd, data, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fill(fd: int, data: bytes, mode: int) -> None:
    """Write ``data`` to the fresh temp file ``fd``, set ``mode`` (the umask is not ours), close it."""
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def write_new(path: str, data: bytes, mode: int = 0o644) -> None:
    """Atomically create ``path``; ``FileExistsError`` if it exists (nothing clobbered)."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        _fill(fd, data, mode)
        os.link(tmp, path)  # atomic, fails if path exists
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def mapping_tmp_name(gpu: int, job_id: str) -> str:
    return f".{gpu}.{job_id}.tmp"


def write_hpc_job_mapping(directory: str, gpus: Iterable[int], job_id: str) -> list[int]:
    """dcgm-exporter ``--hpc-job-mapping-dir``: one file per GPU index, named by the
    index, holding job ids one per line. GPUs are allocated exclusively by gres/gpu, so
    the file is replaced by this job's id (a stale id of a job whose epilog never ran
    is dropped). Returns the GPUs written."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    written = []
    for gpu in gpus:
        atomic_write(
            os.path.join(directory, str(gpu)),
            f"{job_id}\n".encode(),
            tmp_name=mapping_tmp_name(gpu, job_id),
        )
        written.append(gpu)
    return written


def remove_hpc_job_mapping(directory: str, job_id: str) -> tuple[list[int], list[int]]:
    """Drop ``job_id`` from every mapping file of ``directory``; never touch other ids.

    A file holding only this job id is unlinked; a file also naming other jobs (shared
    GPU) is rewritten without this id. Leftover temp files of this job (a prolog
    killed mid-write) are removed. Returns (files removed, files rewritten) as GPU
    indices. The whole directory is scanned rather than trusting the Epilog env, which
    may lack the GPU list on some Slurm versions.
    """
    removed: list[int] = []
    rewritten: list[int] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed, rewritten
    suffix = f".{job_id}.tmp"
    for name in names:
        path = os.path.join(directory, name)
        if name.startswith(".") and name.endswith(suffix):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        if not (name.isascii() and name.isdigit()):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines = [line.strip() for line in fh.read().splitlines() if line.strip()]
        except (FileNotFoundError, IsADirectoryError):
            continue
        if job_id not in lines:
            continue
        rest = [line for line in lines if line != job_id]
        if rest:
            atomic_write(
                path, ("\n".join(rest) + "\n").encode(), tmp_name=mapping_tmp_name(int(name), job_id)
            )
            rewritten.append(int(name))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(int(name))
    return sorted(removed), sorted(rewritten)


class HookTimeout(BaseException):
    """Raised from SIGALRM when the hook's hard deadline passes (BaseException so that
    no ``except Exception`` on the way can swallow it)."""


def arm_deadline(seconds: float, on_second_expiry: Callable[[], None]) -> float:
    """Arm SIGALRM: first expiry raises ``HookTimeout``; if that is somehow swallowed or
    the process is still alive 0.5 s later, ``on_second_expiry`` runs and must exit.
    Returns the monotonic deadline."""
    state = {"fired": 0}

    def handler(signum: int, frame: FrameType | None) -> None:
        state["fired"] += 1
        if state["fired"] == 1:
            raise HookTimeout
        on_second_expiry()

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.5)
    return time.monotonic() + seconds


CLI_FLAGS = ("--help", "-h", "--version")


def asked_for_cli(argv: Iterable[str]) -> bool:
    """A person asked for ``--help`` / ``--version`` (slurmd passes no arguments): answer that
    (``prolog_epilog._cli``, click) and do not run the hook."""
    return any(arg in CLI_FLAGS for arg in argv)


def begin(
    env: Mapping[str, str], log: Logger, on_second_expiry: Callable[[], None]
) -> tuple[float, HookConfig, float, str]:
    """A hook's first steps: the default deadline armed before reading the config (a hung /etc mount must
    not hang the job), then the config and its log file, the deadline re-armed with the configured value
    less the time spent, and the node name (set on ``log``). Returns (started, config, deadline, node):
    ``started`` on the monotonic clock, ``deadline`` as ``arm_deadline`` returns it."""
    started = time.monotonic()
    arm_deadline(DEFAULT_HARD_TIMEOUT_MS / 1000.0, on_second_expiry)
    config = load_config(env, log)
    log.set_log_file(config.log_file)
    left = config.hard_timeout_ms / 1000.0 - (time.monotonic() - started)
    deadline = arm_deadline(max(left, 0.001), on_second_expiry)
    node = node_name(config, env)
    log.node = node
    return started, config, deadline, node


def disarm_deadline() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
