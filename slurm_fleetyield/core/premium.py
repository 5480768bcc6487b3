"""Premium widening: the premium reservation as a shadow price, not a wall.

Input: the Slurm view (nodes and jobs: ``JobView`` state, nodes, workload, gpus), priced nodes, envelopes,
the previous ``PremiumMemory``, ``PremiumParams``, the premium-needing classes (``SettleParams``) and ``now``.
Output: ``Widening``: the premium nodes that carry ``fy_ok_decode`` this tick (``lent``), the next memory,
the demand/supply figures that justified it, and log events when the lent set changes.

Why: by default ``fy_ok_decode`` sits on healthy non-premium nodes only (core/route.py). On a decode-heavy
fleet that wall makes decode queue while premium GPUs idle (simulated on the openb workload: -13% net
goodput against unmodified Slurm, docs/results.md). Weights already express the preference (premium nodes
+1000: Slurm fills every non-premium node first), so the feature only needs to open when decode is stuck.
An earlier rule lent nothing while *any* premium-needing job was pending; in a busy fleet one almost always
is (a gang waiting for eight whole nodes with three idle, a finetune deep in the queue), so it almost never
lent and the idle premium GPUs stayed idle. Premium work now claims what it can use *now*; the reserve
protects what it will need later.

Rule, per tick:
1. eligible premium nodes: green, full HBM, not a lemon, not drained/down; their idle GPUs are the supply;
2. premium right of way: the PENDING jobs of a premium-needing class (pretrain, finetune by default), by job
   id (submission order, Slurm's default age priority), are placed all-or-nothing on the idle GPUs of the
   eligible premium nodes (best fit per node; a gang as whole nodes; nodes not lent before nodes lent, then
   by name). A job that fits *claims* those nodes: a claimed node is not lent this tick (a loan on it is
   withdrawn at once, no hysteresis). A job that does not fit (a gang waiting for more nodes than are idle)
   claims nothing: it cannot start on these GPUs now, whoever uses them; what it needs later is the
   reserve's job (4). A claim lasts ``claim_grace_s`` from the first tick the job fitted (remembered while
   it stays pending): a job that fitted idle GPUs for that long and was not started is held back by
   something else -- higher-priority jobs ahead of it in a deep queue (Slurm tests only the first
   ``default_queue_depth``/``bf_max_job_test`` jobs), a limit or constraint this rule does not see -- so
   keeping GPUs idle for it helps nobody; it claims nothing any more;
3. decode is *waiting* when PENDING decode jobs do not fit (best fit, per node) into the idle GPUs of the
   nodes that carry ``fy_ok_decode`` without a loan (healthy non-premium ones); a decode job that fits is
   merely waiting for the next scheduling pass, and never causes lending;
4. once decode has been waiting for ``lend_after_s``, unclaimed eligible premium nodes are lent until the
   waiting decode jobs fit: nodes already lent first (sticky), then the node with the most idle GPUs, ties
   by name (deterministic); never more than ``eligible - reserve`` premium nodes lent *or still running
   decode* (a node returned while its decode service runs on still holds it), reserve = the largest of
   ``reserve_nodes``, ceil(``reserve_fraction`` x eligible premium nodes) and the node count of the largest
   premium-needing job seen (running or pending) within ``gang_memory_s`` -- a lent decode service is not
   preempted, so without that term one long decode job could hold back the next gang for its whole life
   (the simulator showed an 8-node gang starting 20 h late behind lent decode) -- the gang term capped at
   floor(``gang_reserve_max_fraction`` x eligible): a gang as large as the premium fleet would otherwise
   reserve all of it, which is the wall again;
5. a lent node is returned ``hysteresis_s`` after decode last waited (features do not flap with a queue
   that drains and refills between ticks), or at once when it stops being eligible or is claimed (2);
6. decode kept open (``keep_decode_open``): when no in-service non-premium node is decode-eligible (none
   exists, or all are yellow, red or drained), one unclaimed premium node within the cap is lent even with
   no decode waiting (the one lent already, else the most idle): Slurm rejects at submission a job whose
   constraint no node carries, so decode would be refused outright and could never wait and be lent to.

Withdrawing ``fy_ok_decode`` changes only where Slurm places *new* jobs: decode services already running on
a premium node are not preempted (Slurm preemption is out of scope) and finish naturally. A premium job that
arrives meanwhile may wait for them; that is what the reserve is for, and why lending needs decode to have
waited first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_fleetyield.core.model import (
    Envelope,
    JobView,
    LogEvent,
    Observations,
    SlurmNode,
    Tier,
    WorkloadClass,
    job_index,
)
from slurm_fleetyield.core.params import Params, PremiumParams
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.route import OK_BATCH_TIERS
from slurm_fleetyield.core.state import PremiumMemory, changed_keys

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
    premium_startable_jobs: int = 0  # of those, the ones that fit the idle eligible premium GPUs now
    claimed: frozenset[str] = frozenset()  # premium nodes those jobs would start on: not lendable
    premium_supply_gpus: int = 0  # idle GPUs on eligible premium nodes
    decode_pending_gpus: int = 0
    decode_waiting_gpus: int = 0  # pending decode GPUs that fit nowhere fy_ok_decode already is
    batch_pending_gpus: int = 0  # premium.batch only
    batch_waiting_gpus: int = 0  # pending batch GPUs that fit nowhere fy_ok_batch already is
    reserve_nodes: int = 0
    reason: str = ""
    kept_open: bool = False  # rule 6: one node lent only so that decode stays submittable

    @property
    def loan(self) -> tuple[frozenset[str], str]:
        """(lent nodes, why): route's arguments."""
        return self.lent, self.reason


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


