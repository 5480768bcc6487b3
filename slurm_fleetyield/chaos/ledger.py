"""The settle ledger of a chaos run, computed from Slurm's accounting with the core's own functions.

Input: ``sacct -X -D -P -o <SACCT_FIELDS>`` text (header line first; ``-D``: every attempt of a requeued job),
the epilog's job-outcome records (``last_checkpoint``), the faults the chaos log injected (node, unix time)
and the premium node names. Output: ``LedgerEntry`` per job attempt, settled by ``core.settle.settle_job``
(the same pure function the controller uses), and their ``totals``. The same code settles both arms of an
A/B run, so the bare-Slurm arm is measured by the identical rule.

Checkpoints come from the job script's own log (``<progress dir>/<job id>.ckpts``, ``parse_ckpt_logs``), the
same source in both arms: the epilog's records are forwarded to (and deleted for) a running controller only.
A job attempt that FAILED with ``GPU_FAULT_EXIT`` (the job script's "my GPU faulted" code) adds a fault at its
end on its nodes: a job that starts on a GPU that faulted earlier and crashes at once was lost to the
hardware too, although the injection happened before it started.

What is measured: Slurm's real placements, states, times and exit codes. What is simulated: the GPU faults
(raised in the node agents' fake backend) and the work (``fy-train-job.sh`` sleeps).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from slurm_fleetyield.core.model import JobOutcome, LedgerEntry, Tier, WorkloadClass
from slurm_fleetyield.core.params import SettleParams
from slurm_fleetyield.core.settle import settle_job, totals
from slurm_fleetyield.core.state import ControllerState, NodeMemory, ReclaimMemory

SACCT_FIELDS = "JobID,State,ExitCode,Submit,Start,End,NodeList,AllocTRES,Comment"
GPU_FAULT_EXIT = 86  # contrib/chaos/fy-train-job.sh: crashed because one of its GPUs faulted
_NULL = {"", "Unknown", "None", "N/A"}


def _time(s: str) -> float | None:
    s = s.strip()
    if s in _NULL:
        return None
    if s.replace(".", "", 1).isdigit():
        return float(s)
    return datetime.fromisoformat(s).timestamp()


def _gpus(tres: str) -> int:
    for item in tres.split(","):
        k, _, v = item.partition("=")
        if k == "gres/gpu":
            return int(v or 0)
    return 0


def _workload(comment: str) -> WorkloadClass | None:
    for tok in comment.replace(";", " ").replace(",", " ").split():
        if tok.lower().startswith("fy:"):
            try:
                return WorkloadClass(tok[3:].lower())
            except ValueError:
                return None
    return None


def _hosts(nodelist: str) -> tuple[str, ...]:
    """Expand the simple hostlists of the docker cluster (``gpu-h100-[1-2]``, ``a,b``)."""
    out: list[str] = []
    depth, cur = 0, ""
    parts = []
    for ch in nodelist:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in (p.strip() for p in parts):
        if not p or p in _NULL or p == "None assigned":
            continue
        if "[" not in p:
            out.append(p)
            continue
        prefix, _, rest = p.partition("[")
        for rng in rest.rstrip("]").split(","):
            a, _, b = rng.partition("-")
            for i in range(int(a), int(b or a) + 1):
                out.append(f"{prefix}{str(i).zfill(len(a))}")
    return tuple(out)


def parse_sacct(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    head = lines[0].split("|")
    return [dict(zip(head, ln.split("|", len(head) - 1), strict=False)) for ln in lines[1:]]


def outcomes(
    rows: Iterable[Mapping[str, str]],
    checkpoints: Mapping[str, Sequence[float]],
    premium: frozenset[str],
    classes: Mapping[str, str] | None = None,
) -> tuple[list[JobOutcome], tuple[tuple[float, float | None], ...]]:
    """Job attempts as ``JobOutcome``s and the intervals premium-needing work was pending (submit..start).

    ``classes``: job id -> workload class as submitted (the chaos log knows it); otherwise the class comes
    from sacct's Comment, which Slurm stores only with ``AccountingStoreFlags=job_comment``."""
    out: list[JobOutcome] = []
    pending: list[tuple[float, float | None]] = []
    premium_classes = SettleParams().premium_needing_classes
    for r in rows:
        jid = r.get("JobID", "")
        if not jid or "." in jid:
            continue
        state = r.get("State", "").split()[0] if r.get("State") else ""
        start, end, submit = _time(r.get("Start", "")), _time(r.get("End", "")), _time(r.get("Submit", ""))
        base = jid.split("_")[0]
        cls = (classes or {}).get(base)
        wl = _workload(f"fy:{cls}") if cls else _workload(r.get("Comment", ""))
        if wl is not None and wl.value in premium_classes and submit is not None:
            pending.append((submit, start))
        if start is None or end is None:
            continue
        nodes = _hosts(r.get("NodeList", ""))
        code = r.get("ExitCode", "0:0").split(":")[0]
        ckpt = max((c for c in checkpoints.get(base, ()) if start <= c <= end), default=None)  # this attempt
        out.append(
            JobOutcome(
                int(base), nodes, _gpus(r.get("AllocTRES", "")), wl, start, end, state,
                int(code) if code.isdigit() else None, ckpt, "", any(n in premium for n in nodes),
            )
        )  # fmt: skip
    return out, union(pending)


