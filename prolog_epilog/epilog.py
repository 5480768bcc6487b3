"""``fleetyield-epilog``: post-job cleanup and outcome spooling run by slurmd (stdlib only).

Install (slurm.conf)::

    Epilog=/opt/fleetyield/bin/fleetyield-epilog

Input: the Slurm Epilog environment, the per-job state file the prolog left in
``<spool_dir>/jobs/<jobid>.json``, and the hook config (see ``_hooklib``).

Output:

* this job's id removed from the dcgm-exporter hpc_job mapping files (only this job's
  id: a file naming another job is never removed, a shared one is rewritten without
  this id);
* a job-outcome record ``<spool_dir>/outcomes/<jobid>.json`` written atomically (if a
  record for the same job id is still undelivered, e.g. the job was requeued and ran
  here again, the new one goes to ``<jobid>-<epoch ms>.json``; deliverers must glob
  ``*.json`` and read the job id from the record). Delivery to the controller is
  asynchronous (a separate sender); the epilog never talks to the network.

Record fields: ``version``, ``job_id``, ``user``, ``uid``, ``node`` (this node),
``nodes`` (``SLURM_JOB_NODELIST`` hostlist when slurmd provides it), ``gpus``,
``partition``, ``start_time`` + ``start_time_source`` (``SLURM_JOB_START_TIME`` when set
-- Slurm >= 23.02 -- else the prolog's clock), ``end_time`` (this epilog's clock),
``slurm_end_time`` (``SLURM_JOB_END_TIME``: the job's end as Slurm records it, when set),
``exit_code`` / ``exit_signal`` (from ``SLURM_JOB_EXIT_CODE2`` ``"<exit>:<sig>"``, set in
the slurmd Epilog only by newer Slurm; Slurm 22.05 documents exit codes for
EpilogSlurmctld only, so they are null there), ``exit_status_raw``
(``SLURM_JOB_EXIT_CODE``, wait(2) status), ``derived_exit_code``
(``SLURM_JOB_DERIVED_EC``), ``comment``, ``declared_class`` + ``class_source`` (the
``fy:<class>`` comment, else a partition named like a class -- the job_submit.lua rule),
``mapping_removed`` (GPU files removed), ``epilog_time``, ``last_checkpoint`` +
``last_checkpoint_source`` (see below).

Checkpoint convention (how a job tells the ledger how much of its work survives a crash): after each
checkpoint the job writes the checkpoint's Unix time to ``<spool_dir>/ckpt/$SLURM_JOB_ID`` on its batch node::

    date +%s > /var/spool/fleetyield/ckpt/$SLURM_JOB_ID

The directory is node-local, mode 1733 (anyone may create a file, nobody may list or delete another's; made
by the installer and re-made by this hook). The epilog reads that one small local file (never the job's
submit directory: a shared file system could hang it past its 2 s deadline, and a root hook must not
follow user paths), accepts it only if it is a regular file owned by the job's uid holding a number, and
removes it. A job may instead put ``ckpt=<unix>`` in its comment (``scontrol update JobId=$SLURM_JOB_ID
Comment="fy:<class> ckpt=<unix>"``): read when slurmd passes the current comment to the Epilog (Slurm 22.05
passes none; the Prolog's copy is then from job start). The file wins when both exist.

Attestation (``attest = true`` in the hook config; ``attest_gate.py``): first the node's verdict file is
invalidated, then the job's areas (``attest_areas``) are wiped, what the job's uid left in the shared
writable places (``/tmp``, ``/var/tmp``, ``/dev/shm``, ``/dev/mqueue``, ``/run/lock``, ``/var/crash``, its
crontab, ``at`` jobs, linger flag, SysV IPC; ``attest_gate.wipe_tenant``, skipped while the uid runs another
job here) is removed, and the agent scrubs the job's GPUs (all
stopping ``WIPE_MARGIN_S`` before the deadline), and after the outcome record the agent is asked for a
fresh hand-over, bounded by what is left of the deadline, naming the other jobs the Prolog recorded here
(a shared node: ``attest_gate.running_jobs``; their tenants are present, not left behind). None of it
changes the exit status.

Exit status: always 0. A failing Epilog sets the node DOWN, which is harsher than the
prolog's drain and also hits every other job still running on a shared node; nothing
the epilog does (or fails to do) is node-fatal: GPU faults are caught by the agent, the
controller and the next job's prolog. So errors are logged and the hook exits 0, and a
hard deadline (``hard_timeout_ms``) bounds it like the prolog.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from collections.abc import Mapping

from prolog_epilog import _hooklib as lib

TAG = "fleetyield-epilog"


def _int_or_none(raw: str | None) -> int | None:
    try:
        return int(raw) if raw not in (None, "") else None  # type: ignore[arg-type]
    except ValueError:
        return None


def _read_job_state(path: str, log: lib.Logger) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        return state if isinstance(state, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log("WARNING", f"job state {path} unreadable ({exc}); outcome record will lack prolog data")
        return {}


def build_outcome(env: Mapping[str, str], state: Mapping[str, object], job_id: str, node: str) -> dict:
    """The job-outcome record from the Epilog env, falling back on the prolog's state."""
    now = time.time()
    start_env = _int_or_none(env.get("SLURM_JOB_START_TIME"))
    if start_env:
        start, start_source = float(start_env), "slurm"
    elif isinstance(state.get("prolog_time"), (int, float)):
        start, start_source = float(state["prolog_time"]), "prolog"  # type: ignore[arg-type]
    else:
        start, start_source = None, None
    exit_code = exit_signal = None
    code2 = env.get("SLURM_JOB_EXIT_CODE2", "")
    if ":" in code2:
        exit_code, exit_signal = (_int_or_none(x) for x in code2.split(":", 1))
    gpus = lib.job_gpus(env) or [g for g in state.get("gpus", []) or [] if isinstance(g, int)]  # type: ignore[union-attr]
    comment = env.get("SLURM_JOB_COMMENT") or state.get("comment")
    partition = env.get("SLURM_JOB_PARTITION") or state.get("partition")
    klass, source = lib.class_from(
        comment if isinstance(comment, str) else None, partition if isinstance(partition, str) else None
    )
    return {
        "version": 1,
        "job_id": job_id,
        "user": env.get("SLURM_JOB_USER") or state.get("user"),
        "uid": _int_or_none(env.get("SLURM_JOB_UID") or str(state.get("uid") or "")),
        "node": node,
        "nodes": env.get("SLURM_JOB_NODELIST"),
        "gpus": gpus,
        "partition": partition,
        "start_time": start,
        "start_time_source": start_source,
        "end_time": now,
        "slurm_end_time": _int_or_none(env.get("SLURM_JOB_END_TIME")),
        "exit_code": exit_code,
        "exit_signal": exit_signal,
        "exit_status_raw": _int_or_none(env.get("SLURM_JOB_EXIT_CODE")),
        "derived_exit_code": env.get("SLURM_JOB_DERIVED_EC"),
        "comment": comment,
        "declared_class": klass,
        "class_source": source,
        "epilog_time": now,
    }