def pending_premium_jobs(obs: Observations, classes: frozenset[str]) -> list[JobView]:
    """PENDING jobs of a premium-needing class (``settle.premium_needing_classes``) asking for GPUs, by job
    id (submission order: Slurm's default age priority; a job id is unique in a queue)."""
    return sorted(
        (
            j
            for w, js in job_index(obs.jobs).pending_by.items()
            if w and w in classes
            for j in js
            if j.gpus > 0
        ),
        key=lambda j: j.job_id,
    )


_IDLE: list[tuple[Observations, dict[str, int]]] = []  # the last answer and its Observations (held)


def idle_gpus(obs: Observations) -> dict[str, int]:
    """Idle GPUs per schedulable node: IDLE -> all, ALLOCATED -> none, else Gres minus running jobs' share.

    ``JobView.gpus`` is the job's total; a multi-node job uses gpus / len(nodes) on each of its nodes (the
    running jobs are read only when some node is neither IDLE nor ALLOCATED). Several stages ask within one
    tick: the answer for the very same ``Observations`` (one per tick, unchanged while it runs) is counted
    once and handed out as a copy."""
    if _IDLE and _IDLE[0][0] is obs:
        return dict(_IDLE[0][1])
    out = _idle_gpus(obs)
    _IDLE[:] = [(obs, out)]
    return dict(out)


def _idle_gpus(obs: Observations) -> dict[str, int]:
    slurm = obs.slurm
    base, partly = _idle_base(slurm)
    out = dict(base)
    if partly:
        used: dict[str, float] = {}
        for j in job_index(obs.jobs).holding:
            if j.state in _RUNNING and j.nodes and j.gpus > 0:
                share = j.gpus / len(j.nodes)
                for n in j.nodes:
                    used[n] = used.get(n, 0.0) + share
        for name in partly:
            out[name] = max(0, slurm[name].gpu_count - math.ceil(used.get(name, 0.0) - 1e-9))
    return out


# the last Slurm view seen (a copy), its nodes in service (IDLE: all GPUs, else 0) and the partly allocated
_IDLE_BASE: list[tuple[dict[str, SlurmNode], dict[str, int], frozenset[str]]] = []


