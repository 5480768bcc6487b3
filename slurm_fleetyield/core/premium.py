"""Premium widening: the premium reservation as a shadow price, not a wall.

Input: the Slurm view (nodes and jobs: ``JobView`` state, nodes, workload, gpus), priced nodes, envelopes,
the previous ``PremiumMemory``, ``PremiumParams``, the premium-needing classes (``SettleParams``) and ``now``.
Output: ``Widening``: the premium nodes that carry ``fy_ok_decode`` this tick (``lent``), the next memory,
the demand/supply figures that justified it, and log events when the lent set changes.

Why: by default ``fy_ok_decode`` sits on healthy non-premium nodes only (core/route.py). On a decode-heavy
fleet that wall makes decode queue while premium GPUs idle (the simulator lost ~17% net goodput on the openb
workload). Weights already express the preference (premium nodes +1000: Slurm fills every non-premium node
first), so the feature only needs to open when decode is actually stuck.

Rule, per tick:
1. premium demand = GPUs of PENDING jobs whose class is premium-needing (pretrain, finetune by default);
   premium supply = idle GPUs on eligible premium nodes (green, full HBM, not a lemon, not drained/down);
2. decode is *waiting* when PENDING decode jobs do not fit (best fit, per node) into the idle GPUs of the
   nodes that already carry ``fy_ok_decode`` (healthy non-premium ones, plus the premium nodes lent now);
   a decode job that fits is merely waiting for the next scheduling pass, and never causes lending;
3. while any premium-needing job is pending, nothing is lent (withdrawn at once, no hysteresis: premium
   work has the right of way);
4. otherwise, once decode has been waiting for ``lend_after_s``, premium nodes are lent until the waiting
   decode jobs fit: nodes already lent first (sticky), then the eligible node with the most idle GPUs, ties
   by name (deterministic); never more than ``eligible - reserve`` premium nodes lent *or still running
   decode* (a node returned while its decode service runs on still holds it), reserve = the largest of
   ``reserve_nodes``, ceil(``reserve_fraction`` x eligible premium nodes) and the node count of the largest
   premium-needing job seen (running or pending) within ``gang_memory_s`` -- a lent decode service is not
   preempted, so without that last term one long decode job could hold back the next gang for its whole
   life (the simulator showed an 8-node gang starting 20 h late behind lent decode);
5. a lent node is returned ``hysteresis_s`` after decode last waited (features do not flap with a queue
   that drains and refills between ticks), or at once when it stops being eligible.

Withdrawing ``fy_ok_decode`` changes only where Slurm places *new* jobs: decode services already running on
a premium node are not preempted (Slurm preemption is out of scope) and finish naturally. A premium job that
arrives meanwhile may wait for them; that is what the reserve is for, and why lending needs decode to have
waited first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from slurm_fleetyield.core.model import (
    Envelope,
    JobView,
    LogEvent,
    Observations,
    SlurmNode,
    Tier,
    WorkloadClass,
)
from slurm_fleetyield.core.params import Params, PremiumParams
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.state import PremiumMemory

_RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})
_OUT = frozenset(
    {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN"}
)


@dataclass(frozen=True, slots=True)
class Widening:
    lent: frozenset[str] = frozenset()
    memory: PremiumMemory = field(default_factory=PremiumMemory)
    events: tuple[LogEvent, ...] = ()
    premium_demand_gpus: int = 0  # GPUs of pending premium-needing jobs
    premium_pending_jobs: int = 0
    premium_supply_gpus: int = 0  # idle GPUs on eligible premium nodes
    decode_pending_gpus: int = 0
    decode_waiting_gpus: int = 0  # pending decode GPUs that fit nowhere fy_ok_decode already is
    reserve_nodes: int = 0
    reason: str = ""


def decode_eligible(pn: PricedNode, env: Envelope) -> bool:
    """Would this node carry fy_ok_decode if it were not premium (green, full HBM, not a lemon, derived)?"""
    return (
        pn.managed
        and pn.keep_fy is None
        and pn.tier is Tier.GREEN
        and pn.feature_tier in (None, Tier.GREEN)
        and env.hbm_full
        and not pn.lemon
    )


def idle_gpus(obs: Observations) -> dict[str, int]:
    """Idle GPUs per schedulable node: IDLE -> all, ALLOCATED -> none, else Gres minus running jobs' share.

    ``JobView.gpus`` is the job's total; a multi-node job uses gpus / len(nodes) on each of its nodes."""
    used: dict[str, float] = {}
    for j in obs.jobs:
        if j.state in _RUNNING and j.nodes and j.gpus > 0:
            share = j.gpus / len(j.nodes)
            for n in j.nodes:
                used[n] = used.get(n, 0.0) + share
    out: dict[str, int] = {}
    for name, s in obs.slurm.items():
        if s.states & _OUT or not s.states:
            continue
        if "IDLE" in s.states:
            out[name] = s.gpu_count
        elif "ALLOCATED" in s.states:
            out[name] = 0
        else:
            out[name] = max(0, s.gpu_count - math.ceil(used.get(name, 0.0) - 1e-9))
    return out