CKPT_DIR = "ckpt"
MAX_CKPT_BYTES = 64


def _ckpt_from_comment(comment: object) -> float | None:
    if not isinstance(comment, str):
        return None
    for token in comment.replace(",", " ").replace(";", " ").split():
        if token.lower().startswith("ckpt="):
            try:
                value = float(token[5:])
            except ValueError:
                return None
            return value if value > 0 else None
    return None


def read_checkpoint(spool_dir: str, job_id: str, uid: int | None, log: lib.Logger) -> float | None:
    """The job's last checkpoint time from ``<spool_dir>/ckpt/<job_id>`` (then removed), or None."""
    directory = os.path.join(spool_dir, CKPT_DIR)
    try:
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, 0o1733)
    except OSError:
        pass
    path = os.path.join(directory, job_id)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log("WARNING", f"checkpoint file {path} unreadable ({exc}); ignored")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid not in (uid, 0)):
            log("WARNING", f"checkpoint file {path} is not a regular file of uid {uid}; ignored")
            return None
        data = os.read(fd, MAX_CKPT_BYTES + 1)
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
    try:
        value = float(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        log("WARNING", f"checkpoint file {path} does not hold a Unix time; ignored")
        return None
    return value if value > 0 and len(data) <= MAX_CKPT_BYTES else None


def write_outcome(spool_dir: str, record: dict) -> str:
    """Spool ``record``; never overwrite an undelivered record. Returns the path."""
    directory = os.path.join(spool_dir, "outcomes")
    os.makedirs(directory, mode=0o755, exist_ok=True)
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    path = os.path.join(directory, f"{record['job_id']}.json")
    try:
        lib.write_new(path, data)
    except FileExistsError:
        path = os.path.join(directory, f"{record['job_id']}-{int(time.time() * 1000)}.json")
        lib.atomic_write(path, data)
    return path


def run(env: Mapping[str, str], log: lib.Logger) -> None:
    started, config, deadline, node = lib.begin(env, log, lambda: _hard_exit(log))
    job_id = env.get("SLURM_JOB_ID", "")
    if not lib.valid_job_id(job_id):
        log("ERROR", f"SLURM_JOB_ID {job_id!r} missing or invalid (not run by slurmd?); nothing to do")
        return
    if config.attest:  # first: the verdict stops counting the moment the job ends
        from prolog_epilog import attest_gate

        if attest_gate.invalidate_verdict(config.verdict_file):
            log("INFO", f"attestation verdict {config.verdict_file} invalidated")

    removed: list[int] = []
    if config.hpc_job_mapping:
        try:
            removed, rewritten = lib.remove_hpc_job_mapping(config.hpc_job_dir, job_id)
            if rewritten:
                log("INFO", f"hpc_job mapping shared with other jobs, rewritten for gpus {rewritten}")
        except OSError as exc:
            log("WARNING", f"cannot clean hpc_job mapping in {config.hpc_job_dir}: {exc}")

    state_path = os.path.join(config.spool_dir, "jobs", f"{job_id}.json")
    state = _read_job_state(state_path, log)
    record = build_outcome(env, state, job_id, node)
    record["mapping_removed"] = removed
    ckpt = read_checkpoint(config.spool_dir, job_id, record.get("uid"), log)
    source = "file" if ckpt is not None else None
    if ckpt is None:
        ckpt = _ckpt_from_comment(record.get("comment"))
        source = "comment" if ckpt is not None else None
    record["last_checkpoint"], record["last_checkpoint_source"] = ckpt, source
    if config.attest:
        _attest_wipe(config, job_id, record, deadline, log)
    try:
        path = write_outcome(config.spool_dir, record)
    except OSError as exc:
        log("ERROR", f"cannot spool the outcome record in {config.spool_dir}: {exc}")
        if config.attest:
            _attest_handover(config, job_id, deadline, log)
        return
    try:
        os.unlink(state_path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log("WARNING", f"cannot remove job state {state_path}: {exc}")
    if config.attest:
        _attest_handover(config, job_id, deadline, log)
    elapsed_ms = (time.monotonic() - started) * 1000
    log("INFO", f"done: mapping removed for gpus {removed}, outcome {path} in {elapsed_ms:.0f} ms")


WIPE_MARGIN_S = 0.3
"""The wipe stops this long before the hard deadline: the outcome record and the hand-over still fit."""


def _attest_wipe(config: lib.HookConfig, job_id: str, record: dict, deadline: float, log: lib.Logger) -> None:
    """Wipe the job's areas and ask the agent to scrub its GPUs (attest_gate.wipe never raises)."""
    from prolog_epilog import attest_gate

    areas = [a.strip() for a in config.attest_areas.split(",") if a.strip()]
    user = record.get("user")
    report = attest_gate.wipe(
        job_id,
        areas,
        deadline - WIPE_MARGIN_S,
        user=user if isinstance(user, str) else None,
        gpus=[g for g in record.get("gpus") or [] if isinstance(g, int)],
        agent_state_dir=config.agent_state_dir,
    )
    uid = record.get("uid")
    tenant = attest_gate.wipe_tenant(
        uid if isinstance(uid, int) else None,
        user if isinstance(user, str) else None,
        job_id,
        deadline - WIPE_MARGIN_S,
        root=config.attest_root,
        uid_min=config.attest_uid_min,
        spool_dir=config.spool_dir,
    )
    ok = report["ok"] and tenant["status"] in ("removed", "skipped")
    summary = ", ".join(f"{a.get('path', a['template'])}: {a['status']}" for a in report["areas"]) or "none"
    left = f"{tenant['status']} {tenant['removed'][:8]}"
    if "reason" in tenant:
        left += f" ({tenant['reason']})"
    scrub = report["scrub"]
    log(
        "INFO" if ok else "WARNING",
        f"wipe {'ok' if ok else 'INCOMPLETE'}: areas {summary}; tenant {left}; scrub {scrub}",
    )


def _attest_handover(config: lib.HookConfig, job_id: str, deadline: float, log: lib.Logger) -> None:
    """Ask the agent for a fresh verdict (nonce -> quote -> verdict file) within what is left of the
    deadline. A failure is logged: the next Prolog then denies on the missing verdict (fail-closed)."""
    from prolog_epilog import attest_gate

    left = deadline - time.monotonic() - 0.05
    if left <= 0:
        log("WARNING", "no time left for the attestation hand-over; the next Prolog will deny")
        return
    present = attest_gate.running_jobs(config.spool_dir, job_id)  # a shared node: still here
    try:
        summary = attest_gate.request_handover(config.agent_state_dir, job_id, left, present)
        status = summary.get("status") if isinstance(summary, dict) else summary
        log("INFO" if status == "pass" else "ERROR", f"attestation hand-over: {summary}")
    except lib.HookTimeout:
        raise
    except Exception as exc:  # agent down, controller down, timeout: logged, never fails the job
        log("WARNING", f"attestation hand-over failed ({type(exc).__name__}: {exc})")


def _hard_exit(log: lib.Logger) -> None:
    log("ERROR", "hard deadline passed twice; exiting 0")
    os._exit(0)


def main() -> None:
    sys.dont_write_bytecode = True  # the measured Python environment (hooks/python) is never written
    if lib.asked_for_cli(sys.argv[1:]):
        from prolog_epilog import _cli

        _cli.run(TAG, (__doc__ or "").split("\n", 1)[0].replace("``", ""))
    env = os.environ
    log = lib.Logger(TAG, env.get("SLURM_JOB_ID", "-") or "-")
    try:
        try:
            run(env, log)
        finally:
            lib.disarm_deadline()
    except lib.HookTimeout:
        log("ERROR", "hard deadline passed; exiting 0 (outcome record may be missing)")
    except Exception as exc:  # never set the node DOWN over a bookkeeping bug
        log("ERROR", f"internal error {type(exc).__name__}: {exc}; exiting 0")
    finally:
        with contextlib.suppress(BaseException):
            lib.disarm_deadline()
    sys.exit(0)


if __name__ == "__main__":
    main()