def _idle_base(slurm: Mapping[str, SlurmNode]) -> tuple[dict[str, int], frozenset[str]]:
    """Per in-service node, in Slurm's order: its Gres count when IDLE, else 0; and the nodes neither IDLE
    nor ALLOCATED (their idle GPUs depend on the running jobs). Only the views that are other objects than
    last time are read again, while no node enters or leaves service (else every view is)."""
    snapshot = dict(slurm)
    last = _IDLE_BASE[0] if _IDLE_BASE else None
    if last is not None:
        base, partly = dict(last[1]), set(last[2])
        for name in changed_keys(snapshot, last[0]):
            s = snapshot.get(name)
            kind = None if s is None else _idle_kind(s)  # None: out of service, or gone
            if (kind is None) is (name in base):  # entered or left service: read every view
                break
            if kind is None:
                continue
            base[name] = kind[0]
            if kind[1]:
                partly.add(name)
            else:
                partly.discard(name)
        else:
            frozen = frozenset(partly)
            _IDLE_BASE[:] = [(snapshot, base, frozen)]
            return base, frozen
    base, partly = {}, set()
    for name, s in snapshot.items():
        kind = _idle_kind(s)
        if kind is not None:
            base[name] = kind[0]
            if kind[1]:
                partly.add(name)
    frozen = frozenset(partly)
    _IDLE_BASE[:] = [(snapshot, base, frozen)]
    return base, frozen


def _idle_kind(s: SlurmNode) -> tuple[int, bool] | None:
    """An in-service node's idle GPUs as far as its state tells (IDLE: all, else 0) and whether it is partly
    allocated (neither IDLE nor ALLOCATED: the running jobs tell the rest); None: out of service."""
    if out_of_service(s):
        return None
    if "IDLE" in s.states:
        return s.gpu_count, False
    return 0, "ALLOCATED" not in s.states


