"""Workloads: the real Alibaba openb trace, a synthetic generator, and a generic trace format.

Input: a trace file (openb CSV, generic CSV/JSON, or ``sacct --parsable2`` output) or generator parameters.
Output: ``Job`` tuples sorted by submit time; ``fill`` turns a trace into a workload that fills a fleet over a
horizon. A bad input raises ``TraceError`` naming the file, the line and the value.

openb (Weng et al., "Beware of Fragmentation", USENIX ATC '23; github.com/alibaba/clusterdata,
cluster-trace-gpu-v2023, commit 7a6c496e) has no job classes and no checkpoint flags, so they are assigned by
this documented rule, never per job:
- ``num_gpu`` 0 (CPU pods): dropped.
- qos LS -> decode (latency-sensitive inference: a service, which does not checkpoint; an interruption loses
  the requests in flight and its restart, not what it served: sim/runner.py ``service_loss``).
- qos BE -> batch (best effort; checkpointable every ``BATCH_CKPT_S``).
- qos Burstable/Guaranteed with ``num_gpu`` 8 -> pretrain gang; other Burstable/Guaranteed -> finetune
  (both checkpointable every ``TRAIN_CKPT_S``).
- ``gpu_milli`` < 1000 (a GPU shared with other pods): Slurm's gres allocates whole GPUs (no MPS/shard in
  this model), so a shared GPU is counted as one whole GPU. This over-states the load of the shared pods;
  ``fill`` normalises total load anyway.
- Sizes: ``gpu_scale`` (default 8) multiplies GPUs: one openb GPU becomes one whole 8-GPU node, so 1-GPU pods
  become whole-node jobs and 8-GPU pods become 8-node gangs (openb has almost no multi-node gangs; a gang is
  what makes pretraining expensive to lose). Jobs needing more than ``gpus_per_node`` GPUs take whole nodes.
- Durations: ``deletion_time - scheduled_time`` (``creation_time`` when never scheduled). Running/Pending pods
  were still running or pending when the trace ended: their duration is a lower bound (``censored``). Pending
  pods never got a GPU and are dropped. Durations are clipped to ``max_duration_h`` (default 72 h): openb's
  long-lived inference pods (LS, up to 145 days) are modelled as service instances redeployed every 3 days.
- Filling 90 days (``fill``): the 149-day arrival pattern is compressed onto the horizon (arrival x
  horizon/149 d), then replicated with seeded offsets until the offered GPU-hours reach ``load`` x the
  fleet's GPU-hours: whole replicas, then one thinned replica (each job kept with the fractional part's
  probability, drawn from the seed), so any load is replayed, not the nearest whole number of replicas.
  Durations are not compressed. ``offered_load`` measures what a job stream offers.

Generic format (CSV with a header, or JSON: a list of objects), one job per row:
``job_id,submit_s,duration_s,nodes,gpus_per_node,workload,checkpoint_s`` where ``workload`` is one of
decode|pretrain|finetune|batch and ``checkpoint_s`` is empty/null for a job that cannot checkpoint. Every CSV
row has every column (a row without its trailing comma is an error, never a job that cannot checkpoint); job
ids are unique; a trace without jobs is an error naming its file.
``sacct --parsable2 --format=JobID,Submit,Start,End,NNodes,AllocTRES,Comment`` output is also read: the class
comes from ``fy:<class>`` in Comment (job_submit.lua's convention), else pretrain; GPUs from ``gres/gpu=N``.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from slurm_fleetyield.sim.fast import fast_init

CLASSES = ("decode", "pretrain", "finetune", "batch")
BATCH_CKPT_S = 1800.0  # assumption: batch/eval jobs checkpoint every 30 min
TRAIN_CKPT_S = 3600.0  # assumption: training checkpoints hourly
OPENB_DAYS = 149.0
OPENB_COLUMNS = [
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
]
GENERIC_COLUMNS = ("job_id", "submit_s", "duration_s", "nodes", "gpus_per_node", "workload", "checkpoint_s")


class TraceError(ValueError):
    """A trace that cannot be read: names the source, the line (1-based, header = 1) and the problem."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {problem}")
        self.source, self.line, self.problem = source, line, problem