def union(intervals: Iterable[tuple[float, float | None]]) -> tuple[tuple[float, float | None], ...]:
    """The disjoint union of (start, end or None = still open) intervals, sorted.

    Premium misuse counts a GPU-second once while *any* premium-needing job waits, as the controller records
    it (``core.settle._track_pending``: one interval while any such job is PENDING); one interval per waiting
    job would count the same GPU-second once per job waiting with it."""
    out: list[tuple[float, float | None]] = []
    for a, b in sorted(intervals, key=lambda iv: iv[0]):
        if out:
            la, lb = out[-1]
            if lb is None or a <= lb:  # overlaps (or touches) the last one: extend it
                out[-1] = (la, None if lb is None or b is None else max(lb, b))
                continue
        out.append((a, b))
    return tuple(out)


def parse_ckpt_logs(text: str) -> list[dict[str, object]]:
    """``grep -H . <dir>/*.ckpts`` output (``<path>/<job id>.ckpts:<unix time> <work done>``) as
    ``{"job_id", "last_checkpoint"}`` records, one per checkpoint; malformed lines are skipped."""
    out: list[dict[str, object]] = []
    for line in text.splitlines():
        path, sep, rest = line.partition(":")
        name = path.rsplit("/", 1)[-1]
        fields = rest.split()
        if not sep or not name.endswith(".ckpts") or not fields:
            continue
        job = name[: -len(".ckpts")]
        try:
            t = float(fields[0])
        except ValueError:
            continue
        if job.isdigit():
            out.append({"job_id": job, "last_checkpoint": t})
    return out


def ledger(
    sacct_text: str,
    outcome_records: Sequence[Mapping[str, object]],
    faults: Sequence[tuple[str, float]],
    premium: frozenset[str],
    sp: SettleParams | None = None,
    classes: Mapping[str, str] | None = None,
    reclaimed: Sequence[tuple[int, float]] = (),
) -> tuple[list[LedgerEntry], Mapping[str, float]]:
    """Settle every job attempt; ``faults``: (node, unix time) of each injected fatal fault; ``classes``:
    job id -> workload class as submitted (see ``outcomes``); ``reclaimed``: (job id, unix time) of each
    requeue the controller's premium reclaim decided (its ``reclaim`` events; FleetYield's arm only)."""
    sp = sp or SettleParams()
    ckpts: dict[str, list[float]] = {}
    for rec in outcome_records:
        c = rec.get("last_checkpoint")
        if isinstance(c, (int, float)):
            ckpts.setdefault(str(rec.get("job_id")), []).append(float(c))
    jobs, pending = outcomes(parse_sacct(sacct_text), ckpts, premium, classes)
    hist: dict[str, list[tuple[float, str]]] = {}
    for node, t in faults:
        hist.setdefault(node, []).append((t, ""))
    for o in jobs:
        if o.state == "FAILED" and o.exit_code == GPU_FAULT_EXIT:
            for node in o.node_list:
                hist.setdefault(node, []).append((o.end, "job crashed on a GPU fault"))
    state = ControllerState(
        nodes={
            n: NodeMemory(Tier.UNKNOWN, 0.0, "chaos", fatal_history=tuple(sorted(h))) for n, h in hist.items()
        },
        reclaim=ReclaimMemory(requeued=tuple(sorted(reclaimed))),
    )
    entries = [settle_job(o, state, pending, sp) for o in jobs]
    return entries, totals(tuple(entries)) | {
        "jobs": float(len(entries)),
        "completed": float(sum(e.state == "COMPLETED" for e in entries)),
        "failures": float(sum(e.failure for e in entries)),
        "hardware_failures": float(sum(e.cause in ("hardware", "node_fail", "drain") for e in entries)),
        "reclaimed": float(sum(e.cause == "reclaimed" for e in entries)),
    }


def reclaim_requeues(events_json: str) -> list[tuple[int, float]]:
    """(job id, time) of each requeue in a controller's ``fleetyield events --json`` output (``reclaim``
    events carry the job ids in ``data.jobs``); anything unreadable is skipped."""
    try:
        events = json.loads(events_json)
    except ValueError:
        return []
    out: list[tuple[int, float]] = []
    for e in events if isinstance(events, list) else ():
        if not isinstance(e, dict) or e.get("kind") != "reclaim":
            continue
        data, t = e.get("data"), e.get("time")
        if not isinstance(data, dict) or not isinstance(t, (int, float)):
            continue
        jobs = data.get("jobs")
        if isinstance(jobs, list):
            out.extend((j, float(t)) for j in jobs if isinstance(j, int))
    return out
