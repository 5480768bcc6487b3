"""``fleetyield-prolog``: the fast, fail-open pre-job gate run by slurmd (stdlib only).

Install (slurm.conf)::

    Prolog=/opt/fleetyield/bin/fleetyield-prolog
    PrologFlags=Alloc,DeferBatch

Input: the Slurm Prolog environment (``SLURM_JOB_ID``, ``SLURM_JOB_USER``,
``SLURM_JOB_UID``, ``SLURMD_NODENAME``, the job's GPUs in ``SLURM_JOB_GPUS`` /
``CUDA_VISIBLE_DEVICES`` / ``GPU_DEVICE_ORDINAL`` -- real device indices, the Prolog
runs outside the job cgroup -- and ``SLURM_JOB_PARTITION`` / ``SLURM_JOB_CONSTRAINTS``
/ ``SLURM_JOB_COMMENT`` when present), the hook config (see ``_hooklib``), the node
agent's ``fatal.json`` and the controller's gate endpoint.

Output: the exit status. Non-zero (Slurm then drains the node and requeues the job)
ONLY when

* the node agent has a pending fatal event (``<agent_state_dir>/fatal.json``), or
* ``attest`` is on and the node's attestation verdict (``<agent_state_dir>/attest-verdict.json``) is
  missing, unreadable, stale (``attest_max_age_s``), badly signed or a fail (``attest_gate.check_verdict``:
  fail-closed on purpose, the one exception to fail-open below), or what can change between quotes
  (loaded modules, kernel taint and knobs, ld.so.preload: ``attest_recheck``) no longer matches the
  digests that verdict passed (``attest_gate.recheck``), or
* the controller answers ``GET {controller_url}/v1/nodes/{node}/gate`` with HTTP 200
  and ``{"allow": false, ...}`` within ``timeout_ms``. With several URLs (high availability: the
  standby serves the gate from the shared store too) each is asked in turn with an equal share of what
  is left of ``timeout_ms``; the first usable answer counts.

Everything else allows the job: a missing, unreadable or corrupt ``fatal.json`` (logged:
"no verdict"), a controller that is down, slow, erroring or answering garbage (the
controller drains nodes through scontrol itself, so a down controller must never stop
the cluster), a bad config file, and the hard deadline (``hard_timeout_ms``, default
2 s, far under PrologEpilogTimeout) after which the hook logs and exits 0.

Refused credentials. When the controller's ``api`` listener has a web-config file (TLS, basic
auth), the gate query carries hooks.conf's ``controller_basic_auth_*`` / ``controller_tls_config_*``
(``_controller``). A controller that answers HTTP 401/403, a TLS handshake that fails on a
certificate, or client settings that cannot be used (an unreadable password file) is not
"controller down": it is logged at ERROR as ``controller gate AUTH REFUSED, a configuration
error`` with what was sent and what to fix, on every job start, and the controller counts each
refusal (``fleetyield_unauthenticated_requests_total{endpoint="api",reason="basic_auth"}``, which
``fleetyield doctor`` reports). The job is still allowed: such a mistake is made fleet-wide (a
password rotated on the controller first, basic auth added to its web-config before hooks.conf),
and failing closed would drain every GPU node at its next job start, an outage caused by a
reliability add-on, while the controller goes on draining quarantined nodes through scontrol
itself (the gate closes the window before that drain lands). Loud, then, but open.

Side effects on allow: the dcgm-exporter hpc_job mapping files for the job's GPUs
(``<hpc_job_dir>/<gpu index>`` holding the job id, written atomically) and a small
per-job state file ``<spool_dir>/jobs/<jobid>.json`` (start time, GPUs, partition,
comment) that the epilog folds into the job-outcome record, because Slurm 22.05 gives
the Epilog far fewer variables than the Prolog.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping

from prolog_epilog import _hooklib as lib
from prolog_epilog._controller import ControllerAuthError, get

TAG = "fleetyield-prolog"
EXIT_ALLOW = 0
EXIT_DENY = 1


def read_fatal(state_dir: str, log: lib.Logger) -> list[dict]:
    """Pending fatal events, ``[]`` for none *or no verdict* (unreadable/corrupt file).

    Uses the agent's own reader when importable; its "marker_unreadable" synthetic entry
    (the agent's fail-safe) is turned into "no verdict" here: the prolog blocks jobs
    only on a real recorded fatal event (FleetYield policy: a corrupt marker must not
    drain nodes; the agent re-writes it on its next event and pushes events to the
    controller anyway).
    """
    try:
        from node_agent.fatal import read_pending
    except Exception:  # agent not installed on this node: read the file ourselves
        read_pending = _read_pending_fallback
    pending = read_pending(state_dir)
    real = []
    for entry in pending:
        if not isinstance(entry, dict):
            continue
        if entry.get("kind") == "marker_unreadable":
            log("WARNING", f"fatal marker unreadable, no verdict (job allowed): {entry.get('message')}")
            continue
        real.append(entry)
    return real


def _read_pending_fallback(state_dir: str) -> list[dict]:
    path = os.path.join(state_dir, "fatal.json")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        return [{"kind": "marker_unreadable", "message": f"{path}: {exc}"}]
    pending = doc.get("pending") if isinstance(doc, dict) else doc
    if not isinstance(pending, list):
        return [{"kind": "marker_unreadable", "message": f"{path}: no 'pending' list"}]
    return [p for p in pending if isinstance(p, dict)]


def _describe(entry: dict) -> str:
    gpu = entry.get("gpu")
    where = f"gpu {gpu}" if gpu is not None else "node"
    return f"{where}: {entry.get('message') or entry.get('kind') or 'fatal event'}"


def query_gate(config: lib.HookConfig, node: str, timeout_s: float, log: lib.Logger) -> tuple[bool, str]:
    """(allow, reason) from the first controller of ``config.controller_urls`` that answers usably, each
    asked with an equal share of what is left of ``timeout_s``. Fail-open: anything but HTTP 200 +
    ``"allow": false`` allows; a controller that refuses our credentials is logged at ERROR as the
    configuration error it is (module docstring: "Refused credentials")."""
    urls = config.controller_urls
    deadline = time.monotonic() + timeout_s
    why = "no controller"
    for i, url in enumerate(urls):
        share = (deadline - time.monotonic()) / (len(urls) - i)
        if share <= 0:
            break
        answer, why, refused = _ask_gate(config, url, node, share)
        if answer is not None:
            return answer, why
        more = "; asking the next" if i + 1 < len(urls) else "; fail-open, allowing"
        if refused:
            log(
                "ERROR",
                f"controller gate AUTH REFUSED, a configuration error: {why}{more}; the health gate is off "
                "on this node until it is fixed",
            )
        else:
            log("WARNING", f"controller gate {why}{more}")
    return True, f"controller {why}"


def _ask_gate(config: lib.HookConfig, url: str, node: str, timeout_s: float) -> tuple[bool | None, str, bool]:
    """(allow, reason, False) from one controller, or (None, why not, refused): ``refused`` when it turned
    our credentials down (or they could not be sent), rather than giving no usable answer."""
    safe_node = "".join(c if c.isalnum() or c in "-_." else f"%{ord(c):02X}" for c in node)
    try:
        status, body = get(config, f"{url.rstrip('/')}/v1/nodes/{safe_node}/gate", timeout_s)
    except ControllerAuthError as exc:
        return None, str(exc), True
    except Exception as exc:  # down, refused, slow, DNS, ... all mean "allow"
        return None, f"unreachable at {url} ({type(exc).__name__}: {exc})", False
    if status != 200:
        return None, f"at {url} answered HTTP {status}", False
    try:
        doc = json.loads(body)
        allow = doc["allow"]
        reason = str(doc.get("reason", ""))
        if not isinstance(allow, bool):
            raise TypeError(f"'allow' is {type(allow).__name__}, not bool")
    except Exception as exc:
        return None, f"answer from {url} unusable ({exc})", False
    return allow, reason, False


def _write_job_state(config: lib.HookConfig, env: Mapping[str, str], job_id: str, gpus: list[int]) -> None:
    comment = env.get("SLURM_JOB_COMMENT")
    partition = env.get("SLURM_JOB_PARTITION")
    klass, source = lib.class_from(comment, partition)
    state = {
        "version": 1,
        "job_id": job_id,
        "user": env.get("SLURM_JOB_USER"),
        "uid": env.get("SLURM_JOB_UID"),
        "prolog_time": time.time(),
        "gpus": gpus,
        "partition": partition,
        "constraints": env.get("SLURM_JOB_CONSTRAINTS"),
        "comment": comment,
        "declared_class": klass,
        "class_source": source,
    }
    directory = os.path.join(config.spool_dir, "jobs")
    os.makedirs(directory, mode=0o755, exist_ok=True)
    lib.atomic_write(os.path.join(directory, f"{job_id}.json"), json.dumps(state, sort_keys=True).encode())


def is_canary(env: Mapping[str, str]) -> bool:
    """A FleetYield canary: submitted by root (the controller) with the canary job name or constraint."""
    if env.get("SLURM_JOB_UID", "").strip() != "0":
        return False
    name = env.get("SLURM_JOB_NAME", "")
    constraints = env.get("SLURM_JOB_CONSTRAINTS", "")
    return name.startswith("fy_canary_") or "fy_canary" in constraints.replace("&", ",").split(",")


def run(env: Mapping[str, str], log: lib.Logger) -> int:
    """The prolog proper. Returns the exit status; raises ``HookTimeout`` at the deadline."""
    started, config, deadline, node = lib.begin(env, log, lambda: _hard_exit(log))
    job_id = env.get("SLURM_JOB_ID", "")
    if not lib.valid_job_id(job_id):
        log("ERROR", f"SLURM_JOB_ID {job_id!r} missing or invalid (not run by slurmd?); allowing")
        return EXIT_ALLOW

    # (a) the node agent's pending fatal events: local file, checked first. FleetYield's own canary jobs
    # (root, named fy_canary_* or constrained to fy_canary) are let through: they ARE the check of a node
    # with pending events; refusing them would make Slurm drain it as "Prolog error", out of our hands.
    if is_canary(env):
        log("INFO", f"canary job {job_id}: fatal-marker check skipped (the canary is the check)")
        return EXIT_ALLOW
    try:
        fatal = read_fatal(config.agent_state_dir, log)
    except lib.HookTimeout:
        raise
    except Exception as exc:
        log("WARNING", f"cannot check fatal marker ({type(exc).__name__}: {exc}); no verdict, allowing")
        fatal = []
    if fatal:
        detail = "; ".join(_describe(e) for e in fatal[:5])
        log("ERROR", f"DENY: {len(fatal)} pending fatal GPU event(s) on {node}: {detail}")
        return EXIT_DENY

    # (b) the node's attestation verdict (when attest is on), fail-closed: a tenant must never start on a
    # node that was not shown clean after the previous job.
    if config.attest:
        from prolog_epilog import attest_gate

        allow, reason = attest_gate.check_verdict(
            config.verdict_file,
            node,
            time.time(),
            config.attest_max_age_s,
            config.attest_controller_pubkey or None,
        )
        if allow:  # what can change between quotes (a module loaded since): recomputed now
            names = [n.strip() for n in config.attest_recheck.split(",")]
            try:
                allow, reason = attest_gate.recheck(
                    config.verdict_file, config.attest_root, names, config.agent_state_dir
                )
            except lib.HookTimeout:
                raise
            except Exception as exc:  # fail-closed like the verdict check itself
                allow, reason = (
                    False,
                    f"fleetyield: attestation re-check failed ({type(exc).__name__}: {exc})",
                )
        if not allow:
            log("ERROR", f"DENY: {reason}")
            return EXIT_DENY

    # (c) the controller's quarantine verdict, fail-open.
    if config.controller_url:
        budget = min(config.timeout_ms / 1000.0, deadline - time.monotonic() - 0.05)
        if budget > 0:
            allow, reason = query_gate(config, node, budget, log)
            if not allow:
                log("ERROR", f"DENY: controller quarantines {node}: {reason or 'no reason given'}")
                return EXIT_DENY

    gpus = lib.job_gpus(env)
    if config.hpc_job_mapping and gpus:
        try:
            lib.write_hpc_job_mapping(config.hpc_job_dir, gpus, job_id)
        except OSError as exc:
            log("WARNING", f"cannot write hpc_job mapping in {config.hpc_job_dir}: {exc}")
    try:
        _write_job_state(config, env, job_id, gpus)
    except OSError as exc:
        log("WARNING", f"cannot write job state in {config.spool_dir}: {exc}")
    elapsed_ms = (time.monotonic() - started) * 1000
    log("INFO", f"allow user={env.get('SLURM_JOB_USER', '-')} gpus={gpus} in {elapsed_ms:.0f} ms")
    return EXIT_ALLOW


def _hard_exit(log: lib.Logger) -> None:
    log("ERROR", "hard deadline passed twice; exiting 0 (fail-open)")
    os._exit(EXIT_ALLOW)


def main() -> None:
    sys.dont_write_bytecode = True  # the measured Python environment (hooks/python) is never written
    if lib.asked_for_cli(sys.argv[1:]):
        from prolog_epilog import _cli

        _cli.run(TAG, (__doc__ or "").split("\n", 1)[0].replace("``", ""))
    env = os.environ
    log = lib.Logger(TAG, env.get("SLURM_JOB_ID", "-") or "-")
    code: int | None = None
    try:
        try:
            code = run(env, log)
        finally:
            lib.disarm_deadline()
    except lib.HookTimeout:
        # A verdict reached before the deadline (the timer fired on the way out) stands.
        if code is None:
            log("ERROR", "hard deadline passed; allowing the job (fail-open)")
    except Exception as exc:  # a bug here must never drain the fleet
        log("ERROR", f"internal error {type(exc).__name__}: {exc}; allowing the job (fail-open)")
    finally:
        with contextlib.suppress(BaseException):
            lib.disarm_deadline()
    sys.exit(EXIT_ALLOW if code is None else code)


if __name__ == "__main__":
    main()
