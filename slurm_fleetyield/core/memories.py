"""The per-node and per-stage memories that ``ControllerState`` carries (core/state.py persists them).

``NodeMemory`` (tier, who drained it, fatal history), the gate's ``OpenProposal`` and ``Denial``, settle's,
premium widening's, reclaim's and learn's memories (``Prediction`` per open prediction). Each is bounded as
core/state.py says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.model import Tier


@dataclass(frozen=True, slots=True)
class NodeMemory:
    """Per-node memory: last decided tier and why, who drained it, and its fatal history."""

    tier: Tier
    since: float  # when it entered ``tier``
    reason: str
    drained_by_us: bool = False
    fatal_history: tuple[tuple[float, str], ...] = ()  # (time, GPU uuid or "" for node-wide), oldest first
    last_xid: int | None = None  # of the last quarantine
    last_gpu: int | None = None
    fy_features: tuple[str, ...] = ()  # last fy_ features decided on fresh data (kept while UNKNOWN)
    weight: int | None = None  # last weight decided on fresh data

    @property
    def fatal_times(self) -> tuple[float, ...]:
        return tuple(t for t, _ in self.fatal_history)


@dataclass(frozen=True, slots=True)
class OpenProposal:
    """A drain proposal the gate made and no one has decided yet (one per node at most)."""

    proposal_id: str
    node: str
    risk: float  # at proposal time
    created_at: float
    expires_at: float
    gpus: tuple[int, ...] = ()
    below_since: float | None = None  # risk under min_risk_to_keep_open since (withdrawal hysteresis)
    approved_by: str = ""  # approved, drain not yet executed (held by a cap): retried every tick
    approved_at: float | None = None


@dataclass(frozen=True, slots=True)
class Denial:
    """An admin said no: not proposed again before ``time + cooldown`` unless risk > ``risk + margin``."""

    proposal_id: str
    time: float
    risk: float


@dataclass(frozen=True, slots=True)
class SettleMemory:
    """What settle needs across ticks: job ids already settled (oldest first, bounded) and the intervals
    during which premium-needing work was pending (``(start, end)``; the last one is open when ``end`` is
    None)."""

    settled: tuple[int, ...] = ()
    pending: tuple[tuple[float, float | None], ...] = ()


@dataclass(frozen=True, slots=True)
class PremiumMemory:
    """Premium widening (core/premium.py): premium nodes lent fy_ok_decode (sorted), since when decode has
    been waiting without a break (None: not waiting), and when it last waited (the return hysteresis)."""

    lent: tuple[str, ...] = ()
    waiting_since: float | None = None
    last_waiting: float | None = None
    gang_nodes: int = 0  # nodes of the largest premium-needing job seen lately (sizes the reserve)
    gang_seen: float | None = None  # when a job of that size was last seen
    claims: tuple[tuple[int, float], ...] = ()  # (pending premium job id, since when it claims), by id


@dataclass(frozen=True, slots=True)
class ReclaimMemory:
    """Premium reclaim (core/reclaim.py): pending premium jobs blocked only by batch on premium GPUs (job id,
    since when), walled nodes (node, premium job id it was reclaimed for, since when) and batch jobs requeued
    (job id, when; for the cooldown). Each sorted."""

    blocked: tuple[tuple[int, float], ...] = ()
    walls: tuple[tuple[str, int, float], ...] = ()
    requeued: tuple[tuple[int, float], ...] = ()
    served: tuple[tuple[int, float], ...] = ()  # premium jobs reclaim acted for (id, when), for the cooldown


@dataclass(frozen=True, slots=True)
class Prediction:
    """One open prediction: P(fatal within ``horizon_s``) = ``p`` made at ``made_at`` for ``node``.

    ``parts`` splits the UN-adjusted (raw model) expected events by signal bucket (``base`` or the dominant
    signal of a GPU); ``gpu_buckets`` names the bucket of each GPU that had signals (others: ``base``), so an
    event on a known GPU is attributed to its bucket."""

    node: str
    made_at: float
    horizon_s: float
    p: float
    parts: tuple[tuple[str, float], ...] = ()
    gpu_buckets: tuple[tuple[int, str], ...] = ()

    @property
    def due(self) -> float:
        return self.made_at + self.horizon_s


@dataclass(frozen=True, slots=True)
class LearnMemory:
    """Open predictions (one per node), the reliability table's sums and the Poisson-Gamma evidence."""

    predictions: Mapping[str, Prediction] = field(default_factory=dict)
    next_due: float | None = None  # earliest due of the open predictions (skip the scan before it)
    bin_count: tuple[int, ...] = ()
    bin_p: tuple[float, ...] = ()  # sum of predicted p per bin
    bin_y: tuple[float, ...] = ()  # number of events per bin
    brier_sum: float = 0.0
    resolved: int = 0
    observed: Mapping[str, float] = field(default_factory=dict)  # bucket -> events (fractional if shared)
    expected: Mapping[str, float] = field(default_factory=dict)  # bucket -> raw expected events
    multipliers: Mapping[str, float] = field(default_factory=dict)  # bucket -> learned hazard multiplier