def widen(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    mem: PremiumMemory,
    params: Params,
    now: float,
    walled: frozenset[str] = frozenset(),
    memo: dict[str, Any] | None = None,
) -> Widening:
    """``params.premium`` drives the rule; ``params.settle.premium_needing_classes`` names premium work;
    ``walled``: premium nodes premium reclaim (core/reclaim.py) keeps for a premium job: never lent to
    waiting decode, and the keep-open loan (rule 6) only when no other node can take it; ``memo``:
    ``ControllerState.memo``, where the supply of the last call is kept (``_supply``)."""
    pp = params.premium
    if not (pp.enabled and pp.reserve):  # no reservation: nothing to lend (route puts decode on every node)
        return Widening(memory=PremiumMemory(), events=_changed(mem.lent, (), now, "premium widening off"))
    classes = frozenset(params.settle.premium_needing_classes)
    pending_premium = pending_premium_jobs(obs, classes)
    jobs = job_index(obs.jobs)
    DECODE, BATCH = WorkloadClass.DECODE, WorkloadClass.BATCH
    pending_decode = [j for j in jobs.pending_by.get(DECODE, ()) if j.workload is DECODE and j.gpus > 0]
    batch = jobs.pending_by.get(BATCH, ()) if pp.batch else ()
    pending_batch = [j for j in batch if j.workload is BATCH and j.gpus > 0]
    homeless = pp.keep_decode_open and (
        not _decode_home(obs, priced, envelopes)
        or (pp.batch and not _home(obs, priced, envelopes, batch_home))
    )
    if not (
        pending_decode or pending_batch or pending_premium or mem.lent or mem.waiting_since is not None
        or homeless
    ):  # fmt: skip
        if mem.claims:
            mem = replace(mem, claims=())
        if any(j.workload and j.workload in classes and len(j.nodes) > 1 for j in jobs.placed):
            gang, seen = _largest_gang(obs, classes, 0, mem, pp, now)
            return Widening(memory=replace(mem, gang_nodes=gang, gang_seen=seen))
        return Widening(memory=mem)  # the common case: nothing pending, nothing lent
    idle = idle_gpus(obs)
    base, batch_base, eligible = _supply(idle, envelopes, priced.nodes, memo)
    max_node = max((s.gpu_count for s in obs.slurm.values()), default=0)
    gang, gang_seen = _largest_gang(obs, classes, max_node, mem, pp, now)
    gang_cap = math.floor(pp.gang_reserve_max_fraction * len(eligible) + 1e-9)
    reserve = (
        max(pp.reserve_nodes, math.ceil(pp.reserve_fraction * len(eligible)), min(gang, gang_cap))
        if eligible
        else 0
    )
    cap = max(0, len(eligible) - reserve)
    chunks = sorted((c for j in pending_decode for c in node_pieces(j, max_node)), reverse=True)
    unfit = _best_fit(chunks, dict(base))
    decode_unfit = sum(unfit)
    if pending_batch:
        batch_chunks = sorted((c for j in pending_batch for c in node_pieces(j, max_node)), reverse=True)
        unfit = sorted(unfit + _best_fit(batch_chunks, dict(batch_base)), reverse=True)
    waiting = bool(unfit)
    since = (mem.waiting_since if mem.waiting_since is not None else now) if waiting else None
    last = now if waiting else mem.last_waiting
    claimed, startable, claims = _claims(
        pending_premium, eligible, idle, frozenset(mem.lent), max_node, dict(mem.claims), pp.claim_grace_s,
        now,
    )  # fmt: skip
    fig = Widening(
        premium_demand_gpus=sum(j.gpus for j in pending_premium),
        premium_pending_jobs=len(pending_premium),
        premium_startable_jobs=startable,
        claimed=claimed,
        premium_supply_gpus=sum(idle.get(n, 0) for n in eligible),
        decode_pending_gpus=sum(j.gpus for j in pending_decode),
        decode_waiting_gpus=decode_unfit,
        batch_pending_gpus=sum(j.gpus for j in pending_batch),
        batch_waiting_gpus=sum(unfit) - decode_unfit,
        reserve_nodes=reserve,
    )
    unclaimed = [n for n in eligible if n not in claimed]
    lendable = [n for n in unclaimed if n not in walled]
    eligible_set = frozenset(lendable)
    # premium nodes still running decode (lent earlier, returned since): they count against the cap, or
    # a node returned while its decode service runs on would let the next loan eat into the reserve
    # (premium.batch: batch on an eligible, i.e. green, premium node too; a yellow one takes batch unlent)
    eligible_now = frozenset(eligible)
    held = {
        n for j in jobs.holding_by.get(DECODE, ()) if j.workload is DECODE and j.state in _RUNNING
        for n in j.nodes if n in obs.slurm and _premium(envelopes.get(n))
    }  # fmt: skip
    if pp.batch:
        held.update(
            n for j in jobs.holding_by.get(BATCH, ()) if j.workload is BATCH and j.state in _RUNNING
            for n in j.nodes if n in eligible_now
        )  # fmt: skip
    keep = [n for n in mem.lent if n in eligible_set]
    if not waiting and (last is None or now - last >= pp.hysteresis_s):
        keep = []
    # keep earlier loans (those still running decode first) only while loans + holders fit under the cap
    lent: list[str] = []
    for n in sorted(keep, key=lambda n: (n not in held, n)):
        if len(held.union(lent, (n,))) <= cap:
            lent.append(n)
    keep = list(lent)
    if waiting and since is not None and now - since >= pp.lend_after_s:
        unfit = best_fit(unfit, [idle.get(n, 0) for n in keep])
        for n in sorted((n for n in lendable if n not in keep), key=lambda n: (-idle.get(n, 0), n)):
            if not unfit or len(set(lent) | held) >= cap:
                break
            if idle.get(n, 0) < unfit[-1]:  # unfit is largest first and the nodes most idle first: none fits
                break
            left = best_fit(unfit, [idle.get(n, 0)])
            if len(left) < len(unfit):
                lent.append(n)
                unfit = left
    open_loan = False
    if homeless and not lent:  # rule 6: keep decode submittable (a walled node only as the last resort)
        for n in sorted(unclaimed, key=lambda n: (n in walled, n not in mem.lent, -idle.get(n, 0), n)):
            if len(held | {n}) <= cap:
                lent.append(n)
                open_loan = True
                break
    premium = (
        f"{startable} of {len(pending_premium)} pending premium-needing job(s) can start on idle premium "
        f"GPUs now ({len(claimed)} node(s) claimed)"
    )
    work = "decode/batch" if pp.batch else "decode"
    if open_loan:
        why = (
            f"no in-service node can carry the {work} feature without a loan: one premium node lent so "
            f"that {work} jobs are accepted (Slurm rejects a constraint no node has); {premium}; {reserve} "
            "premium node(s) kept in reserve"
        )
    elif waiting:
        batch_note = (
            f", {fig.batch_waiting_gpus} of {fig.batch_pending_gpus} pending batch GPUs no fy_ok_batch node"
            if pp.batch
            else ""
        )
        why = (
            f"{work} waiting: {fig.decode_waiting_gpus} of {fig.decode_pending_gpus} pending decode GPUs fit "
            f"no fy_ok_decode node{batch_note}; {premium}; {reserve} premium node(s) kept in reserve"
        )
    else:
        why = f"{work} not waiting (hysteresis {pp.hysteresis_s:g} s)"
    out = tuple(sorted(lent))
    what = "fy_ok_decode and fy_ok_batch" if pp.batch else "fy_ok_decode"
    events = _changed(mem.lent, out, now, why, claimed, premium, what)
    nxt = PremiumMemory(out, since, last, gang, gang_seen, claims)
    return replace(fig, lent=frozenset(out), memory=nxt, events=events, reason=why, kept_open=open_loan)


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
    for w, js in job_index(obs.jobs).by.items():
        if not (w and w in classes):
            continue
        for j in js:
            n = len(j.nodes) if j.nodes else (math.ceil(j.gpus / max_node) if max_node > 0 else 1)
            size = max(size, n)
    if mem.gang_seen is not None and now - mem.gang_seen < pp.gang_memory_s and mem.gang_nodes >= size:
        return mem.gang_nodes, mem.gang_seen if mem.gang_nodes > size else now
    return (size, now) if size else (0, None)