def widen(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    mem: PremiumMemory,
    params: Params,
    now: float,
) -> Widening:
    """``params.premium`` drives the rule; ``params.settle.premium_needing_classes`` names premium work."""
    pp = params.premium
    if not pp.enabled:
        return Widening(memory=PremiumMemory(), events=_changed(mem.lent, (), now, "premium widening off"))
    classes = frozenset(params.settle.premium_needing_classes)
    pending_premium = [j for j in obs.jobs if j.state == "PENDING" and j.workload and j.workload in classes]
    pending_decode = [
        j for j in obs.jobs if j.state == "PENDING" and j.workload is WorkloadClass.DECODE and j.gpus > 0
    ]
    if not (pending_decode or pending_premium or mem.lent or mem.waiting_since is not None):
        if any(j.workload and j.workload in classes and len(j.nodes) > 1 for j in obs.jobs):
            gang, seen = _largest_gang(obs, classes, 0, mem, pp, now)
            return Widening(memory=replace(mem, gang_nodes=gang, gang_seen=seen))
        return Widening(memory=mem)  # the common case: nothing pending, nothing lent
    idle = idle_gpus(obs)
    base: list[int] = []  # idle GPUs of nodes that carry fy_ok_decode without lending
    eligible: list[str] = []  # premium nodes that could be lent
    premium_nodes: set[str] = set()
    for name in sorted(obs.slurm):
        pn = priced.nodes.get(name)
        env = envelopes.get(name)
        if env is not None and env.premium:
            premium_nodes.add(name)
        if pn is None or env is None or not decode_eligible(pn, env) or _out(obs.slurm[name]):
            continue
        if env.premium:
            eligible.append(name)
        elif idle.get(name, 0) > 0:
            base.append(idle[name])
    max_node = max((s.gpu_count for s in obs.slurm.values()), default=0)
    gang, gang_seen = _largest_gang(obs, classes, max_node, mem, pp, now)
    reserve = max(pp.reserve_nodes, math.ceil(pp.reserve_fraction * len(eligible)), gang) if eligible else 0
    cap = max(0, len(eligible) - reserve)
    chunks = sorted((c for j in pending_decode for c in _chunks(j, max_node)), reverse=True)
    unfit = _fit(chunks, base)
    waiting = bool(unfit)
    since = (mem.waiting_since if mem.waiting_since is not None else now) if waiting else None
    last = now if waiting else mem.last_waiting
    fig = Widening(
        premium_demand_gpus=sum(j.gpus for j in pending_premium),
        premium_pending_jobs=len(pending_premium),
        premium_supply_gpus=sum(idle.get(n, 0) for n in eligible),
        decode_pending_gpus=sum(j.gpus for j in pending_decode),
        decode_waiting_gpus=sum(unfit),
        reserve_nodes=reserve,
    )
    if pending_premium:
        why = f"{len(pending_premium)} premium-needing job(s) pending ({fig.premium_demand_gpus} GPUs)"
        events = _changed(mem.lent, (), now, f"withdrawn: {why}")
        return replace(fig, memory=PremiumMemory((), since, last, gang, gang_seen), events=events, reason=why)
    eligible_set = frozenset(eligible)
    # premium nodes still running decode (lent earlier, returned since): they count against the cap, or
    # a node returned while its decode service runs on would let the next loan eat into the reserve
    held = {
        n for j in obs.jobs if j.state in _RUNNING and j.workload is WorkloadClass.DECODE for n in j.nodes
        if n in premium_nodes
    }  # fmt: skip
    keep = [n for n in mem.lent if n in eligible_set]
    if not waiting and (last is None or now - last >= pp.hysteresis_s):
        keep = []
    room = cap - len(held - set(keep))
    keep = sorted(keep, key=lambda n: (n not in held, n))[: max(0, room)]
    lent = list(keep)
    if waiting and since is not None and now - since >= pp.lend_after_s:
        unfit = _fit(unfit, [idle.get(n, 0) for n in keep])
        for n in sorted((n for n in eligible if n not in keep), key=lambda n: (-idle.get(n, 0), n)):
            if not unfit or len(set(lent) | held) >= cap:
                break
            left = _fit(unfit, [idle.get(n, 0)])
            if len(left) < len(unfit):
                lent.append(n)
                unfit = left
    if waiting:
        why = (
            f"decode waiting: {fig.decode_waiting_gpus} of {fig.decode_pending_gpus} pending decode GPUs fit "
            f"no fy_ok_decode node, no premium-needing job pending, {reserve} premium node(s) kept in reserve"
        )
    else:
        why = f"decode not waiting (hysteresis {pp.hysteresis_s:g} s)"
    out = tuple(sorted(lent))
    events = _changed(mem.lent, out, now, why)
    nxt = PremiumMemory(out, since, last, gang, gang_seen)
    return replace(fig, lent=frozenset(out), memory=nxt, events=events, reason=why)


