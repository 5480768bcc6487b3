"""``fleetyield doctor``: check a real installation and say what to fix.

Input: the controller's config file and the world it points at: Slurm (through the same command seam as the
Slurm adapter), the agents (HTTP), the key files, the store, the clock. Output: an ordered list of
``Finding`` (check, OK/WARN/FAIL, detail, fix), printed as a checklist or JSON; the command exits 1 when any
finding is FAIL.

Checks are named units in one ordered tuple (``CHECKS``); each gets a ``Context`` (config + injected seams:
the Slurm runner, an HTTP getter, the clock, ``which``) and returns findings. One check raising is reported as
a FAIL of that check and the others still run. A check that cannot run because an earlier one failed (no
config, Slurm unreachable) says so as a WARN instead of guessing.

FAIL means FleetYield will not work as configured (bad config, Slurm unreachable, a hook not installed or not
executable, a secret readable by others, the store not writable, clocks beyond the push listener's skew).
WARN means it works but something is off (some agents unreachable, clock skew above ``clock_warn_s``, the
job_submit plugin not enabled yet, no admin keys configured, a node whose NVML GPU index differs from its
device minor while fatal XIDs requeue only the jobs on the GPU).
"""

from __future__ import annotations

import contextlib
import email.utils
import glob
import json
import os
import re
import shutil
import sqlite3
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from slurm_fleetyield import config as config_mod
from slurm_fleetyield.adapters.slurm import CommandResult, Runner, SlurmCli, SlurmCommandError, run_command

Status = Literal["OK", "WARN", "FAIL"]

SNIPPET = {
    "Prolog": "/etc/slurm/prolog.d/*",
    "Epilog": "/etc/slurm/epilog.d/*",
    "PrologFlags": "Alloc,DeferBatch",
    "JobSubmitPlugins": "lua",
}
"""What ``contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf`` sets (a test keeps the two equal)."""

HOOKS = {"Prolog": "/opt/fleetyield/bin/fleetyield-prolog", "Epilog": "/opt/fleetyield/bin/fleetyield-epilog"}
"""The programs Slurm's Prolog/Epilog must run: named directly, or linked into the snippet's glob directories
(``/etc/slurm/prolog.d/50-fleetyield``), beside the site's own hooks."""

CLOCK_WARN_S = 2.0
"""Skew above this between the controller and an agent is a WARN. HTTP ``Date`` has one-second resolution, so
a smaller threshold would flag healthy NTP-synced hosts; Slurm and munge themselves want clocks within a few
seconds, and the push listener refuses signed events beyond ``push.max_skew_s`` (that is a FAIL)."""

AGENTS_SHOWN = 10
"""Unreachable agents listed by name before the rest are counted."""


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    status: Status
    detail: str
    fix: str = ""


HttpGet = Callable[[str, float], tuple[int, Mapping[str, str], bytes]]
"""``get(url, timeout_s) -> (status, headers, body)``; raises OSError when nothing answers."""


def http_get(url: str, timeout_s: float, client: Any = None) -> tuple[int, Mapping[str, str], bytes]:
    """GET with ``client``'s credentials (``node_agent.httpclient.HttpClient``; None: none); an unusable
    password file is an OSError here: the listener cannot be asked."""
    from node_agent.httpclient import ClientConfigError, urlopen

    try:
        with urlopen(urllib.request.Request(url), timeout_s, client) as resp:
            return resp.status, dict(resp.headers), resp.read(1 << 20)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read(4096)
    except ClientConfigError as exc:
        raise OSError(str(exc)) from None


