"""Timeline: what a chaos run will do, drawn from a seed (same seed, same timeline, byte for byte).

Input: ``TimelineParams`` (duration, nodes, job mix, fault and implant counts) and a seed. Output: a
``Timeline``: events sorted by offset (seconds after the run starts). Kinds:
- ``submit``: a job of a class (``--comment=fy:<class>``) running ``contrib/chaos/fy-train-job.sh`` for
  ``work_s`` seconds of "training", checkpointing every ``ckpt_s`` (0: never), requeueable or not;
- ``fault``: ``fleetyield-agent fault inject --gpu G --xid X`` on a node (a SIMULATED GPU fault: the agent's
  fake backend raises it; real placements and job outcomes follow from it);
- ``precursor``: ``fleetyield-agent fault degrade --gpu G --mode ecc --rate R`` on the GPU a later ``fault``
  kills (SIMULATED: correctable ECC errors that remap HBM rows, the visible signal some fatal faults give
  first). A ``precursor_share`` of the faults get one, ``precursor_lead_s`` before the fault (the simulator's
  precursor observability, live); drawn from their own random stream, so the jobs, faults and implants of a
  seed are the same whatever the share;
- ``implant``: ``fleetyield-agent attest implant`` on a node (skipped when the agent lacks the command).
Nothing here does I/O: the runner turns events into commands.

Time scale: the defaults describe a ``REFERENCE_S`` (1,800 s) run with jobs of 120-600 s of work.
``TimelineParams.for_duration(D)`` keeps that shape and shrinks (or stretches) it by ``D / REFERENCE_S``:
job work and checkpoint intervals are scaled by the same factor (checkpoint intervals rounded to whole
seconds, at least 1 s, because the job script counts whole seconds), arrivals stay in the first 60% of the run
and faults in ``fault_window`` (both shares of ``duration_s``); precursor leads scale like the work and
their error rate inversely, so the job mix, the load on the cluster and
where faults land relative to the work are the same at any scale. What does not scale: Slurm's own
latencies, the controller's 2 s loop and its rehabilitation ladder (~40 s in the docker cluster), so a short
run gives those fixed costs a larger share. ``make ab`` uses ``D = 240`` (work 16-80 s).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

CLASSES = ("decode", "pretrain", "finetune", "batch")
FAULT_XIDS = (79, 48, 95, 119)  # Llama 3 GPU-attributable mix: faulty GPU, HBM3, SRAM, GSP (by weight)
FAULT_WEIGHTS = (148, 72, 19, 17)
REFERENCE_S = 1800.0  # the run length the default work and checkpoint figures are written for


@dataclass(frozen=True, slots=True)
class TimelineParams:
    duration_s: float = 1800.0
    nodes: tuple[str, ...] = ("gpu-h100-1", "gpu-h100-2", "gpu-l40s-1", "gpu-l40s-2")
    gpus_per_node: int = 8
    jobs: int = 24
    class_weights: tuple[float, ...] = (0.4, 0.15, 0.15, 0.3)  # decode, pretrain, finetune, batch
    work_s: tuple[float, float] = (120.0, 600.0)  # uniform range of a job's work
    ckpt_s: dict[str, float] = field(
        default_factory=lambda: {"decode": 0.0, "pretrain": 60.0, "finetune": 60.0, "batch": 30.0}
    )
    gpus: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"decode": (1, 2), "pretrain": (8,), "finetune": (4, 8), "batch": (1, 2, 4)}
    )
    faults: int = 3
    implants: int = 0
    fault_window: tuple[float, float] = (0.2, 0.8)  # faults land in this share of the run (jobs are running)
    precursor_share: float = 0.0  # share of faults preceded by a visible ECC precursor (0: all sudden)
    precursor_lead_s: tuple[float, float] = (180.0, 450.0)  # uniform range of the precursor's lead time
    precursor_rate: float = 0.15  # correctable ECC errors per second of the precursor (10 remap one row)

    def __post_init__(self) -> None:
        if not 0.0 <= self.precursor_share <= 1.0:
            raise ValueError(f"precursor_share must be within [0, 1], got {self.precursor_share!r}")
        lo, hi = self.precursor_lead_s
        if not 0.0 < lo <= hi or not self.precursor_rate > 0:
            raise ValueError(
                f"precursor_lead_s must be 0 < lo <= hi and precursor_rate > 0, got "
                f"{self.precursor_lead_s!r}, {self.precursor_rate!r}"
            )

    @staticmethod
    def for_duration(duration_s: float, **kw: Any) -> TimelineParams:
        """The default profile scaled to a ``duration_s`` run (module docstring); ``kw`` override fields."""
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
        base = TimelineParams()
        f = duration_s / REFERENCE_S
        scaled = {
            "duration_s": float(duration_s),
            "work_s": (round(base.work_s[0] * f, 1), round(base.work_s[1] * f, 1)),
            "ckpt_s": {k: float(max(1, round(v * f))) if v > 0 else 0.0 for k, v in base.ckpt_s.items()},
            "precursor_lead_s": (
                round(base.precursor_lead_s[0] * f, 1),
                round(base.precursor_lead_s[1] * f, 1),
            ),
            "precursor_rate": round(base.precursor_rate / f, 4),
        }
        return TimelineParams(**(scaled | kw))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> TimelineParams:
        d = dict(d)
        d["nodes"] = tuple(d["nodes"])
        for k in ("class_weights", "work_s", "fault_window", "precursor_lead_s"):
            if k in d:  # logs written before precursors existed lack the precursor fields
                d[k] = tuple(d[k])
        d["gpus"] = {k: tuple(v) for k, v in d["gpus"].items()}
        return TimelineParams(**d)


@dataclass(frozen=True, slots=True)
class Event:
    at_s: float
    kind: str  # submit | fault | precursor | implant
    ref: str  # stable id within the timeline (j03, f01, i00)
    node: str = ""
    workload: str = ""
    gpus: int = 0
    work_s: float = 0.0
    ckpt_s: float = 0.0
    requeue: bool = True
    gpu: int | None = None
    xid: int | None = None
    rate: float = 0.0  # precursor: correctable ECC errors per second

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Event:
        return Event(**d)


@dataclass(frozen=True, slots=True)
class Timeline:
    seed: int
    params: TimelineParams
    events: tuple[Event, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "params": self.params.to_dict(),
            "events": [e.to_dict() for e in self.events],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Timeline:
        return Timeline(
            int(d["seed"]),
            TimelineParams.from_dict(d["params"]),
            tuple(Event.from_dict(e) for e in d["events"]),
        )


def generate(seed: int, tp: TimelineParams | None = None) -> Timeline:
    """Jobs arrive uniformly over the first 60% of the run; faults and implants in ``fault_window``; a
    precursor, when a fault draws one, ``precursor_lead_s`` before it (not before the run starts)."""
    tp = tp or TimelineParams()
    rng = random.Random(f"chaos-{seed}")
    early = random.Random(f"chaos-{seed}-precursor")  # its own stream: the other events do not move
    events: list[Event] = []
    for i in range(tp.jobs):
        cls = rng.choices(CLASSES, tp.class_weights)[0]
        at = round(rng.uniform(0.0, 0.6 * tp.duration_s), 1)
        work = round(rng.uniform(*tp.work_s), 1)
        gpus = min(rng.choice(tp.gpus[cls]), tp.gpus_per_node)
        events.append(
            Event(at, "submit", f"j{i:03d}", "", cls, gpus, work, tp.ckpt_s.get(cls, 0.0), cls != "decode")
        )
    lo, hi = (tp.fault_window[0] * tp.duration_s, tp.fault_window[1] * tp.duration_s)
    for i in range(tp.faults):
        at = round(rng.uniform(lo, hi), 1)
        node = rng.choice(tp.nodes)
        gpu = rng.randrange(tp.gpus_per_node)
        events.append(
            Event(at, "fault", f"f{i:02d}", node, gpu=gpu, xid=rng.choices(FAULT_XIDS, FAULT_WEIGHTS)[0])
        )
        if early.random() < tp.precursor_share:
            lead = early.uniform(*tp.precursor_lead_s)
            events.append(
                Event(round(max(0.0, at - lead), 1), "precursor", f"p{i:02d}", node, gpu=gpu,
                      rate=tp.precursor_rate)
            )  # fmt: skip
    for i in range(tp.implants):
        events.append(Event(round(rng.uniform(lo, hi), 1), "implant", f"i{i:02d}", rng.choice(tp.nodes)))
    events.sort(key=lambda e: (e.at_s, e.ref))
    return Timeline(seed, tp, tuple(events))