def _claims(
    jobs: list[JobView],
    eligible: list[str],
    idle: Mapping[str, int],
    lent: frozenset[str],
    max_node: int,
    before: Mapping[int, float],
    grace_s: float,
    now: float,
) -> tuple[frozenset[str], int, tuple[tuple[int, float], ...]]:
    """Premium right of way (rule 2): the eligible premium nodes that pending premium-needing ``jobs`` (in
    priority order) would start on now, all-or-nothing per job; how many of the jobs could start; and the
    claim memory (job id -> since when it first could, kept while it stays pending). A claim older than
    ``grace_s`` claims nothing."""
    free = {n: idle[n] for n in eligible if idle.get(n, 0) > 0}
    total = sum(free.values())  # kept equal to sum(free.values()) as GPUs are claimed
    claimed: set[str] = set()
    startable = 0
    memory: list[tuple[int, float]] = []
    for j in jobs:
        since = before.get(j.job_id)
        if since is not None and now - since >= grace_s:
            memory.append((j.job_id, since))  # lapsed: Slurm is not starting it here, whoever waits
            continue
        if j.gpus > total:
            continue  # cannot start on these GPUs now, whoever uses them
        pick = place(node_pieces(j, max_node), free, lent)
        if pick is None:
            continue
        startable += 1
        memory.append((j.job_id, now if since is None else since))
        for n, g in pick.items():
            free[n] -= g
            total -= g
            claimed.add(n)
    return frozenset(claimed), startable, tuple(memory)


def place(chunks: list[int], free: Mapping[str, int], lent: frozenset[str]) -> dict[str, int] | None:
    """All-or-nothing best fit of one job's per-node ``chunks`` (largest first): each on the node with the
    fewest free GPUs that holds it, unlent nodes before lent ones, then by name. None: some chunk fits
    nowhere. A whole-node chunk empties its node, so a gang's chunks land on distinct nodes."""
    left = dict(free)
    used: dict[str, int] = {}
    for c in sorted(chunks, reverse=True):
        best = min(((n in lent, f, n) for n, f in left.items() if f >= c), default=None)
        if best is None:
            return None
        n = best[2]
        left[n] -= c
        used[n] = used.get(n, 0) + c
    return used