@dataclass
class Context:
    """What the checks read, with every outside effect injectable."""

    config_path: str
    runner: Runner = run_command
    get: HttpGet | None = None
    """A test seam for every HTTP request; None: ``http_get`` with the credentials of the listener asked."""
    controller_client: Any = None
    """How doctor authenticates to the controller's own api listener (``--ca-file``, ``--basic-auth-user``,
    ``--password-file``: ``clientauth``); None: no credentials."""
    clock: Callable[[], float] = time.time
    which: Callable[[str], str | None] = shutil.which
    key_dirs: Sequence[str] = ()
    clock_warn_s: float = CLOCK_WARN_S
    config: config_mod.Config | None = None
    gpu_nodes: list[str] | None = None
    agent_dates: dict[str, float] = field(default_factory=dict)
    """node -> agent clock minus ours (s), from the Date header of the agent's answer (filled by agents)."""
    gpu_devices: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """node -> (gpu label = NVML index, device label = nvidiaN) per GPU of the agent's answer (filled by
    agents; read by gpu_index)."""

    def fetch(self, url: str, timeout_s: float, client: Any = None) -> tuple[int, Mapping[str, str], bytes]:
        if self.get is not None:
            return self.get(url, timeout_s)
        return http_get(url, timeout_s, client)

    def slurm(self) -> SlurmCli:
        cfg = self.config
        return SlurmCli(cfg.slurm.bin_dir if cfg else None, 10.0, runner=self.runner)

    def run(self, *argv: str) -> CommandResult:
        cfg = self.config
        head = os.path.join(cfg.slurm.bin_dir, argv[0]) if cfg and cfg.slurm.bin_dir else argv[0]
        try:
            return self.runner((head, *argv[1:]), 10.0)
        except SlurmCommandError as exc:
            return CommandResult(127 if exc.returncode is None else exc.returncode, "", exc.stderr)


# --------------------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------------------


def check_config(ctx: Context) -> list[Finding]:
    try:
        ctx.config = config_mod.load(ctx.config_path)
    except config_mod.ConfigError as exc:
        return [
            Finding(
                "config",
                "FAIL",
                str(exc),
                "fix the field named above; every option is documented in "
                "contrib/fleetyield.example.toml (fleetyield example-config)",
            )
        ]
    mode = "dry-run" if ctx.config.slurm.dry_run else "live"
    return [
        Finding("config", "OK", f"{ctx.config_path} is valid ({mode}, sense.mode={ctx.config.sense.mode})")
    ]


def check_slurm(ctx: Context) -> list[Finding]:
    ping = ctx.run("scontrol", "ping")
    if ping.returncode != 0 or "UP" not in ping.stdout:
        text = (ping.stderr or ping.stdout).strip()[:300]
        return [
            Finding(
                "slurm",
                "FAIL",
                f"scontrol ping: rc={ping.returncode}: {text}",
                "run the controller where scontrol reaches slurmctld (slurm.conf, munge running, "
                "slurm.bin_dir if scontrol is not on PATH)",
            )
        ]
    version = ctx.run("scontrol", "--version")
    out = [Finding("slurm", "OK", f"{ping.stdout.strip().splitlines()[0]}; {version.stdout.strip()}")]
    try:
        nodes = ctx.slurm().read_nodes()
    except SlurmCommandError as exc:
        out.append(Finding("slurm", "FAIL", f"cannot read nodes: {exc}", "check scontrol show node -o works"))
        return out
    ctx.gpu_nodes = sorted(n for n, v in nodes.items() if v.gpu_count > 0)
    if not ctx.gpu_nodes:
        out.append(
            Finding(
                "slurm",
                "WARN",
                f"{len(nodes)} nodes, none with gpu Gres",
                "declare Gres=gpu:... on the GPU nodes, or set sense.gpu_nodes_only = false",
            )
        )
    return out


def check_slurmrest(ctx: Context) -> list[Finding]:
    """``[slurm] adapter = "rest"``: slurmrestd answers (ping) with our JWT, and which API version is used."""
    cfg = ctx.config
    if cfg is None or cfg.slurm.adapter != "rest":
        return [Finding("slurmrest", "OK", "slurm.adapter = 'cli': slurmrestd not used")]
    from slurm_fleetyield.adapters.slurmrest import SlurmRest, TokenFile, ping_states

    assert cfg.slurm.rest_url and cfg.slurm.rest_token_file  # required by the config validator
    rest = SlurmRest(
        cfg.slurm.rest_url,
        cfg.slurm.rest_user,
        TokenFile(cfg.slurm.rest_token_file),
        ctx.slurm(),
        timeout_s=10.0,
        retries=1,
    )
    try:
        pings = ping_states(rest.ping())
        api = rest.api()
    except SlurmCommandError as exc:
        return [
            Finding(
                "slurmrest",
                "FAIL",
                str(exc),
                "check slurm.rest_url (slurmrestd -a rest_auth/jwt listening there), and that "
                "slurm.rest_token_file holds a current `scontrol token username=<rest_user>` for rest_user",
            )
        ]
    fallback = [w for w, ok in (("node update", api.node_update), ("requeue", api.requeue_path)) if not ok]
    state = ", ".join(f"{host} {st}" for host, st in pings)
    detail = f"{cfg.slurm.rest_url}{api.prefix}: {state or 'no pings'} (as {cfg.slurm.rest_user})"
    if fallback:
        detail += f"; {' and '.join(fallback)} through scontrol (not in this API)"
    return [Finding("slurmrest", "OK", detail)]


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {key: value} ("Key = Value" lines; others ignored)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def _executable(path: str) -> Finding | None:
    """None when ``path`` is an executable file; else the problem (missing: WARN, not executable: FAIL)."""
    p = Path(path)
    if not p.exists():
        return Finding(
            "hooks",
            "WARN",
            f"{path} does not exist on this host",
            "the hooks run on the compute nodes: install FleetYield at /opt/fleetyield there "
            "(and here, to let doctor check it)",
        )
    if not p.is_file() or not os.access(p, os.X_OK):
        return Finding("hooks", "FAIL", f"{path} is not an executable file", f"chmod 755 {path}")
    return None


