"""The gang A/B's plan and ledger: one multi-node training job, one fatal GPU fault, what each arm loses.

Input (``plan``): a seed and ``GangParams``. Output: a ``GangPlan``: when after the gang starts the fault
lands (a share of its work), on which node of its allocation (an index into the sorted node list, so both
arms hit "the same" node of whatever allocation Slurm gives them), which GPU and XID, and the phase of the
NHC timer.
Same seed, same plan.

Input (``recoveries``): what the run left behind: ``sacct -X -D -P`` rows of the gang (one per attempt), the
job's own logs (``<job>.steps``: work done per completed step; ``<job>.events``: each attempt's start and the
work it resumed from, hang, timeout; written by ``contrib/chaos/fy-train-job.sh`` in gang mode), the fault
(node, unix time) and when the node was seen drained. Output: one ``Recovery`` per fault:
- ``recovery_s``: from the fault to the gang RUNNING again (sacct ``Start`` of the next attempt) on nodes
  without the faulted one; an attempt that lands on the faulted node again does not count (``relanded``);
- ``lost_s``: work done at the fault (the last step completed by then) minus the work the next attempt
  resumed from (its last checkpoint): progress lost;
- ``stalled_s``: from the fault to the end of the attempt it hit (the job's ``timeout`` event when it hung to
  its collective timeout, else sacct's ``End``: a requeued attempt's End is the requeue): the time the whole
  gang held its nodes without progress;
- ``requeued_s``: from the fault to the gang back in the queue (sacct's ``End`` of a REQUEUED attempt, whole
  seconds): the lever's part of the recovery; the rest (``recovery_s - requeued_s``) is Slurm's own: the
  requeued job's BeginTime hold (``cred_expire``), then the next scheduling pass;
- ``drained_s``: from the fault to its node seen drained (by FleetYield or by the NHC emulation).
Nothing here does I/O.

The world is the simulator's (``sim/runner.py``, "Fatal faults"), every time scaled by ``GangParams.scale``
(0.1 by default): collective timeout 600 s -> 60 s, NHC's HealthCheckInterval 300 s -> 30 s; no restart cost
(a requeued attempt starts training at once; both arms alike). Checkpoints every 30 s of work (not the
simulator's 900 s scaled, 90 s: a few minutes of work would then hold one checkpoint or none).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from slurm_fleetyield.chaos.ledger import _hosts, _time, parse_sacct
from slurm_fleetyield.chaos.timeline import FAULT_WEIGHTS, FAULT_XIDS


@dataclass(frozen=True, slots=True)
class GangParams:
    nodes: int = 3  # the gang's -N (the docker cluster has 4 nodes: one left for the requeued gang)
    gpus_per_node: int = 8  # --gres=gpu:8 --exclusive: the gang holds every GPU, so every fault hits it
    work_s: float = 120.0  # seconds of work (steps of 1 s)
    ckpt_s: float = 30.0  # checkpoint every this many seconds of work
    scale: float = 0.1  # the simulator's fault-world times are multiplied by this
    collective_timeout_s: float = 60.0  # the simulator's 600 s (PyTorch NCCL default) x scale
    health_check_interval_s: float = 30.0  # the simulator's 300 s (LBNL NHC's example) x scale
    fault_at: tuple[float, float] = (0.25, 0.75)  # the fault lands at this share of the work (uniform)
    workload: str = "pretrain"

    def __post_init__(self) -> None:
        lo, hi = self.fault_at
        if not (0.0 < lo <= hi < 1.0) or self.nodes < 2 or self.work_s <= 0 or self.ckpt_s < 0:
            raise ValueError(
                f"GangParams: need 0 < fault_at lo <= hi < 1, nodes >= 2, work_s > 0, ckpt_s >= 0; got "
                f"fault_at={self.fault_at!r}, nodes={self.nodes}, work_s={self.work_s}, ckpt_s={self.ckpt_s}"
            )

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["fault_at"] = list(self.fault_at)
        return d

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> GangParams:
        d = dict(d)
        if "fault_at" in d:
            d["fault_at"] = tuple(d["fault_at"])  # type: ignore[arg-type]
        return GangParams(**d)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class GangPlan:
    seed: int
    fault_after_s: float  # seconds of the gang's training (wall time after its start) before the fault
    node_index: int  # into the gang's sorted allocation
    gpu: int
    xid: int
    nhc_phase_s: float  # the NHC timer's first check, this long after the arm starts it


def plan(seed: int, gp: GangParams | None = None) -> GangPlan:
    gp = gp or GangParams()
    rng = random.Random(f"chaos-gang-{seed}")
    at = round(rng.uniform(*gp.fault_at) * gp.work_s, 1)
    return GangPlan(
        seed,
        at,
        rng.randrange(gp.nodes),
        rng.randrange(gp.gpus_per_node),
        rng.choices(FAULT_XIDS, FAULT_WEIGHTS)[0],
        round(rng.uniform(0.0, gp.health_check_interval_s), 1),
    )


@dataclass(frozen=True, slots=True)
class Attempt:
    start: float
    end: float | None
    state: str
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Recovery:
    node: str
    fault_t: float
    hit: bool  # the fault landed on a node of a running attempt
    attempt_state: str  # sacct's state of the attempt it hit (REQUEUED after a requeue, FAILED, ...)
    hung: bool  # the job hung on it (a hang event): it was not requeued before its next collective
    timed_out: bool  # ... and ran to its collective timeout
    work_at_fault_s: float | None
    resumed_from_s: float | None
    lost_s: float | None
    stalled_s: float | None
    recovery_s: float | None  # None: never running again on healthy nodes in the run
    relanded: int  # attempts that started on the faulted node again before the recovery
    requeued_s: float | None  # None: the attempt it hit was not requeued (it completed, or failed for good)
    drained_s: float | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def attempts(sacct_text: str, job: str) -> list[Attempt]:
    """The job's attempts in start order (rows without a start, i.e. still pending, are left out)."""
    out = []
    for r in parse_sacct(sacct_text):
        if r.get("JobID", "").split("_")[0] != job:
            continue
        start = _time(r.get("Start", ""))
        if start is None:
            continue
        state = r.get("State", "").split()[0] if r.get("State") else ""
        out.append(Attempt(start, _time(r.get("End", "")), state, _hosts(r.get("NodeList", ""))))
    return sorted(out, key=lambda a: a.start)