def batch_home(pn: PricedNode, env: Envelope) -> bool:
    """Does this node carry fy_ok_batch without a loan under ``premium.batch`` (route.fy_features: green,
    yellow or probation, except green premium nodes that are not lemons)?"""
    if not pn.managed:
        return False
    if pn.keep_fy is not None:
        return "fy_ok_batch" in pn.keep_fy and not (
            env.premium and not pn.lemon and "fy_tier_green" in pn.keep_fy
        )
    tier = pn.feature_tier or pn.tier
    if tier not in OK_BATCH_TIERS:
        return False
    return not (tier is Tier.GREEN and env.premium and not pn.lemon)


def _home(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    qualifies: Callable[[PricedNode, Envelope], bool],
) -> bool:
    """Is some in-service node one that ``qualifies`` (carries the feature without a loan)? Stops at the
    first one: in a mixed fleet that is one of the first few nodes."""
    pnodes = priced.nodes
    for name, s in obs.slurm.items():
        env = envelopes.get(name)
        if env is None or out_of_service(s):
            continue
        pn = pnodes.get(name)
        if pn is not None and qualifies(pn, env):
            return True
    return False


def _decode_home(obs: Observations, priced: Priced, envelopes: Mapping[str, Envelope]) -> bool:
    """Is some in-service non-premium node decode-eligible (so fy_ok_decode exists without a loan)?"""
    return _home(obs, priced, envelopes, lambda pn, env: not env.premium and decode_eligible(pn, env))


def _premium(env: Envelope | None) -> bool:
    return env is not None and env.premium


def out_of_service(s: SlurmNode) -> bool:
    return not s.states or not _OUT.isdisjoint(s.states)


def node_pieces(j: JobView, max_node: int) -> list[int]:
    """Per-node pieces of a pending job (its nodes are not chosen yet): whole nodes of ``max_node`` GPUs."""
    if max_node <= 0 or j.gpus <= max_node:
        return [j.gpus]
    full, rest = divmod(j.gpus, max_node)
    return [max_node] * full + ([rest] if rest else [])


_NOTHING = (0, 0, False)


def _share(n_idle: int, env: Envelope | None, pn: PricedNode | None) -> tuple[int, int, bool]:
    """What one schedulable node with ``n_idle`` idle GPUs adds to the supply: (idle GPUs on which decode
    runs without a loan, idle GPUs on which batch runs without a loan under ``premium.batch``, whether it is
    an eligible premium node); 0 where it adds none."""
    if env is None or pn is None or not (env.premium or n_idle > 0):
        return _NOTHING
    batch = n_idle if n_idle > 0 and batch_home(pn, env) else 0
    if not decode_eligible(pn, env):
        return (0, batch, False)
    if env.premium:
        return (0, batch, True)
    return (n_idle, batch, False)


