"""Fault model: when each GPU fails, how, and what its telemetry shows before it does.

Input: a fleet layout (node names, GPUs per node, which nodes have NVLink), ``FaultParams``, the horizon and a
seeded ``random.Random``. Output: a ``FaultPlan``: every fatal GPU fault (time, node, GPU, class, XID,
optional precursor episode), every quiet corruption, every benign precursor-like episode, and the lemon set.
The plan is drawn once per seed and shared by every policy (common random numbers): policies differ only in
what they do about it. ``telemetry(gpu_state, t)`` turns the latent state into the DCGM fields that the
core's risk signals read (``core/signals.py``).

Calibration (every number's source; see ``shared/data/README.md``):
- Rate: Llama 3 (arXiv 2407.21783, Table 5) had 419 unexpected interruptions in 54 days on 16,384 H100, i.e.
  3.79 per 1,000 node-days; Meta RSC (arXiv 2410.21680) reports 2.34 and 6.50 per 1,000 node-days on two A100
  clusters (use ``--node-rate`` to sweep that range). Only the GPU-attributable share is simulated: faulty GPU
  148 + HBM3 72 + GPU SRAM 19 + GPU system processor 17 = 256 of 419 (61%), plus silent data corruption 6
  (quiet, no XID). Software, network, host maintenance, NIC and NCCL interruptions (the other 39%) hit every
  policy alike and are outside FleetYield's reach: they are not simulated.
- Class mix: the Llama 3 counts above, mapped to the XID the NVIDIA Xid catalog gives for each class:
  faulty GPU -> XID 79 (fell off the bus), HBM3 -> XID 48 (double-bit ECC), SRAM -> XID 95 (uncontained
  ECC), GPU system processor -> XID 119 (GSP RPC timeout).
- Lemons: ~1.2% of nodes are lemons (Meta RSC); each carries one lemon GPU whose hazard multiplier is solved
  so that the repeat share of the run equals ``TITAN_REPEAT_SHARE`` = 7.15% (Titan, Ostrouchov et al. SC '20,
  ``titan-gpu-lifetimes/gc_full.csv``, measured by ``sim/calibrate.py``: 400 of 5,597 distinct fatal failures
  hit a GPU that had failed before and returned to service since). One definition on both sides, per physical
  GPU: reports within one repair window (Titan: one day; here: ``repair_s``, default 24 h = ``repair_h``) are
  one failure (the runner drops a fault on a node that is DOWN for repair), and a repeat is a failure of a GPU
  that came back to service after an earlier one (here every repaired GPU does, in place; a swapped GPU is a
  new GPU with the base hazard). The raw 18.5% used before counted Titan's re-reports (770 of its 1,177
  "repeats") and is not this quantity. Caveat: Titan replaced 90.5% of its failed GPUs and returned only 9.5%
  to service; this simulator returns every repaired GPU, so per returned GPU its lemons are milder than
  Titan's (docs/simulator.md, Calibration). Titan gives the shape only, never the rate.
- Post-return hazard (``post_return``, default "none": a repaired GPU is as good as new). "titan": after each
  counted fatal fault (the repeat rule above) the GPU returns at fault + ``repair_s`` with an excess hazard
  base x (RR(t) - 1), RR(t) = exp(c0 x 2^(-t/H)), t = days since its latest return, Titan's fit on all 495
  returns (``calibrate.post_failure_hazard``: c0 5.78, H 80.0 d; x323 at the return, x18 at 80 d);
  "titan-floor" the better fit exp(1.33 + 4.57 x 2^(-t/48.9 d)) (x3.8 forever). Follow-ups can have
  follow-ups (the clock restarts at each counted fault), drawn from a stream of their own so the planned
  faults stay the "none" plan's; the RR is relative, applied to this model's base rate (2.9e-4 per GPU-day,
  Titan's was 1.4e-4). Lemons are unchanged and get follow-ups at the base rate like every GPU. A swapped
  GPU is new: the runner cancels the follow-ups of faults before the swap.
- Precursors: no public study gives the share of fatal faults preceded by an observable signal
  (shared/data/README.md), so ``precursor_share`` is swept (0-50%). A precursor episode starts ``lead`` before
  the fault and escalates in three stages (early / mid / late = last quarter): HBM classes show correctable
  ECC growth and correctable row remaps climbing past 10 (the SuperBench boundary), then a pending remap;
  link classes on NVLink boards show NVLink CRC, then replay and PCIe replay rates. What tier that telemetry
  earns is the core's decision, not this module's.
- Benign episodes: the same signatures on GPUs that never fail (``false_alarm_ratio`` of them per true
  precursor, stopping at a random stage). No public number exists: it is an explicit assumption, default 1.0,
  so pre-emptive drains pay for false alarms.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from slurm_fleetyield.core.signals import (
    NVLINK_CRC_DATA,
    NVLINK_CRC_FLIT,
    NVLINK_RECOVERY,
    NVLINK_REPLAY,
    PCIE_REPLAY,
    REMAP_PENDING,
    ROWS_CORR,
    SBE_VOL,
)

DAY = 86_400.0
HOUR = 3_600.0

LLAMA3_RATE_PER_1000_NODE_DAYS = 419 / (54 * 16_384 / 8) * 1000  # 3.79, Llama 3 Table 5
LLAMA3_GPU_SHARE = 256 / 419  # faulty GPU + HBM3 + SRAM + GSP (Llama 3 Table 5)
LLAMA3_SDC_SHARE = 6 / 419  # silent data corruption (Llama 3 Table 5)
META_RSC_LEMON_NODE_SHARE = 0.012  # Meta RSC (arXiv 2410.21680)
TITAN_REPEAT_SHARE = 0.0715  # Titan (SC '20) deduplicated: 400 / 5,597 failures after a return

PostReturn = Literal["none", "titan", "titan-floor"]
# Hazard of a GPU after its return to service relative to never-failed GPUs, RR(t) = exp(floor + c0 x
# 2^(-t/H)), t = days since the return: Titan (Ostrouchov et al. SC '20, shared/data/README.md), all 495
# returns (342 second failures), ``calibrate.post_failure_hazard``'s Poisson fits, pinned against its output
# by tests/sim/test_calibrate.py. (floor, c0, half-life days); "titan" is the no-floor fit (RR -> 1: the shape
# core/risk.py's history_decay assumes), "titan-floor" the better fit (+15.0 log-lik): RR -> 3.79 forever.
POST_RETURN_RR: Mapping[str, tuple[float, float, float]] = {
    "titan": (0.0, 5.780, 79.95),
    "titan-floor": (1.332, 4.571, 48.90),
}

# (class, Llama 3 Table 5 count, XID, precursor signature)
FAULT_CLASSES: tuple[tuple[str, int, int, str], ...] = (
    ("faulty_gpu", 148, 79, "link"),
    ("hbm3", 72, 48, "hbm"),
    ("gpu_sram", 19, 95, "hbm"),
    ("gsp", 17, 119, "link"),
)


@dataclass(frozen=True, slots=True)
class FaultParams:
    """Fault-model knobs (CLI flags of ``fleetyield simulate``)."""

    node_rate_per_1000_node_days: float = LLAMA3_RATE_PER_1000_NODE_DAYS
    gpu_share: float = LLAMA3_GPU_SHARE
    sdc_share: float = LLAMA3_SDC_SHARE
    lemon_node_share: float = META_RSC_LEMON_NODE_SHARE
    repeat_share: float = TITAN_REPEAT_SHARE
    precursor_share: float = 0.25
    lead_h: float = 24.0  # mean precursor lead time; each episode draws uniformly in [0.5, 1.5] x lead_h
    false_alarm_ratio: float = 1.0
    # "none": a repaired GPU has the base hazard again (only lemons fail more); "titan" / "titan-floor": every
    # counted fatal fault adds follow-up faults on the same GPU at base x (RR(t) - 1) after its return
    post_return: PostReturn = "none"

    def validate(self) -> FaultParams:
        checks = {
            "node_rate_per_1000_node_days": self.node_rate_per_1000_node_days > 0,
            "gpu_share": 0 < self.gpu_share <= 1,
            "sdc_share": 0 <= self.sdc_share < 1,
            "lemon_node_share": 0 <= self.lemon_node_share < 1,
            "repeat_share": 0 <= self.repeat_share < 0.9,
            "precursor_share": 0 <= self.precursor_share <= 1,
            "lead_h": self.lead_h > 0,
            "false_alarm_ratio": self.false_alarm_ratio >= 0,
            "post_return": self.post_return == "none" or self.post_return in POST_RETURN_RR,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"fault parameter {name}={getattr(self, name)!r} is out of range")
        return self

    @property
    def gpu_fatal_per_gpu_day(self) -> float:
        """Mean fatal GPU hazard per GPU-day (8-GPU nodes): 3.79e-3 x 0.61 / 8 = 2.89e-4 by default."""
        return self.node_rate_per_1000_node_days / 1000.0 * self.gpu_share / 8.0

    @property
    def sdc_per_gpu_day(self) -> float:
        return self.node_rate_per_1000_node_days / 1000.0 * self.sdc_share / 8.0


@dataclass(frozen=True, slots=True)
class Episode:
    """Precursor telemetry on one GPU over [start, end): three stages, the last quarter being the worst."""

    node: str
    gpu: int
    start: float
    end: float
    signature: str  # hbm | link
    max_stage: int = 3  # benign episodes may stop earlier
    fault_id: int | None = None  # the fatal fault it precedes (None: benign)

    def stage(self, t: float) -> int:
        if t < self.start:
            return 0
        span = self.end - self.start
        x = (t - self.start) / span if span > 0 else 1.0
        s = 1 if x < 0.5 else 2 if x < 0.75 else 3
        return min(s, self.max_stage)

    def change_times(self) -> tuple[float, ...]:
        """Times at which the stage steps (telemetry levels change); counters also grow between them."""
        span = self.end - self.start
        out = [self.start, self.start + 0.5 * span, self.start + 0.75 * span]
        return tuple(out[: self.max_stage])


@dataclass(frozen=True, slots=True)
class Fault:
    fault_id: int
    time: float
    node: str
    gpu: int
    cls: str
    xid: int | None  # None: quiet (silent data corruption)
    lemon: bool
    episode: Episode | None = None
    parent: int | None = None  # a post-return follow-up: the fault whose return started its excess hazard

    @property
    def follow_up(self) -> bool:
        return self.parent is not None

    @property
    def quiet(self) -> bool:
        return self.xid is None


@dataclass(frozen=True, slots=True)
class FaultPlan:
    faults: tuple[Fault, ...]  # sorted by time
    episodes: tuple[Episode, ...]  # true precursors and benign episodes, sorted by start
    lemons: frozenset[tuple[str, int]]
    lemon_multiplier: float
    params: FaultParams
    horizon_s: float
    base_per_gpu_day: float = 0.0
    summary: Mapping[str, float] = field(default_factory=dict)


def solve_lemon_multiplier(
    hazard: float, lemon_gpu_share: float, repeat_share: float, horizon_days: float, repair_days: float = 0.0
) -> float:
    """Multiplier M of the lemon GPUs' hazard such that, over the horizon, ``repeat_share`` of all fatal
    events (``repeat_share(faults, repair_s)``'s definition) hit a GPU that already failed in the run and came
    back from repair. Poisson per GPU with a dead time of ``repair_days`` after each counted event (faults
    while the node is DOWN are not events): first events 1 - exp(-lambda), repeats (lambda - 1 + exp(-lambda))
    / (1 + rate x repair_days); the mean hazard stays ``hazard``. Returns 1 when there are no lemons or no
    repeats are asked for."""
    s = lemon_gpu_share
    if s <= 0 or repeat_share <= 0:
        return 1.0

    def share(m: float) -> float:
        h0 = hazard / (1 - s + s * m)  # keep the fleet mean at ``hazard``
        rep = total = 0.0
        for frac, rate in ((1 - s, h0), (s, h0 * m)):
            lam = rate * horizon_days
            first = 1 - math.exp(-lam)
            again = (lam - first) / (1 + rate * repair_days)
            rep += frac * again
            total += frac * (first + again)
        return rep / total if total > 0 else 0.0

    lo, hi = 1.0, 1e6
    if share(hi) < repeat_share:
        return hi
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if share(mid) < repeat_share:
            lo = mid
        else:
            hi = mid
    return hi


def _poisson_times(rate_per_s: float, horizon_s: float, rng: random.Random) -> list[float]:
    out: list[float] = []
    if rate_per_s <= 0:
        return out
    t = rng.expovariate(rate_per_s)
    while t < horizon_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def generate(
    nodes: Sequence[str],
    gpus_per_node: int,
    params: FaultParams,
    horizon_s: float,
    rng: random.Random,
    repair_s: float = DAY,
) -> FaultPlan:
    """Draw one fault plan. Deterministic for a given ``rng`` state. ``repair_s``: how long a fatal fault
    keeps its node DOWN (the runner's ``repair_h``), the dead time the lemon solve accounts for."""
    params.validate()
    horizon_days = horizon_s / DAY
    hazard = params.gpu_fatal_per_gpu_day
    n_lemon = round(params.lemon_node_share * len(nodes))
    lemon_nodes = sorted(rng.sample(list(nodes), n_lemon)) if n_lemon else []
    lemons = frozenset((n, rng.randrange(gpus_per_node)) for n in lemon_nodes)
    s = len(lemons) / max(1, len(nodes) * gpus_per_node)
    m = solve_lemon_multiplier(hazard, s, params.repeat_share, horizon_days, repair_s / DAY)
    h0 = hazard / (1 - s + s * m)
    weights = [c[1] for c in FAULT_CLASSES]
    faults: list[Fault] = []
    sdc_rate = params.sdc_per_gpu_day / DAY
    for node in nodes:
        for g in range(gpus_per_node):
            lemon = (node, g) in lemons
            rate = h0 * (m if lemon else 1.0) / DAY
            for t in _poisson_times(rate, horizon_s, rng):
                cls, _, xid, _sig = rng.choices(FAULT_CLASSES, weights)[0]
                faults.append(Fault(0, t, node, g, cls, xid, lemon))
            for t in _poisson_times(sdc_rate * (m if lemon else 1.0) * h0 / hazard, horizon_s, rng):
                faults.append(Fault(0, t, node, g, "sdc", None, lemon))
    faults.sort(key=lambda f: (f.time, f.node, f.gpu))
    leads: list[float | None] = []  # precursor lead per fault (None: no precursor), drawn in time order
    for f in faults:
        leads.append(None if f.quiet else _precursor_lead(params, rng))
    n_true = sum(lead is not None for lead in leads)
    benign = _benign(nodes, gpus_per_node, params, horizon_s, n_true, rng)
    drafts = [_Draft(f, lead, None) for f, lead in zip(faults, leads, strict=True)]
    n_follow = 0
    if params.post_return != "none":
        # A stream of its own, seeded from the plan's: the faults and episodes above are the "none" plan's.
        post = random.Random(f"post-return-{rng.getrandbits(64)}")
        follow = _follow_ups(drafts, lemons, params, h0 / DAY, horizon_s, repair_s, post)
        n_follow = len(follow)
        n_true_follow = sum(d.lead is not None for d in follow)
        benign += _benign(nodes, gpus_per_node, params, horizon_s, n_true_follow, post)
        n_true += n_true_follow
        drafts = sorted(drafts + follow, key=lambda d: (d.fault.time, d.fault.node, d.fault.gpu))
    sig_of = {c[0]: c[3] for c in FAULT_CLASSES}
    ids = {id(d): i for i, d in enumerate(drafts)}
    out: list[Fault] = []
    episodes: list[Episode] = []
    for i, d in enumerate(drafts):
        f, ep = d.fault, None
        if d.lead is not None:
            ep = Episode(f.node, f.gpu, max(0.0, f.time - d.lead), f.time, sig_of[f.cls], 3, i)
            episodes.append(ep)
        parent = ids[id(d.parent)] if d.parent is not None else None
        out.append(Fault(i, f.time, f.node, f.gpu, f.cls, f.xid, f.lemon, ep, parent))
    n_benign = len(benign)
    episodes += benign
    episodes.sort(key=lambda e: (e.start, e.node, e.gpu))
    fatal = [f for f in out if not f.quiet]
    summary = {
        "fatal_faults": float(len(fatal)),
        "quiet_faults": float(len(out) - len(fatal)),
        "precursor_episodes": float(n_true),
        "benign_episodes": float(n_benign),
        "lemon_gpus": float(len(lemons)),
        "lemon_multiplier": m,
        "fatal_per_1000_node_days": 1000.0 * len(fatal) / max(1e-9, len(nodes) * horizon_days),
    }
    if params.post_return != "none":
        summary["follow_up_faults"] = float(n_follow)
    return FaultPlan(tuple(out), tuple(episodes), lemons, m, params, horizon_s, h0, summary)


def post_return_rr(kind: str, t_days: float) -> float:
    """Titan's hazard ratio ``t_days`` after a return to service (``POST_RETURN_RR``); 1 for "none"."""
    if kind == "none":
        return 1.0
    floor, c0, half_life = POST_RETURN_RR[kind]
    return math.exp(floor + c0 * 2.0 ** (-max(0.0, t_days) / half_life))


def _lead(params: FaultParams, rng: random.Random) -> float:
    """An episode's lead time (s): uniform in [0.5, 1.5] x ``lead_h``."""
    return params.lead_h * HOUR * rng.uniform(0.5, 1.5)


def _precursor_lead(params: FaultParams, rng: random.Random) -> float | None:
    """A fatal fault's precursor lead (s), or None for the ``1 - precursor_share`` without a precursor."""
    return _lead(params, rng) if rng.random() < params.precursor_share else None


@dataclass(slots=True)
class _Draft:
    fault: Fault  # fault_id not yet assigned
    lead: float | None  # precursor lead (s), None: no precursor
    parent: _Draft | None  # a follow-up's parent


def _benign(
    nodes: Sequence[str],
    gpus_per_node: int,
    params: FaultParams,
    horizon_s: float,
    n_true: int,
    rng: random.Random,
) -> list[Episode]:
    """Benign look-alike episodes: a Poisson number, ``false_alarm_ratio`` per true precursor."""
    n_benign = (
        _poisson_count(params.false_alarm_ratio * n_true, rng) if n_true or params.false_alarm_ratio else 0
    )
    out: list[Episode] = []
    for _ in range(n_benign):
        node = nodes[rng.randrange(len(nodes))]
        g = rng.randrange(gpus_per_node)
        lead = _lead(params, rng)
        start = rng.uniform(0.0, max(0.0, horizon_s - lead))
        sig = "hbm" if rng.random() < 0.5 else "link"
        out.append(Episode(node, g, start, start + lead, sig, rng.randint(1, 3), None))
    return out


def _follow_ups(
    drafts: Sequence[_Draft],
    lemons: frozenset[tuple[str, int]],
    params: FaultParams,
    base_per_s: float,
    horizon_s: float,
    repair_s: float,
    rng: random.Random,
) -> list[_Draft]:
    """Post-return follow-up faults (``params.post_return``): after each counted fatal fault on a GPU
    (planned or itself a follow-up: a chain, bounded by the horizon) the GPU returns at fault + ``repair_s``
    and gets an excess hazard ``base_per_s`` x (RR(t) - 1), t = time since that return, until its next counted
    fault, whose return restarts the clock (Titan measured the hazard since the latest return). Counted:
    ``repeat_share``'s definition (a fault on a node DOWN for repair is no event and restarts nothing). Drawn
    by thinning (RR decreases with t); classes, XIDs and precursors are drawn as for planned faults. Lemons
    keep their multiplier; their follow-ups come at the base rate like any GPU's. Policy-independent: a GPU
    swap cancels the follow-ups of faults before the swap (``runner``)."""
    kind = params.post_return
    weights = [c[1] for c in FAULT_CLASSES]

    def excess(t_s: float) -> float:
        return base_per_s * (post_return_rr(kind, t_s / DAY) - 1.0)

    def draw(node: str, gpu: int, ret: float, since: float, parent: _Draft) -> _Draft | None:
        t = max(ret, since)
        top = excess(t - ret)  # the excess rate only falls with age: an envelope from ``t`` on
        if top <= 0:
            return None
        while True:
            t += rng.expovariate(top)
            if t >= horizon_s:
                return None
            if rng.random() * top < excess(t - ret):
                cls, _, xid, _sig = rng.choices(FAULT_CLASSES, weights)[0]
                lead = _precursor_lead(params, rng)
                return _Draft(Fault(0, t, node, gpu, cls, xid, (node, gpu) in lemons), lead, parent)

    by_node: dict[str, list[_Draft]] = {}
    for d in drafts:
        if not d.fault.quiet:
            by_node.setdefault(d.fault.node, []).append(d)
    out: list[_Draft] = []
    for node in sorted(by_node):
        planned = by_node[node]  # in time order
        i = 0
        down_until = -math.inf
        clock: dict[int, tuple[float, _Draft]] = {}  # GPU -> (its return time, the fault it returns from)
        cand: dict[int, _Draft] = {}  # GPU -> its next follow-up
        while True:
            nxt_p = planned[i] if i < len(planned) else None
            g_c = min(cand, key=lambda g: (cand[g].fault.time, g), default=None)
            nxt_c = cand[g_c] if g_c is not None else None
            if nxt_p is None and nxt_c is None:
                break
            if nxt_c is not None and (nxt_p is None or nxt_c.fault.time < nxt_p.fault.time):
                d = nxt_c
                del cand[d.fault.gpu]
                out.append(d)
            else:
                assert nxt_p is not None
                d = nxt_p
                i += 1
            f = d.fault
            if f.time < down_until:  # no event: the clock runs on from its last return
                if d is nxt_c:
                    ret, parent = clock[f.gpu]
                    nd = draw(node, f.gpu, ret, f.time, parent)
                    if nd is not None:
                        cand[f.gpu] = nd
                continue
            down_until = f.time + repair_s
            clock[f.gpu] = (down_until, d)
            cand.pop(f.gpu, None)
            nd = draw(node, f.gpu, down_until, down_until, d)
            if nd is not None:
                cand[f.gpu] = nd
    return out


def _poisson_count(mean: float, rng: random.Random) -> int:
    if mean <= 0:
        return 0
    n, t = 0, rng.expovariate(1.0)
    while t < mean:
        n += 1
        t += rng.expovariate(1.0)
    return n


def repeat_share(faults: Sequence[Fault], repair_s: float = DAY) -> float:
    """Share of fatal events hitting a GPU that already failed in this plan and came back from repair, as the
    baseline runner counts them: a fatal fault puts its node DOWN for ``repair_s`` and a fault on a DOWN node
    is no event (the same failure seen again, Titan's re-report); the repaired GPU returns to service in
    place, so every later event on it is a repeat. No swaps here (a swapped GPU is a new GPU: ``runner``)."""
    seen: set[tuple[str, int]] = set()
    down_until: dict[str, float] = {}
    rep = total = 0
    for f in faults:
        if f.quiet or f.time < down_until.get(f.node, -math.inf):
            continue
        down_until[f.node] = f.time + repair_s
        total += 1
        key = (f.node, f.gpu)
        rep += key in seen
        seen.add(key)
    return rep / total if total else 0.0


# ---- telemetry -------------------------------------------------------------------------------------------
# Stage levels per signature. Counters are cumulative: a stage adds ``rate`` per hour while it lasts, and the
# level fields are set outright. Values are chosen from the thresholds quoted in core/signals.py's sources.
_HBM = {
    1: ({SBE_VOL: 20.0}, {ROWS_CORR: 4.0}),  # correctable ECC trickle, a few remapped rows
    2: ({SBE_VOL: 200.0}, {ROWS_CORR: 12.0}),  # past the SuperBench boundary (>10 remapped rows)
    3: ({SBE_VOL: 400.0}, {ROWS_CORR: 16.0, REMAP_PENDING: 1.0}),  # remap waits for a reset
}
_LINK = {
    1: ({NVLINK_CRC_FLIT: 150.0, PCIE_REPLAY: 20.0}, {}),
    2: ({NVLINK_CRC_FLIT: 1500.0, NVLINK_REPLAY: 20.0, PCIE_REPLAY: 200.0}, {}),
    3: (
        {
            NVLINK_CRC_FLIT: 3000.0,
            NVLINK_CRC_DATA: 500.0,
            NVLINK_REPLAY: 200.0,
            NVLINK_RECOVERY: 20.0,
            PCIE_REPLAY: 2000.0,
        },
        {},
    ),
}
_LINK_PCIE = {  # boards without NVLink: the link signature is PCIe only
    1: ({PCIE_REPLAY: 20.0}, {}),
    2: ({PCIE_REPLAY: 200.0}, {}),
    3: ({PCIE_REPLAY: 2000.0}, {ROWS_CORR: 12.0}),
}


def signature_table(sig: str, nvlink: bool) -> Mapping[int, tuple[Mapping[str, float], Mapping[str, float]]]:
    if sig == "hbm":
        return _HBM
    return _LINK if nvlink else _LINK_PCIE


def episode_fields(ep: Episode, t: float, nvlink: bool) -> dict[str, float]:
    """DCGM fields an episode contributes at time ``t`` (counters accumulated since its start)."""
    out: dict[str, float] = {}
    if t < ep.start:
        return out
    table = signature_table(ep.signature, nvlink)
    bounds = [*ep.change_times(), ep.end]
    for i in range(ep.max_stage):
        s = i + 1
        lo, hi = bounds[i], min(bounds[i + 1], t)
        rates, levels = table[s]
        if t >= lo:
            for k, v in levels.items():
                out[k] = v
        if hi > lo:
            for k, r in rates.items():
                out[k] = out.get(k, 0.0) + r * (hi - lo) / HOUR
    if t >= ep.end and ep.fault_id is None:
        out.pop(REMAP_PENDING, None)  # a benign episode's pending remap clears (reset at the next job end)
    return {k: math.floor(v) if k not in (REMAP_PENDING,) else v for k, v in out.items()}


def episodes_by_gpu(episodes: Sequence[Episode]) -> dict[tuple[str, int], list[Episode]]:
    out: dict[tuple[str, int], list[Episode]] = {}
    for e in episodes:
        out.setdefault((e.node, e.gpu), []).append(e)
    return out


def next_change(times: Sequence[float], t: float) -> float | None:
    i = bisect.bisect_right(times, t)
    return times[i] if i < len(times) else None