def _runs(value: str, hook: str) -> str | None:
    """Which entry of a Prolog/Epilog setting runs ``hook`` (the path itself, or a file a glob matches that
    is, or links to, it), or None. Slurm 22.05 and 24.11 take a glob(7) pattern; 24.11 also repeated lines,
    which ``scontrol show config`` lists comma-separated. Expanded on this host: doctor assumes the nodes'
    layout is this one's, as for the executable check."""
    want = os.path.realpath(hook)
    for entry in (e.strip() for e in value.split(",")):
        if not entry or entry == "(null)":
            continue
        for path in sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]:
            if path == hook or os.path.realpath(path) == want:
                return path
    return None


def check_hooks(ctx: Context) -> list[Finding]:
    res = ctx.run("scontrol", "show", "config")
    if res.returncode != 0:
        return [Finding("hooks", "WARN", "skipped: scontrol show config failed", "fix the slurm check first")]
    conf = parse_show_config(res.stdout)
    out: list[Finding] = []
    paste = (
        "paste contrib/slurm-docker-cluster/slurm/fleetyield-snippet.conf into slurm.conf on every node, "
        "then scontrol reconfigure"
    )
    for key in ("Prolog", "Epilog"):
        value = conf.get(key, "")
        hook, via = HOOKS[key], _runs(value, HOOKS[key])
        if via is None:
            link = f"{SNIPPET[key].removesuffix('*')}50-fleetyield"
            fix = f"ln -s {hook} {link} on every node ({key}={SNIPPET[key]}: {paste})"
            detail = f"{key} is {value or 'unset'}, which does not run {hook}"
            out.append(Finding("hooks", "FAIL", detail, fix))
            continue
        problem = _executable(hook)
        shown = hook if via == hook else f"{hook} as {via}"
        out.append(problem or Finding("hooks", "OK", f"{key}={value} runs {shown} (executable)"))
    flags = {f.strip() for f in conf.get("PrologFlags", "").split(",")}
    missing = [f for f in SNIPPET["PrologFlags"].split(",") if f not in flags]
    if missing:
        out.append(
            Finding(
                "hooks",
                "FAIL",
                f"PrologFlags={conf.get('PrologFlags') or 'unset'} lacks "
                f"{','.join(missing)}: the Prolog would not run at allocation",
                paste,
            )
        )
    else:
        out.append(Finding("hooks", "OK", f"PrologFlags={conf['PrologFlags']}"))
    if "lua" not in {
        p.strip().removeprefix("job_submit/") for p in conf.get("JobSubmitPlugins", "").split(",")
    }:
        out.append(
            Finding(
                "hooks",
                "WARN",
                "JobSubmitPlugins does not include lua: job classes are not routed",
                "enable JobSubmitPlugins=lua once the controller has labelled the nodes",
            )
        )
    else:
        out.append(Finding("hooks", "OK", "JobSubmitPlugins includes lua"))
    return out


def _scrape(ctx: Context, node: str, url: str, timeout_s: float, client: Any) -> tuple[str, str | None]:
    """(node, problem or None); records the agent's clock offset from its Date header."""
    try:
        sent = ctx.clock()
        status, headers, body = ctx.fetch(url, timeout_s, client)
        got = ctx.clock()
    except OSError as exc:
        return node, f"{getattr(exc, 'reason', exc)}"
    if status in (401, 403):
        return node, f"HTTP {status}: refused the credentials of sense.basic_auth / sense.tls_config"
    if status != 200:
        return node, f"HTTP {status}"
    date = {k.lower(): v for k, v in headers.items()}.get("date")
    if date:
        with contextlib.suppress(TypeError, ValueError):  # an unparsable Date: skew not measured
            ctx.agent_dates[node] = email.utils.parsedate_to_datetime(date).timestamp() - (sent + got) / 2
    if b"DCGM_FI_" not in body:
        return node, "answers, but not with dcgm-exporter metrics"
    ctx.gpu_devices[node] = gpu_device_pairs(body.decode("utf-8", errors="replace"))
    return node, None