def _supply(
    idle: Mapping[str, int],
    envelopes: Mapping[str, Envelope],
    pnodes: Mapping[str, PricedNode],
    memo: dict[str, Any] | None,
) -> tuple[dict[int, int], dict[int, int], list[str]]:
    """Rules 1 and 3 per node (``_share`` of every node ``idle_gpus`` counts, i.e. not out of service): the
    idle GPUs that carry fy_ok_decode without lending and those that carry fy_ok_batch without lending,
    as histograms (free count -> nodes, what ``best_fit`` reads of them), and the eligible premium nodes
    by name.

    ``memo`` (``ControllerState.memo``) keeps the last call's shares and totals: only the nodes whose idle
    count, envelope or priced node (the very object, ``state.changed_keys``) differs are looked at again;
    ``tests/core/test_premium.py`` checks the totals against a fresh count."""
    last = memo.get("premium_supply") if memo is not None else None
    if last is None:
        shares: dict[str, tuple[int, int, bool]] = {}
        base: dict[int, int] = {}
        batch: dict[int, int] = {}
        eligible: set[str] = set()
        todo: Iterable[str] = idle
    else:
        shares, base, batch = dict(last["shares"]), dict(last["base"]), dict(last["batch"])
        eligible = set(last["eligible"])
        old_idle = last["idle"]
        todo = {n for n, v in idle.items() if old_idle.get(n) != v}  # holds the keys new to idle
        if len(old_idle) != len(idle) - sum(1 for n in todo if n not in old_idle):  # some left idle
            todo.update(old_idle.keys() - idle.keys())
        todo |= changed_keys(envelopes, last["envs"], memo) | changed_keys(pnodes, last["pnodes"], memo)
    moved = last is None  # an eligible node came or went: sorted again
    for name in todo:
        n_idle = idle.get(name)
        new = _NOTHING if n_idle is None else _share(n_idle, envelopes.get(name), pnodes.get(name))
        old = shares.get(name, _NOTHING)
        if new == old:
            continue
        moved = moved or new[2] is not old[2]
        for hist, was, now in ((base, old[0], new[0]), (batch, old[1], new[1])):
            if was > 0:
                left = hist[was] - 1
                if left:
                    hist[was] = left
                else:
                    del hist[was]  # every count in a histogram stays > 0 (_best_fit)
            if now > 0:
                hist[now] = hist.get(now, 0) + 1
        if new[2]:
            eligible.add(name)
        else:
            eligible.discard(name)
        if new is _NOTHING:
            shares.pop(name, None)
        else:
            shares[name] = new
    names = sorted(eligible) if moved or last is None else last["eligible"]
    if memo is not None:
        memo["premium_supply"] = {
            "idle": idle, "envs": envelopes, "pnodes": pnodes, "shares": shares, "base": base, "batch": batch,
            "eligible": names,
        }  # fmt: skip
    return base, batch, names


def best_fit(chunks: list[int], free: list[int]) -> list[int]:
    """Best fit of ``chunks`` (largest first) into per-node ``free`` GPUs; returns the chunks that fit
    nowhere. A histogram of free counts keeps this O(chunks x GPUs per node)."""
    if not chunks:
        return []
    hist: dict[int, int] = {}
    for f in free:
        if f > 0:
            hist[f] = hist.get(f, 0) + 1
    return _best_fit(chunks, hist)


def _best_fit(chunks: list[int], hist: dict[int, int]) -> list[int]:
    """``best_fit`` over ``hist`` (free count > 0 -> nodes with that many free, every count > 0), which it
    uses up."""
    if not chunks:
        return []
    if not hist:
        return list(chunks)
    top = max(hist)  # the largest free count left (hist[top] > 0 while top > 0)
    unfit: list[int] = []
    for i, c in enumerate(chunks):
        if c > top:
            unfit.append(c)
            continue
        k = c
        while not hist.get(k):  # the smallest free count that takes c (ends at top at the latest)
            k += 1
        left = hist[k] - 1
        hist[k] = left
        if k - c > 0:
            hist[k - c] = hist.get(k - c, 0) + 1
        if not left and k == top:
            top = max((f for f, m in hist.items() if m > 0), default=0)
            if not top:  # nothing free anywhere: the rest fits nowhere
                unfit.extend(chunks[i + 1 :])
                break
    return unfit


def _changed(
    before: tuple[str, ...],
    after: tuple[str, ...],
    now: float,
    why: str,
    claimed: frozenset[str] = frozenset(),
    claim_why: str = "",
    what: str = "fy_ok_decode",
) -> tuple[LogEvent, ...]:
    events = []
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    for n in new:
        events.append(LogEvent(now, n, "premium_lend", f"{what} lent to premium node: {why}"))
    for n in gone:
        reason = f"withdrawn, premium work can start here: {claim_why}" if n in claimed else why
        events.append(LogEvent(now, n, "premium_return", f"{what} returned: {reason}"))
    return tuple(events)