def _largest_gang(
    obs: Observations,
    classes: frozenset[str],
    max_node: int,
    mem: PremiumMemory,
    pp: PremiumParams,
    now: float,
) -> tuple[int, float | None]:
    """Nodes of the largest premium-needing job seen within ``gang_memory_s`` (pending: GPUs / node size)."""
    size = 0
    for j in obs.jobs:
        if j.workload and j.workload in classes:
            n = len(j.nodes) if j.nodes else (math.ceil(j.gpus / max_node) if max_node > 0 else 1)
            size = max(size, n)
    if mem.gang_seen is not None and now - mem.gang_seen < pp.gang_memory_s and mem.gang_nodes >= size:
        return mem.gang_nodes, mem.gang_seen if mem.gang_nodes > size else now
    return (size, now) if size else (0, None)


def _out(s: SlurmNode) -> bool:
    return bool(s.states & _OUT) or not s.states


def _chunks(j: JobView, max_node: int) -> list[int]:
    """Per-node pieces of a pending job (its nodes are not chosen yet): whole nodes of ``max_node`` GPUs."""
    if max_node <= 0 or j.gpus <= max_node:
        return [j.gpus]
    full, rest = divmod(j.gpus, max_node)
    return [max_node] * full + ([rest] if rest else [])


def _fit(chunks: list[int], free: list[int]) -> list[int]:
    """Best fit of ``chunks`` (largest first) into per-node ``free`` GPUs; returns the chunks that fit
    nowhere. A histogram of free counts keeps this O(chunks x GPUs per node)."""
    if not chunks:
        return []
    hist: dict[int, int] = {}
    for f in free:
        if f > 0:
            hist[f] = hist.get(f, 0) + 1
    if not hist:
        return list(chunks)
    top = max(hist)
    unfit = []
    for c in chunks:
        k = next((k for k in range(c, top + 1) if hist.get(k)), None)
        if k is None:
            unfit.append(c)
            continue
        hist[k] -= 1
        if k - c > 0:
            hist[k - c] = hist.get(k - c, 0) + 1
    return unfit


def _changed(before: tuple[str, ...], after: tuple[str, ...], now: float, why: str) -> tuple[LogEvent, ...]:
    events = []
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    for n in new:
        events.append(LogEvent(now, n, "premium_lend", f"fy_ok_decode lent to premium node: {why}"))
    for n in gone:
        events.append(LogEvent(now, n, "premium_return", f"fy_ok_decode returned: {why}"))
    return tuple(events)