@fast_init
@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    submit: float  # seconds from the start of the run
    duration: float  # seconds of work when never interrupted
    nodes: int
    gpus_per_node: int
    workload: str  # decode | pretrain | finetune | batch
    checkpoint_s: float | None  # None: not checkpointable (an interruption loses the whole run)
    censored: bool = False
    ckpt_write_s: float = 0.0  # seconds one checkpoint write blocks training (every checkpoint_s of work)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.duration / 3600.0


# ---- openb ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenbStats:
    rows: int
    gpu_tasks: int
    size_mix: dict[int, int]
    qos_mix: dict[str, int]
    censored: int
    median_runtime_s: float
    p90_runtime_s: float


def _sizes(gpus: int, gpu_scale: int, gpus_per_node: int) -> tuple[int, int]:
    total = gpus * gpu_scale
    if total <= gpus_per_node:
        return 1, total
    return math.ceil(total / gpus_per_node), gpus_per_node


def load_openb(
    path: str | Path,
    gpu_scale: int = 8,
    gpus_per_node: int = 8,
    max_duration_h: float = 72.0,
) -> tuple[list[Job], OpenbStats]:
    """Read ``openb_pod_list_default.csv`` into jobs (times from the trace start) and its measured facts."""
    src = str(path)
    rows = _read_csv(src, OPENB_COLUMNS)
    jobs: list[Job] = []
    size_mix: dict[int, int] = {}
    qos_mix: dict[str, int] = {}
    runtimes: list[float] = []
    gpu_tasks = censored = 0
    for line, r in rows:
        try:
            num_gpu = int(r["num_gpu"])
            milli = int(r["gpu_milli"] or 0)
            created = float(r["creation_time"])
            sched = float(r["scheduled_time"]) if r["scheduled_time"] else None
            deleted = float(r["deletion_time"]) if r["deletion_time"] else None
        except ValueError as exc:
            raise TraceError(src, line, f"not a number: {exc}") from None
        qos, phase = r["qos"], r["pod_phase"]
        if qos not in ("LS", "BE", "Burstable", "Guaranteed"):
            raise TraceError(src, line, f"unknown qos {qos!r}")
        if num_gpu < 0 or milli < 0:
            raise TraceError(src, line, f"negative GPU request num_gpu={num_gpu} gpu_milli={milli}")
        if num_gpu == 0:
            continue
        gpu_tasks += 1
        size_mix[num_gpu] = size_mix.get(num_gpu, 0) + 1
        qos_mix[qos] = qos_mix.get(qos, 0) + 1
        start = sched if sched is not None else created
        if deleted is not None:
            runtimes.append(max(0.0, deleted - created))
        if phase == "Pending" or deleted is None:
            continue  # never ran (or no end at all): nothing to replay
        is_censored = phase in ("Running", "Pending")
        censored += is_censored
        duration = min(max(1.0, deleted - start), max_duration_h * 3600.0)
        if qos == "LS":
            workload, ckpt = "decode", None
        elif qos == "BE":
            workload, ckpt = "batch", BATCH_CKPT_S
        elif num_gpu >= 8:
            workload, ckpt = "pretrain", TRAIN_CKPT_S
        else:
            workload, ckpt = "finetune", TRAIN_CKPT_S
        nodes, per_node = _sizes(num_gpu, gpu_scale, gpus_per_node)
        jobs.append(Job(len(jobs) + 1, created, duration, nodes, per_node, workload, ckpt, is_censored))
    runtimes.sort()
    stats = OpenbStats(
        rows=len(rows),
        gpu_tasks=gpu_tasks,
        size_mix=dict(sorted(size_mix.items())),
        qos_mix=dict(sorted(qos_mix.items())),
        censored=censored,
        median_runtime_s=_quantile(runtimes, 0.5),
        p90_runtime_s=_quantile(runtimes, 0.9),
    )
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    return jobs, stats