_GPU_TEMP_LINE = re.compile(r"^DCGM_FI_DEV_GPU_TEMP\{([^}]*)\}", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def gpu_device_pairs(text: str) -> list[tuple[str, str]]:
    """(gpu, device) labels of each GPU's DCGM_FI_DEV_GPU_TEMP sample ("" where a label is absent)."""
    out = []
    for m in _GPU_TEMP_LINE.finditer(text):
        labels = dict(_LABEL.findall(m.group(1)))
        out.append((labels.get("gpu", ""), labels.get("device", "")))
    return out


def check_gpu_index(ctx: Context) -> list[Finding]:
    """The GPU-scoped requeue (core/quarantine.py) reads Slurm's GRES IDX of a job as the NVML index an XID
    names. That holds when NVML's order (PCI bus order) is the order of the device files (nvidiaN minors),
    which Slurm's GRES order follows; a node whose agent reports an NVML index != its device minor breaks
    it, and a fatal XID there could requeue the wrong job and leave the one on the dead GPU running."""
    cfg = ctx.config
    if cfg is not None and cfg.core.quarantine.requeue_whole_node:
        why = "quarantine.requeue_whole_node = true: a fatal XID requeues every job on its node"
        return [Finding("gpu_index", "OK", why + " (no GPU index assumption)")]
    fix = (
        "set [core.quarantine] requeue_whole_node = true (a fatal XID then requeues every job on the node), "
        "or make the device minors follow PCI order"
    )
    if cfg is not None and cfg.sense.mode == "prometheus":
        how = (
            "compare the gpu and device labels of DCGM_FI_DEV_GPU_TEMP in Prometheus: gpu=N must come with "
            "device=nvidiaN; where not, "
        )
        return [
            Finding("gpu_index", "WARN", "not checked in prometheus mode (no agent is scraped)", how + fix)
        ]
    if not ctx.gpu_devices:
        return [
            Finding(
                "gpu_index",
                "WARN",
                "skipped: no agent answered (or the agents check did not run)",
                "fix or run the agents check",
            )
        ]
    wrong: list[str] = []
    unknown: list[str] = []
    gpus = 0
    for node, pairs in sorted(ctx.gpu_devices.items()):
        gpus += len(pairs)
        if not pairs or any(not dev for _, dev in pairs):
            unknown.append(node)
            continue
        bad = [f"gpu {g} is /dev/{d}" for g, d in pairs if d != f"nvidia{g}"]
        if bad:
            wrong.append(f"{node} ({', '.join(bad[:3])})")
    if wrong:
        more = f" and {len(wrong) - AGENTS_SHOWN} more" if len(wrong) > AGENTS_SHOWN else ""
        detail = (
            f"NVML index != device minor on {len(wrong)} node(s): {'; '.join(wrong[:AGENTS_SHOWN])}{more}: "
            "Slurm's GRES IDX may not be the index an XID names"
        )
        return [Finding("gpu_index", "WARN", detail, fix)]
    if unknown:
        detail = (
            f"{len(unknown)} node(s) export no device label (nvidiaN): {', '.join(unknown[:AGENTS_SHOWN])}: "
            "NVML index vs device minor not checked"
        )
        return [Finding("gpu_index", "WARN", detail, fix)]
    detail = (
        f"{gpus} GPUs on {len(ctx.gpu_devices)} nodes: NVML index = device minor, so Slurm's GRES IDX is "
        "the index an XID names"
    )
    return [Finding("gpu_index", "OK", detail)]


def check_agents(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    if cfg is None or ctx.gpu_nodes is None:
        return [
            Finding("agents", "WARN", "skipped: no config or no node list from Slurm", "fix the checks above")
        ]
    if cfg.sense.mode == "prometheus":
        url = cfg.prometheus.url.rstrip("/") + "/-/ready"
        try:
            status, _, _ = ctx.fetch(url, cfg.prometheus.timeout_s)
        except OSError as exc:
            return [Finding("agents", "FAIL", f"Prometheus {url}: {exc}", "check prometheus.url")]
        ok = status == 200
        return [
            Finding(
                "agents",
                "OK" if ok else "FAIL",
                f"Prometheus {url}: HTTP {status}",
                "" if ok else "check prometheus.url and that Prometheus is up",
            )
        ]
    if not ctx.gpu_nodes:
        return [Finding("agents", "WARN", "no GPU nodes to scrape", "")]
    client_cfg = cfg.sense.client()
    client = None
    if client_cfg is not None:
        from node_agent.httpclient import ClientConfigError, HttpClient

        try:
            client = HttpClient(client_cfg, "sense.")
        except ClientConfigError as exc:
            return [
                Finding("agents", "FAIL", str(exc), "fix the file named above (the scraper refuses it too)")
            ]
    urls = {n: cfg.sense.url_template.replace("{node}", n) for n in ctx.gpu_nodes}
    with ThreadPoolExecutor(max_workers=min(32, len(urls))) as pool:
        results = list(pool.map(lambda n: _scrape(ctx, n, urls[n], cfg.sense.timeout_s, client), urls))
    bad = [(n, why) for n, why in results if why]
    total = len(results)
    if not bad:
        return [Finding("agents", "OK", f"{total}/{total} agents answer with dcgm-exporter metrics")]
    shown = "; ".join(f"{n} ({urls[n]}): {why}" for n, why in bad[:AGENTS_SHOWN])
    more = f" and {len(bad) - AGENTS_SHOWN} more" if len(bad) > AGENTS_SHOWN else ""
    fix = (
        "start fleetyield-agent on those nodes (systemctl status fleetyield-agent) and check "
        "sense.url_template and the firewall (port 9400)"
    )
    status: Status = "FAIL" if len(bad) == total else "WARN"
    return [Finding("agents", status, f"{len(bad)}/{total} agents unreachable: {shown}{more}", fix)]


def check_clocks(ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ctx.which("timedatectl"):
        res = ctx.runner(("timedatectl", "show", "-p", "NTPSynchronized", "--value"), 10.0)
        value = res.stdout.strip()
        if res.returncode == 0 and value == "yes":
            out.append(Finding("clocks", "OK", "this host's clock is NTP-synchronised (timedatectl)"))
        elif res.returncode == 0 and value == "no":
            out.append(
                Finding(
                    "clocks",
                    "WARN",
                    "this host's clock is not NTP-synchronised (timedatectl)",
                    "enable time sync: systemctl enable --now systemd-timesyncd (or chrony)",
                )
            )
    if not ctx.agent_dates:
        out.append(Finding("clocks", "WARN", "no agent answered with a Date header: skew not measured", ""))
        return out
    max_skew = ctx.config.push.max_skew_s if ctx.config else 300.0
    worst_node, worst = max(ctx.agent_dates.items(), key=lambda kv: abs(kv[1]))
    # Date has 1 s resolution: allow one second for truncation on top of the threshold
    if abs(worst) > max_skew:
        out.append(
            Finding(
                "clocks",
                "FAIL",
                f"{worst_node} is {worst:+.1f} s off this host: beyond "
                f"push.max_skew_s={max_skew:g}, its signed events are refused",
                "synchronise clocks (chrony/systemd-timesyncd) on the controller and nodes",
            )
        )
    elif abs(worst) > ctx.clock_warn_s + 1.0:
        out.append(
            Finding(
                "clocks",
                "WARN",
                f"{worst_node} is {worst:+.1f} s off this host (threshold {ctx.clock_warn_s:g} s)",
                "synchronise clocks (chrony/systemd-timesyncd)",
            )
        )
    else:
        out.append(
            Finding(
                "clocks",
                "OK",
                f"{len(ctx.agent_dates)} agents within {ctx.clock_warn_s:g} s "
                f"(worst {worst_node} {worst:+.1f} s)",
            )
        )
    return out


def _secret_file(
    path: str | None, field_name: str, missing: Finding | None, min_bytes: int = 1
) -> list[Finding]:
    if not path:
        return [missing] if missing else []
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        return [
            Finding("keys", "FAIL", f"{field_name}={path}: {exc.strerror}", f"create it (mode 0600): {path}")
        ]
    if st.st_mode & 0o077:
        return [
            Finding(
                "keys",
                "FAIL",
                f"{field_name}={path} has mode {stat.S_IMODE(st.st_mode):o}: readable by others",
                f"chmod 600 {path}",
            )
        ]
    secret = p.read_bytes().strip()
    if not secret:
        return [Finding("keys", "FAIL", f"{field_name}={path} is empty", "write the shared secret into it")]
    if len(secret) < min_bytes:
        return [
            Finding(
                "keys",
                "FAIL",
                f"{field_name}={path} holds {len(secret)} bytes, fewer than {min_bytes} (agents refuse it)",
                f"write a longer secret: head -c 32 /dev/urandom | base64 > {path}",
            )
        ]
    return [Finding("keys", "OK", f"{field_name}={path} (mode {stat.S_IMODE(st.st_mode):o})")]


def check_keys(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    out: list[Finding] = []
    if cfg is not None:
        out += _secret_file(
            cfg.push.secret_file,
            "push.secret_file",
            Finding(
                "keys",
                "WARN",
                "push.secret_file is unset: agents cannot push fatal events",
                "set push.secret_file (the agents' --push-secret-file, mode 0600)",
            ),
            config_mod.MIN_SECRET_BYTES,
        )
        out += _secret_file(cfg.control.secret_file, "control.secret_file", None, config_mod.MIN_SECRET_BYTES)
        out += _secret_file(cfg.alertmanager.token_file, "alertmanager.token_file", None)
        ak = cfg.gate.authorized_keys
        if not ak:
            out.append(
                Finding(
                    "keys",
                    "WARN",
                    "gate.authorized_keys is unset: no approval can be accepted",
                    "fleetyield keygen NAME on each admin's machine; append NAME.pub to a file "
                    "and set gate.authorized_keys",
                )
            )
        else:
            out += _authorized_keys(Path(ak))
        gate_dir = Path(cfg.gate_dir)
        if gate_dir.exists() and stat.S_IMODE(gate_dir.stat().st_mode) & 0o077:
            out.append(
                Finding(
                    "keys",
                    "WARN",
                    f"gate dir {gate_dir} has mode {stat.S_IMODE(gate_dir.stat().st_mode):o}",
                    f"chmod 700 {gate_dir}",
                )
            )
    for d in ctx.key_dirs:
        for key in sorted(Path(os.path.expanduser(d)).glob("*.key")):
            mode = stat.S_IMODE(key.stat().st_mode)
            if mode & 0o077:
                out.append(
                    Finding(
                        "keys",
                        "FAIL",
                        f"admin private key {key} has mode {mode:o}: readable by others",
                        f"chmod 600 {key}",
                    )
                )
            else:
                out.append(Finding("keys", "OK", f"admin private key {key} (mode {mode:o})"))
    return out


def _authorized_keys(path: Path) -> list[Finding]:
    try:
        st = path.stat()
        lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    except OSError as exc:
        return [
            Finding(
                "keys",
                "FAIL",
                f"gate.authorized_keys={path}: {exc.strerror}",
                "create it with the admins' NAME.pub lines",
            )
        ]
    for p in (path, path.parent):
        mode = stat.S_IMODE(p.stat().st_mode)
        if mode & 0o022 and not (p.is_dir() and p.stat().st_mode & stat.S_ISVTX):
            return [
                Finding(
                    "keys", "FAIL", f"{p} has mode {mode:o}: others can add an admin key", f"chmod go-w {p}"
                )
            ]
    if not lines:
        return [Finding("keys", "WARN", f"gate.authorized_keys={path} holds no key", "append NAME.pub lines")]
    return [
        Finding(
            "keys",
            "OK",
            f"gate.authorized_keys={path}: {len(lines)} admin key(s), mode {stat.S_IMODE(st.st_mode):o}",
        )
    ]


def _check_pg_store(url: str) -> list[Finding]:
    """A PostgreSQL store: reachable, and its schema (when there is one yet) known to this build."""
    from slurm_fleetyield.adapters.store import SCHEMA_VERSION, Store, StoreError

    try:
        store = Store(url, readonly=True)
    except StoreError as exc:
        if "no store schema" in str(exc):
            return [Finding("store", "OK", f"{exc}: the schema is created at first start")]
        return [Finding("store", "FAIL", str(exc), "check [store] url, the server, and the user's rights")]
    try:
        version = store._conn().execute("SELECT version FROM schema_version WHERE id = 1").fetchone()
        leader = store.leader_status(time.time())
    finally:
        store.close()
    found = None if version is None else version[0]
    if found != SCHEMA_VERSION:
        return [Finding("store", "WARN", f"{store.path}: schema {found}, this build writes {SCHEMA_VERSION}",
                        "the controller migrates it at start")]  # fmt: skip
    return [Finding("store", "OK", f"{store.path}: schema {found}, leader {leader.get('leader')}")]


def check_store(ctx: Context) -> list[Finding]:
    if ctx.config is None:
        return [Finding("store", "WARN", "skipped: no config", "fix the config check first")]
    if ctx.config.store.url:
        return _check_pg_store(ctx.config.store.url)
    db = Path(ctx.config.store.path)
    if not db.parent.is_dir():
        return [
            Finding(
                "store",
                "FAIL",
                f"{db.parent} does not exist",
                f"mkdir -p {db.parent} and chown it to the controller's user",
            )
        ]
    if not os.access(db.parent, os.W_OK | os.X_OK) or (db.exists() and not os.access(db, os.R_OK | os.W_OK)):
        return [
            Finding(
                "store",
                "FAIL",
                f"{db} is not writable by uid {os.getuid()}",
                f"run doctor as the controller's user, or chown -R that user {db.parent}",
            )
        ]
    if not db.exists():
        return [Finding("store", "OK", f"{db.parent} is writable; {db.name} is created at first start")]
    try:
        conn = sqlite3.connect(db, timeout=2.0)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute("BEGIN IMMEDIATE")
            conn.rollback()
            integrity = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return [
            Finding(
                "store",
                "FAIL",
                f"{db}: {exc}",
                "stop the controller, back up the file, restore a good backup if it is corrupt",
            )
        ]
    if integrity != "ok":
        return [
            Finding("store", "FAIL", f"{db}: quick_check says {integrity}", "restore the last good backup")
        ]
    return [Finding("store", "OK", f"{db} is writable (schema version {version}, quick_check ok)")]


def _controller_url(cfg: config_mod.Config) -> str:
    """The api listener's base URL from this host: https when its web-config serves TLS, then the host it
    binds (a wildcard bind: loopback for http, this host's name for https, the name its certificate
    carries more often than an address)."""
    from slurm_fleetyield.clientauth import scheme

    wildcard = cfg.api.host in ("", "0.0.0.0", "::")
    kind = scheme(cfg.api.web_config_file)
    if kind == "https" and (wildcard or cfg.api.host == "127.0.0.1"):
        import socket

        host = socket.getfqdn()
    else:
        host = "127.0.0.1" if wildcard else cfg.api.host
    return f"{kind}://{host}:{cfg.api.port}"


_REFUSED = re.compile(
    r"^fleetyield_unauthenticated_requests_total"
    r'\{endpoint="(api|listener)",reason="basic_auth"\} ([0-9.e+]+)$',
    re.M,
)


def check_controller(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    if cfg is None or not cfg.api.enabled:
        return []
    import click

    try:
        base = _controller_url(cfg)
    except click.ClickException as exc:
        return [Finding("controller", "WARN", exc.message, "make api.web_config_file readable to this user")]
    url = f"{base}/healthz"
    try:
        status, _, body = ctx.fetch(url, 5.0, ctx.controller_client)
    except OSError as exc:
        return [
            Finding(
                "controller",
                "WARN",
                f"{url}: {getattr(exc, 'reason', exc)}",
                "start it: systemctl start fleetyield-controller (journalctl -u fleetyield-controller); with "
                "TLS on the api listener give doctor --ca-file",
            )
        ]
    if status in (401, 403):
        return [
            Finding(
                "controller",
                "WARN",
                f"{url}: HTTP {status}: the api listener's web-config wants credentials",
                "give doctor --basic-auth-user and --password-file (a user of api.web_config_file)",
            )
        ]
    if status == 200:
        out = [Finding("controller", "OK", f"{url}: {body.decode(errors='replace').strip()[:200]}")]
    else:
        out = [
            Finding(
                "controller",
                "WARN",
                f"{url}: HTTP {status}: {body.decode(errors='replace').strip()[:200]}",
                "ticks are missing or stale: journalctl -u fleetyield-controller",
            )
        ]
    return out + _refused_credentials(ctx, base)


def _refused_credentials(ctx: Context, base: str) -> list[Finding]:
    """Requests the listeners refused for basic auth since the controller started (its /metrics): on the
    api listener that is, above all, Prologs whose hooks.conf does not match its web-config, running with
    the health gate off (they allow every job and log "controller gate AUTH REFUSED")."""
    try:
        status, _, body = ctx.fetch(f"{base}/metrics", 5.0, ctx.controller_client)
    except OSError:
        return []
    if status != 200:
        return []
    refused = {m.group(1): float(m.group(2)) for m in _REFUSED.finditer(body.decode(errors="replace"))}
    out = []
    if refused.get("api"):
        out.append(
            Finding(
                "controller",
                "WARN",
                f"the api listener refused {refused['api']:.0f} request(s) for missing or wrong basic-auth "
                "credentials since the controller started: a node whose hooks.conf does not match "
                "api.web_config_file runs its Prolog without the health gate (it allows every job)",
                "on every node set controller_basic_auth_username/_password_file (and "
                "controller_tls_config_ca_file) in /etc/fleetyield/hooks.conf; the nodes concerned log "
                "'controller gate AUTH REFUSED' in /var/log/fleetyield/hooks.log",
            )
        )
    if refused.get("listener"):
        out.append(
            Finding(
                "controller",
                "WARN",
                f"the push listener refused {refused['listener']:.0f} request(s) for missing or wrong "
                "basic-auth credentials since the controller started: agents (push_basic_auth) or admins "
                "(approve --basic-auth-user) whose credentials do not match push.web_config_file",
                "check the agents' push_basic_auth against push.web_config_file (journalctl -u "
                "fleetyield-agent on the nodes) and the admins' --basic-auth-user/--password-file",
            )
        )
    return out


CHECKS: tuple[tuple[str, Callable[[Context], list[Finding]]], ...] = (
    ("config", check_config),
    ("slurm", check_slurm),
    ("slurmrest", check_slurmrest),
    ("hooks", check_hooks),
    ("agents", check_agents),
    ("clocks", check_clocks),
    ("gpu_index", check_gpu_index),
    ("keys", check_keys),
    ("store", check_store),
    ("controller", check_controller),
)
"""The order matters: config feeds everything, slurm gives the node list, agents give the clock samples."""


def run_checks(ctx: Context, names: Iterable[str] | None = None) -> list[Finding]:
    wanted = set(names) if names is not None else None
    out: list[Finding] = []
    for name, check in CHECKS:
        if wanted is not None and name not in wanted and name != "config":
            continue
        try:
            out.extend(check(ctx))
        except Exception as exc:  # one broken check must not hide the others
            out.append(Finding(name, "FAIL", f"the check itself failed: {exc!r}", "report this as a bug"))
    return out


def render(findings: Sequence[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"[{f.status:^4}] {f.check:<10} {f.detail}")
        if f.fix and f.status != "OK":
            lines.append(f"       {'':<10} fix: {f.fix}")
    fails = sum(f.status == "FAIL" for f in findings)
    warns = sum(f.status == "WARN" for f in findings)
    lines.append(f"{len(findings)} checks: {fails} FAIL, {warns} WARN")
    return "\n".join(lines)


def to_json(findings: Sequence[Finding]) -> str:
    return json.dumps(
        {"ok": not any(f.status == "FAIL" for f in findings), "findings": [asdict(f) for f in findings]},
        indent=2,
    )


# --------------------------------------------------------------------------------------------------------
# The command (mounted lazily by cli.py)
# --------------------------------------------------------------------------------------------------------


def _command() -> Any:
    import click

    from slurm_fleetyield.clientauth import client, client_options

    @click.command("doctor")
    @click.option("--config", "config_path", type=click.Path(dir_okay=False), help="Config file.")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    @click.option(
        "--key-dir",
        "key_dirs",
        multiple=True,
        default=(os.path.join("~", ".fleetyield"),),
        show_default=True,
        help="Where admin private keys (NAME.key) live; checked for safe permissions. Repeatable.",
    )
    @click.option(
        "--only", multiple=True, type=click.Choice([n for n, _ in CHECKS]), help="Run these checks."
    )
    @click.option("--clock-warn-s", default=CLOCK_WARN_S, show_default=True, help="Agent clock skew WARN.")
    @client_options
    def doctor(
        config_path: str | None,
        as_json: bool,
        key_dirs: tuple[str, ...],
        only: tuple[str, ...],
        clock_warn_s: float,
    ) -> None:
        """Check this installation (Slurm, hooks, agents, clocks, keys, store); exit 1 on any FAIL."""
        path = config_path or os.environ.get("FLEETYIELD_CONFIG", "/etc/fleetyield/fleetyield.toml")
        ctx = Context(path, key_dirs=key_dirs, clock_warn_s=clock_warn_s, controller_client=client())
        findings = run_checks(ctx, only or None)
        click.echo(to_json(findings) if as_json else render(findings))
        if any(f.status == "FAIL" for f in findings):
            raise SystemExit(1)

    return doctor


doctor_command = _command
