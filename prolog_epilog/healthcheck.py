"""``fleetyield-healthcheck``: the agent's fatal marker as a Slurm HealthCheckProgram, marked the NHC way.

Install (slurm.conf, on every node; a site that already runs LBNL NHC keeps it and calls this from an NHC
check instead, see contrib/nhc/fleetyield.nhc)::

    HealthCheckProgram=/opt/fleetyield/bin/fleetyield-healthcheck
    HealthCheckInterval=60
    HealthCheckNodeState=ANY

Why: while the FleetYield controller runs it drains a node within a second of a fatal XID (the agent pushes
it). While the controller is down -- an upgrade, a crash, a lost host -- nothing drains an idle node whose
GPU fell off the bus, and every job that lands there fails in its Prolog. slurmd already runs a health check
on every node at a fixed interval whatever else is down; this makes it read the agent's marker.

Input: the hook config (``_hooklib``; the keys below), the agent's ``fatal.json``, the controller's
``GET {controller_url}/healthz`` and the node's Slurm state (``scontrol show node``). Output: at most one
``scontrol update`` and the exit status (0 healthy or left to the controller, 1 a fatal fault is pending).

Rule, per run (``decide`` is the whole of it):

1. a pending fatal event (the Prolog's own reading of the marker: an unreadable marker is no verdict, and
   no verdict never drains) while nothing else will act: ``controller_url`` unset (NHC mode), or the
   controller has not answered ``/healthz`` for ``healthcheck_grace_s`` (120 s: a restart or an upgrade is
   not an outage; the first failed run with a fault pending is remembered in ``<spool_dir>/healthcheck.json``,
   removed when the controller answers or no fault is pending) ->
   ``State=DRAIN Reason="NHC: fleetyield: <event>"``, unless Slurm already has the node drained or down for
   any reason (NHC's rule: a mark it did not set is not its to change);
2. no pending fatal event and the node drained with a reason of its own (``NHC: fleetyield:``) ->
   ``State=RESUME``; every other drain is left alone, FleetYield's own included (``fleetyield:``: its
   rehabilitation brings the node back);
3. otherwise nothing.

Cost per run: a read of the marker; with a fault pending one HTTP GET; ``scontrol show node`` for this node
unless the controller answers (about what NHC's own online check costs slurmctld).

A node marked here is outside the controller's drain cap and its rehabilitation ladder: "NHC:" reasons are
someone else's to the controller (README, "Never touched"), so it returns when the agent's marker is
cleared (``fleetyield-agent reset --gpu N``, or ``fault clear`` for a fault no reset fixes) and this check
resumes it. That is NHC's model, chosen on purpose for the one case where the controller cannot act.

A controller that refuses the probe's credentials (hooks.conf's ``controller_basic_auth_*`` /
``controller_tls_config_*``, sent as the Prolog sends them; HTTP 401/403 or a TLS certificate refused) is
logged at ERROR as a configuration error, and counts as not answering: we cannot see it at work, so with a
fatal event pending its grace runs and rule 1 drains here (the safe direction: only a node with a recorded
fatal event is marked).

Keys (hooks.conf): ``healthcheck_grace_s`` (120), ``scontrol`` (``scontrol``: slurmd runs the program with
a bare environment, so an absolute path is looked up when PATH has none), plus ``controller_url``,
``timeout_ms``, ``agent_state_dir``, ``spool_dir``, ``node_name``, ``log_file`` and the
``controller_basic_auth_*`` / ``controller_tls_config_*`` keys as for the Prolog.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from prolog_epilog import _hooklib as lib
from prolog_epilog._controller import ControllerAuthError, get
from prolog_epilog.prolog import read_fatal

TAG = "fleetyield-healthcheck"
NHC_PREFIX = "NHC: fleetyield:"
STATE_FILE = "healthcheck.json"
EXIT_OK = 0
EXIT_FAULT = 1
DEADLINE_S = 30.0  # slurmd does not wait on a health check; a hung scontrol must not pile up runs


def decide(
    pending: Sequence[Mapping[str, object]],
    controller_down_s: float | None,
    grace_s: float,
    slurm_state: str,
    reason: str,
) -> tuple[str, str]:
    """(action, why): action ``drain``, ``resume`` or ``none``.

    ``controller_down_s``: seconds the controller has been unanswering; None: it answers, or there is none
    to answer (``float('inf')``: NHC mode, no controller configured)."""
    out = any(s in slurm_state for s in ("DRAIN", "DOWN", "FAIL"))
    if pending:
        what = _describe(pending[0]) + (f" (+{len(pending) - 1} more)" if len(pending) > 1 else "")
        if controller_down_s is None:
            return "none", f"fatal event pending ({what}); the controller answers and drains"
        if controller_down_s < grace_s:
            return "none", (
                f"fatal event pending ({what}); the controller has not answered for "
                f"{controller_down_s:.0f} s, under the {grace_s:g} s grace"
            )
        if out:
            return (
                "none",
                f"fatal event pending ({what}); Slurm has the node {slurm_state} already: {reason!r}",
            )
        return "drain", f"{NHC_PREFIX} {what}"
    if "DRAIN" in slurm_state and reason.startswith(NHC_PREFIX):
        return "resume", f"no fatal event pending; lifting our own mark {reason!r}"
    return "none", "no fatal event pending"


def _describe(entry: Mapping[str, object]) -> str:
    gpu = entry.get("gpu")
    where = f"GPU {gpu}" if gpu is not None else "node"
    text = entry.get("message") or (
        f"XID {entry['xid']}" if entry.get("xid") is not None else entry.get("kind")
    )
    return f"{text} on {where}"


def controller_down_for(config: lib.HookConfig, now: float, log: lib.Logger) -> float | None:
    """Seconds the controller has not answered /healthz (None: it answers; inf: none configured).

    The first unanswered run is remembered in ``<spool_dir>/healthcheck.json``; an answer removes it."""
    urls = config.controller_urls
    if not urls:
        return float("inf")
    path = os.path.join(config.spool_dir, STATE_FILE)
    status, why = 0, "no controller"
    for url in urls:  # several (high availability): any healthy one is a controller at work
        try:
            status, _ = get(config, f"{url.rstrip('/')}/healthz", config.timeout_ms / 1000.0)
        except ControllerAuthError as exc:  # not an outage: said loudly, and not healthy to us
            status, why = 0, f"AUTH REFUSED: {exc}"
            log("ERROR", f"controller health probe AUTH REFUSED, a configuration error: {exc}")
        except Exception as exc:  # refused, slow, DNS: all "not answering"
            status, why = 0, f"{type(exc).__name__}: {exc}"
        else:
            why = f"HTTP {status}"
        if status == 200:
            break
    if status == 200:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return None
    since = _read_since(path, log)
    if since is None or since > now:
        since = now
        try:
            os.makedirs(config.spool_dir, exist_ok=True)
            lib.atomic_write(path, json.dumps({"controller_down_since": now, "why": why}).encode())
        except OSError as exc:  # cannot remember: every run is the first, so the grace never passes
            log("WARNING", f"cannot write {path}: {exc}")
    log("WARNING", f"controller {config.controller_url} not healthy ({why}) for {now - since:.0f} s")
    return now - since


def _read_since(path: str, log: lib.Logger) -> float | None:
    try:
        with open(path, encoding="utf-8") as fh:
            since = json.load(fh)["controller_down_since"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log("WARNING", f"{path} unusable ({exc}); starting the grace again")
        return None
    return float(since) if isinstance(since, (int, float)) and not isinstance(since, bool) else None


def slurm_node(scontrol: str, node: str, timeout_s: float) -> tuple[str, str]:
    """(State, Reason) of ``node`` as ``scontrol show node -o`` prints them."""
    out = subprocess.run(
        [scontrol, "show", "node", "-o", node], capture_output=True, text=True, timeout=timeout_s, check=True
    ).stdout
    state, reason = "", ""
    for part in out.split(" "):
        if part.startswith("State="):
            state = part[len("State=") :]
    if " Reason=" in out:
        reason = out.split(" Reason=", 1)[1].strip()
        # scontrol appends " [user@time]" to a reason; later keys (if any) follow it
        reason = reason.split(" [", 1)[0].strip()
    return state, reason


def _scontrol(config: lib.HookConfig) -> str:
    name = config.scontrol
    if os.path.isabs(name):
        return name
    return shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/local/bin:/opt/slurm/bin") or name


def run(env: Mapping[str, str], log: lib.Logger, now: float | None = None, *, report: bool = False) -> int:
    """One health check. ``report`` (the NHC check's mode): change nothing in Slurm; print the failure
    NHC's ``die`` should mark (``fleetyield: <event>``, NHC prefixes "NHC: ") and exit 1 when rule 1 would
    drain, else exit 0 -- NHC marks and lifts the node itself."""
    config = lib.load_config(env, log)
    log.set_log_file(config.log_file)
    node = lib.node_name(config, env)
    log.node = node
    now = time.time() if now is None else now
    pending = read_fatal(config.agent_state_dir, log)
    if pending:
        down = controller_down_for(config, now, log)
    else:  # no fault pending: no outage is being timed (the next one starts its grace afresh)
        down = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(config.spool_dir, STATE_FILE))
    if report:
        action, why = decide(pending, down, float(config.healthcheck_grace_s), "", "")
        if action == "drain":
            print(why[len("NHC: ") :])
            return EXIT_FAULT
        log("INFO" if not pending else "WARNING", why)
        return EXIT_OK
    scontrol = _scontrol(config)
    if pending and down is None:  # the controller answers: it drains; Slurm need not be asked
        state, reason = "", ""
    else:
        state, reason = slurm_node(scontrol, node, DEADLINE_S / 3)
    action, why = decide(pending, down, float(config.healthcheck_grace_s), state, reason)
    if action == "drain":
        subprocess.run(
            [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={why}"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S / 3,
            check=True,
        )
        log("ERROR", f"drained {node}: {why}")
    elif action == "resume":
        subprocess.run(
            [scontrol, "update", f"NodeName={node}", "State=RESUME"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S / 3,
            check=True,
        )
        log("INFO", f"resumed {node}: {why}")
    elif pending:
        log("WARNING", why)
    return EXIT_FAULT if pending else EXIT_OK


def main() -> None:
    if lib.asked_for_cli(sys.argv[1:]):
        from prolog_epilog import _cli

        _cli.run(TAG, (__doc__ or "").split("\n", 1)[0].replace("``", ""))
    args = sys.argv[1:]
    if args not in ([], ["--report"]):
        print(
            f"{TAG}: unexpected arguments {args!r} (slurmd runs it with none; NHC's check with --report)",
            file=sys.stderr,
        )
        sys.exit(2)
    log = lib.Logger(TAG)
    code = EXIT_OK
    try:
        lib.arm_deadline(DEADLINE_S, lambda: os._exit(EXIT_OK))
        try:
            code = run(os.environ, log, report=args == ["--report"])
        finally:
            lib.disarm_deadline()
    except lib.HookTimeout:
        log("ERROR", f"deadline of {DEADLINE_S:g} s passed; nothing changed")
    except (subprocess.SubprocessError, OSError) as exc:
        log("ERROR", f"scontrol failed ({type(exc).__name__}: {exc}); nothing changed")
    except Exception as exc:  # a bug here must never drain the fleet
        log("ERROR", f"internal error {type(exc).__name__}: {exc}; nothing changed")
    sys.exit(code)


if __name__ == "__main__":
    main()