def _quantile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def fill(
    trace: Sequence[Job],
    horizon_s: float,
    fleet_gpus: int,
    load: float,
    rng: random.Random,
    trace_span_s: float | None = None,
) -> list[Job]:
    """Compress the trace's arrivals onto the horizon and replicate it until the offered GPU-hours reach
    ``load`` x ``fleet_gpus`` x horizon: ``target / per_replica`` replicas, the whole ones complete and the
    fractional part as one thinned replica (each job kept with that probability, drawn from ``rng``). Every
    replica, the first included, is rotated by its own uniform offset (mod horizon) drawn from ``rng``: the
    seed varies the workload's timing as well as the faults. (Until stop 12 the first replica was never
    shifted, so a fleet small enough for one replica -- openb at 16 or 32 nodes -- replayed the identical job
    stream on every seed, and the confidence intervals over seeds measured fault luck only. Until issue 25
    the count was rounded to whole replicas: a trace of about one replica's load ran the same at 0.2 and
    0.7.)"""
    if not trace:
        raise TraceError("<trace>", None, "no jobs to replay")
    if not 0 < load <= 2:
        raise ValueError(f"load={load!r} must be in (0, 2]")
    span = trace_span_s or max(j.submit for j in trace) or 1.0
    squeeze = horizon_s / span
    per_replica = sum(min(j.duration, horizon_s) * j.gpus for j in trace) / 3600.0
    target = load * fleet_gpus * horizon_s / 3600.0
    replicas = target / per_replica if per_replica > 0 else 1.0
    if abs(replicas - round(replicas)) < 1e-9:  # a whole number up to float noise: no thinned replica
        replicas = float(round(replicas))
    whole, part = int(replicas), replicas - int(replicas)
    placed: list[tuple[float, Job]] = []  # (new submit time, trace job): each Job is built once, at the end
    for _ in range(whole):
        shift = rng.uniform(0.0, horizon_s)
        placed.extend([((j.submit * squeeze + shift) % horizon_s, j) for j in trace])
    if part > 0:
        shift = rng.uniform(0.0, horizon_s)
        placed.extend([((j.submit * squeeze + shift) % horizon_s, j) for j in trace if rng.random() < part])
    if not placed:
        raise TraceError(
            "<trace>",
            None,
            f"load {load:g} keeps none of the trace's {len(trace)} jobs ({replicas:.3g} of a replica): "
            "raise --load or use a smaller fleet",
        )
    placed.sort(key=lambda p: (p[0], p[1].workload, p[1].duration, p[1].nodes))
    return [
        Job(
            i, t, j.duration, j.nodes, j.gpus_per_node, j.workload, j.checkpoint_s, j.censored, j.ckpt_write_s
        )
        for i, (t, j) in enumerate(placed, 1)
    ]


def offered_load(jobs: Iterable[Job], horizon_s: float, fleet_gpus: int) -> float:
    """GPU-hours the jobs offer within the horizon (each job's work, clipped at the horizon as ``fill``
    counts it) over the fleet's GPU-hours: the load a run actually replays."""
    gpu_s = sum(min(j.duration, horizon_s) * j.gpus for j in jobs)
    return gpu_s / (fleet_gpus * horizon_s) if fleet_gpus and horizon_s else math.nan


def check_fits(jobs: Iterable[Job], nodes: int, gpus_per_node: int, source: str) -> None:
    """A job larger than the fleet can never start: an error naming the job by the trace's own id (before
    ``fill`` renumbers the replicas)."""
    for j in jobs:
        if j.gpus_per_node > gpus_per_node or j.nodes > nodes:
            raise TraceError(
                source,
                None,
                f"job {j.job_id} needs {j.nodes} x {j.gpus_per_node} GPUs, "
                f"larger than the fleet ({nodes} x {gpus_per_node})",
            )


# ---- synthetic ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyntheticParams:
    """Share of offered GPU-hours per class and each class's size and duration (log-normal median, sigma)."""

    share_pretrain: float = 0.45
    share_finetune: float = 0.15
    share_decode: float = 0.25
    share_batch: float = 0.15
    pretrain_nodes: int = 8
    pretrain_median_h: float = 24.0
    finetune_median_h: float = 6.0
    decode_median_h: float = 12.0
    batch_median_h: float = 1.0
    sigma: float = 1.0