def parse_steps(text: str) -> list[tuple[float, float]]:
    """``<unix time> <work done>`` lines (malformed ones skipped), in file order."""
    out = []
    for line in text.splitlines():
        f = line.split()
        try:
            out.append((float(f[0]), float(f[1])))
        except (IndexError, ValueError):
            continue
    return out


def parse_events(text: str) -> list[tuple[float, str, float, tuple[str, ...]]]:
    """``<unix time> <kind> <work done> [args]`` lines: (time, kind, work, args)."""
    out = []
    for line in text.splitlines():
        f = line.split()
        try:
            out.append((float(f[0]), f[1], float(f[2]), tuple(f[3:])))
        except (IndexError, ValueError):
            continue
    return out


def recoveries(
    sacct_text: str,
    job: str,
    steps_text: str,
    events_text: str,
    faults: Sequence[tuple[str, float]],
    drained: Mapping[str, float] | None = None,
) -> list[Recovery]:
    """One ``Recovery`` per fault (module docstring); ``drained``: node -> first time seen drained."""
    atts = attempts(sacct_text, job)
    steps = parse_steps(steps_text)
    events = parse_events(events_text)
    starts = [(t, w) for t, k, w, _ in events if k == "start"]
    out = []
    for node, ft in faults:
        hit = next(
            (a for a in atts if a.start <= ft and (a.end is None or ft < a.end + 1.0) and node in a.nodes),
            None,
        )
        drain_t = (drained or {}).get(node)
        drained_s = round(drain_t - ft, 1) if drain_t is not None and drain_t >= ft else None
        if hit is None:
            out.append(
                Recovery(node, ft, False, "", False, False, None, None, None, None, None, 0, None, drained_s)
            )
            continue
        # sacct's times are whole seconds (truncated): an attempt requeued in the fault's second was hit, and
        # the job's own clock (sub-second) stamps its logs: allow that second
        done = [w for t, w in steps if hit.start - 1.0 <= t <= ft]
        first = next((w for t, w in starts if t >= hit.start - 1.0), 0.0)
        work = max(done) if done else first
        later = [a for a in atts if a.start > hit.start]
        until = later[0].start - 1.0 if later else float("inf")  # this attempt's events only
        hang = next((t for t, k, _, _ in events if k == "hang" and ft <= t < until), None)
        timeout = next((t for t, k, _, _ in events if k == "timeout" and ft <= t < until), None)
        ended = timeout if timeout is not None else hit.end
        healthy = next((a for a in later if node not in a.nodes), None)
        relanded = sum(1 for a in later if node in a.nodes and (healthy is None or a.start < healthy.start))
        requeued = None
        if hit.state == "REQUEUED" and hit.end is not None:
            requeued = round(max(0.0, hit.end - ft), 1)
        resumed = None
        if healthy is not None:
            resumed = next((w for t, w in starts if t >= healthy.start - 1.0), None)
        out.append(
            Recovery(
                node, ft, True, hit.state, hang is not None, timeout is not None, work, resumed,
                None if resumed is None else max(0.0, work - resumed),
                None if ended is None else round(max(0.0, ended - ft), 1),
                None if healthy is None else round(healthy.start - ft, 1),
                relanded, requeued, drained_s,
            )
        )  # fmt: skip
    return out


def wall_s(sacct_text: str, job: str) -> float | None:
    """First start to the end of the attempt that COMPLETED: the gang's wall time; None if it never did."""
    atts = attempts(sacct_text, job)
    done = [a for a in atts if a.state == "COMPLETED" and a.end is not None]
    if not atts or not done:
        return None
    return round(done[-1].end - atts[0].start, 1)  # type: ignore[operator]