def synthetic(
    params: SyntheticParams,
    horizon_s: float,
    fleet_gpus: int,
    load: float,
    rng: random.Random,
    gpus_per_node: int = 8,
) -> list[Job]:
    """Poisson arrivals per class sized so that each class offers its share of ``load`` x fleet GPU-hours."""
    spec = (
        (
            "pretrain",
            params.share_pretrain,
            params.pretrain_nodes,
            gpus_per_node,
            params.pretrain_median_h,
            TRAIN_CKPT_S,
        ),
        ("finetune", params.share_finetune, 1, gpus_per_node, params.finetune_median_h, TRAIN_CKPT_S),
        ("decode", params.share_decode, 1, max(1, gpus_per_node // 4), params.decode_median_h, None),
        ("batch", params.share_batch, 1, max(1, gpus_per_node // 8), params.batch_median_h, BATCH_CKPT_S),
    )
    total_share = sum(s[1] for s in spec)
    if total_share <= 0:
        raise ValueError("synthetic class shares sum to 0")
    jobs: list[Job] = []
    for cls, share, nodes, per_node, median_h, ckpt in spec:
        if share <= 0:
            continue
        mean_h = median_h * math.exp(params.sigma**2 / 2)
        gpu_h = load * fleet_gpus * horizon_s / 3600.0 * share / total_share
        rate = gpu_h / (mean_h * nodes * per_node) / horizon_s
        t = rng.expovariate(rate)
        while t < horizon_s:
            d = median_h * 3600.0 * math.exp(rng.gauss(0.0, params.sigma))
            jobs.append(Job(0, t, max(60.0, d), nodes, per_node, cls, ckpt))
            t += rng.expovariate(rate)
    jobs.sort(key=lambda j: (j.submit, j.workload))
    return [replace(j, job_id=i + 1) for i, j in enumerate(jobs)]


# ---- frontier ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrontierParams:
    """A frontier-scale training fleet: ``gangs`` synchronous training jobs spanning ``gang_share`` of the
    nodes for the whole horizon, and a background of small jobs on the rest.

    Sources and assumptions: Llama 3 405B trained on 16,384 H100s (2,048 8-GPU nodes) for 54 days with 419
    unexpected interruptions and "over 90%" effective training time (arXiv 2407.21783, sec. 3.3.4); the
    fault rate is the simulator's ``--node-rate`` (3.79 per 1,000 node-days by default is that figure). The
    gang leaves 1/16 of the fleet to spares and background work (assumption: large sites keep a few percent
    of nodes as spares; no source fixes the share, ``gang_share`` is a knob). Checkpoint interval and write
    cost: no public source gives Llama 3's; 15 min with a 10 s blocking write (asynchronous checkpointing
    keeps the blocking part to seconds) is an assumption chosen so that the baseline's effective training
    time falls in Llama 3's range, and ``checkpoint_s`` is swept. Background: single-node fine-tunes (8 GPUs,
    median 2 h) and 1-GPU batch jobs (median 1 h), log-normal sigma 1, ``background_load`` of the
    non-gang GPU-hours (assumption)."""

    gangs: int = 1
    gang_share: float = 15 / 16
    checkpoint_s: float = 900.0
    ckpt_write_s: float = 10.0
    background_load: float = 0.5
    finetune_median_h: float = 2.0
    batch_median_h: float = 1.0
    sigma: float = 1.0


def frontier(
    params: FrontierParams,
    horizon_s: float,
    nodes: int,
    gpus_per_node: int,
    rng: random.Random,
) -> list[Job]:
    """The gangs (submitted at 0, work beyond the horizon: they run for all of it) and Poisson background
    arrivals sized to ``background_load`` of the GPU-hours the gangs leave."""
    gang_nodes = int(nodes * params.gang_share) // max(1, params.gangs)
    if gang_nodes < 1:
        raise ValueError(f"frontier: {nodes} nodes x gang_share {params.gang_share} leave no gang")
    jobs = [
        Job(
            0,
            0.0,
            10 * horizon_s,
            gang_nodes,
            gpus_per_node,
            "pretrain",
            params.checkpoint_s,
            True,
            params.ckpt_write_s,
        )
        for _ in range(params.gangs)
    ]
    rest_gpus = (nodes - gang_nodes * params.gangs) * gpus_per_node
    spec = (
        ("finetune", 0.5, gpus_per_node, params.finetune_median_h, TRAIN_CKPT_S),
        ("batch", 0.5, 1, params.batch_median_h, BATCH_CKPT_S),
    )
    for cls, share, gpus, median_h, ckpt in spec:
        mean_h = median_h * math.exp(params.sigma**2 / 2)
        gpu_h = params.background_load * rest_gpus * horizon_s / 3600.0 * share
        if gpu_h <= 0:
            continue
        rate = gpu_h / (mean_h * gpus) / horizon_s
        t = rng.expovariate(rate)
        while t < horizon_s:
            d = median_h * 3600.0 * math.exp(rng.gauss(0.0, params.sigma))
            jobs.append(Job(0, t, max(60.0, d), 1, gpus, cls, ckpt))
            t += rng.expovariate(rate)
    jobs.sort(key=lambda j: (j.submit, j.workload))
    return [replace(j, job_id=i + 1) for i, j in enumerate(jobs)]


# ---- generic format ----------------------------------------------------------------------------------------


def save(jobs: Iterable[Job], path: str | Path) -> None:
    """Write jobs in the generic format (CSV or JSON by extension)."""
    p = Path(path)
    rows = [
        {
            "job_id": j.job_id,
            "submit_s": j.submit,
            "duration_s": j.duration,
            "nodes": j.nodes,
            "gpus_per_node": j.gpus_per_node,
            "workload": j.workload,
            "checkpoint_s": j.checkpoint_s,
        }
        for j in jobs
    ]
    if p.suffix == ".json":
        p.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
        return
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(GENERIC_COLUMNS), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(
                {
                    **r,
                    "checkpoint_s": "" if r["checkpoint_s"] is None else repr(r["checkpoint_s"]),
                    "submit_s": repr(r["submit_s"]),
                    "duration_s": repr(r["duration_s"]),
                }
            )


def load(path: str | Path) -> list[Job]:
    """Read a generic CSV/JSON trace or ``sacct --parsable2`` output (detected by its header)."""
    p = Path(path)
    src = str(p)
    if not p.exists():
        raise TraceError(src, None, "no such file")
    if p.suffix == ".json":
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise TraceError(src, exc.lineno, f"invalid JSON: {exc.msg}") from None
        if not isinstance(data, list):
            raise TraceError(src, None, "expected a JSON list of job objects")
        rows = [(i + 1, r) for i, r in enumerate(data)]
        for line, r in rows:
            if not isinstance(r, dict):
                raise TraceError(src, line, f"job {line} is not an object: {r!r}")
        return _nonempty(src, _generic(src, rows, csv_rows=False))
    text = p.read_text()
    if not text.strip():
        raise TraceError(src, None, "empty file: no header, no jobs")
    head = text.split("\n", 1)[0]
    if "|" in head and "JobID" in head:
        return _nonempty(src, _sacct(src, p))
    return _nonempty(src, _generic(src, _read_csv(src, GENERIC_COLUMNS), csv_rows=True))


def _nonempty(src: str, jobs: list[Job]) -> list[Job]:
    if not jobs:
        raise TraceError(src, None, "no jobs in the trace (a header and nothing else?)")
    return jobs


def _read_csv(src: str, required: Sequence[str], delimiter: str = ",") -> list[tuple[int, dict[str, str]]]:
    try:
        with open(src, newline="") as fh:
            reader = csv.DictReader(fh, delimiter=delimiter)
            cols = reader.fieldnames or []
            missing = [c for c in required if c not in cols]
            if missing:
                raise TraceError(src, 1, f"missing column(s) {', '.join(missing)}; header is {cols!r}")
            return [(i + 2, r) for i, r in enumerate(reader)]
    except OSError as exc:
        raise TraceError(src, None, str(exc)) from None


def _generic(src: str, rows: Sequence[tuple[int, dict]], csv_rows: bool) -> list[Job]:
    """``csv_rows``: the rows come from ``csv.DictReader``, which fills the columns of a short row with None
    and keeps the fields past the header's under the key None."""
    jobs = []
    first_line: dict[int, int] = {}  # job id -> the line that defined it
    for line, r in rows:
        missing = [c for c in GENERIC_COLUMNS if c not in r]
        if missing:
            raise TraceError(src, line, f"missing field(s) {', '.join(missing)}")
        if csv_rows:
            if None in r:
                n = len(r) - 1 + len(r[None])
                raise TraceError(src, line, f"{n} fields, the header has {len(r) - 1}")
            short = [c for c in GENERIC_COLUMNS if r[c] is None]
            if short:
                raise TraceError(
                    src,
                    line,
                    f"{len(GENERIC_COLUMNS) - len(short)} fields, the header has {len(GENERIC_COLUMNS)} "
                    f"(no {', '.join(short)}; a job that cannot checkpoint has an empty checkpoint_s, "
                    "written with its trailing comma)",
                )
        else:
            null = [c for c in GENERIC_COLUMNS if r[c] is None and c != "checkpoint_s"]
            if null:
                raise TraceError(src, line, f"{', '.join(null)} is null (only checkpoint_s may be)")
        try:
            ck = r["checkpoint_s"]
            job = Job(
                int(r["job_id"]),
                float(r["submit_s"]),
                float(r["duration_s"]),
                int(r["nodes"]),
                int(r["gpus_per_node"]),
                str(r["workload"]),
                None if ck in ("", None) else float(ck),
            )
        except (TypeError, ValueError) as exc:
            raise TraceError(src, line, f"bad value: {exc}") from None
        _check(src, line, job)
        if job.job_id in first_line:
            first = first_line[job.job_id]
            raise TraceError(src, line, f"duplicate job_id {job.job_id} (first on line {first})")
        first_line[job.job_id] = line
        jobs.append(job)
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    return jobs


def _check(src: str, line: int, j: Job) -> None:
    if j.workload not in CLASSES:
        raise TraceError(src, line, f"workload {j.workload!r} is not one of {', '.join(CLASSES)}")
    if not (math.isfinite(j.submit) and j.submit >= 0):
        raise TraceError(src, line, f"submit_s={j.submit!r} must be a finite number >= 0")
    if not (math.isfinite(j.duration) and j.duration > 0):
        raise TraceError(src, line, f"duration_s={j.duration!r} must be > 0")
    if j.nodes < 1 or j.gpus_per_node < 1:
        raise TraceError(src, line, f"nodes={j.nodes} and gpus_per_node={j.gpus_per_node} must be >= 1")
    if j.checkpoint_s is not None and not j.checkpoint_s > 0:
        raise TraceError(src, line, f"checkpoint_s={j.checkpoint_s!r} must be > 0 or empty")


def _sacct(src: str, p: Path) -> list[Job]:
    rows = _read_csv(src, ("JobID", "Submit", "Start", "End", "NNodes", "AllocTRES"), delimiter="|")
    jobs: list[Job] = []
    t0: float | None = None
    for line, r in rows:
        if "." in r["JobID"]:
            continue  # job steps (123.batch, 123.0)
        try:
            submit = datetime.fromisoformat(r["Submit"]).timestamp()
            start = datetime.fromisoformat(r["Start"]).timestamp()
            end = datetime.fromisoformat(r["End"]).timestamp()
            nodes = int(r["NNodes"])
        except ValueError as exc:
            raise TraceError(src, line, f"bad sacct value: {exc}") from None
        gpus = 0
        for part in r["AllocTRES"].split(","):
            if part.startswith("gres/gpu="):
                gpus = int(part.split("=", 1)[1])
        if gpus == 0:
            continue
        cls = "pretrain"
        for tok in r.get("Comment", "").replace(";", " ").replace(",", " ").split():
            if tok.startswith("fy:") and tok[3:] in CLASSES:
                cls = tok[3:]
        t0 = submit if t0 is None else min(t0, submit)
        ckpt = None if cls == "decode" else (BATCH_CKPT_S if cls == "batch" else TRAIN_CKPT_S)
        per_node = max(1, gpus // max(1, nodes))
        job = Job(len(jobs) + 1, submit, max(1.0, end - start), nodes, per_node, cls, ckpt)
        _check(src, line, job)
        jobs.append(job)
    base = t0 or 0.0
    jobs = [replace(j, submit=j.submit - base) for j in jobs]
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    return jobs
