"""Route: node features and weights that steer Slurm, and the feature updates that make Slurm agree.

Input: the Slurm view, priced nodes (tier, weight, reason), envelopes. Output: one ``NodeDecision`` per node
Slurm knows, and the ``UpdateNodes`` actions, grouped by identical (features, weight) so that the number of
Slurm calls grows with distinct groups, not with nodes.

Features FleetYield owns (every one starts with ``fy_``; the admin's features are kept, in their order):

| feature            | on a node when                                                                     |
|--------------------|------------------------------------------------------------------------------------|
| fy_tier_<tier>     | always exactly one: green, yellow, red, quarantined, canary, probation, retired,   |
|                    | unknown (never sampled yet)                                                        |
| fy_premium         | Slurm gpu_type or a GPU model matches profile.premium_gpu_models (H100/H200/B200..) |
| fy_nonpremium      | otherwise                                                                          |
| fy_nvlink_full     | the board has NVLink and every GPU's NVLink CRC and replay rates are below limits  |
| fy_hbm_full        | no GPU has a remap failure or pending remap, lost framebuffer capacity, or too     |
|                    | many uncorrectable remapped rows                                                   |
| fy_ok_batch        | tier green, yellow or probation (checkpointable work may use marginal nodes); with |
|                    | premium.batch not on a green premium node unless lent (core/premium.py)            |
| fy_ok_train        | tier green and NVLink intact: fy_nvlink_full, or a board without NVLink (L40S...)  |
|                    | (gangs that need NVLink also ask for fy_nvlink_full explicitly) -- or a yellow     |
|                    | node lent to a training job that idle green nodes cannot hold (core/gangs.py)      |
| fy_ok_finetune     | tier green and fy_hbm_full                                                         |
| fy_ok_decode       | tier green and fy_hbm_full, and fy_nonpremium -- or a premium node lent to waiting |
|                    | decode by core/premium.py (not one pending premium work can start on now; a       |
|                    | reserve stays unlent)                                                              |
| fy_ok_train, _fine-| also on one yellow node when no other node carries it (core/keep_open.py): Slurm  |
| tune, _decode      | refuses at submission a constraint no node has                                     |
| fy_canary          | tier canary (only rehabilitation probes)                                           |
| fy_lemon           | repeated fatal failures (core/learn.py): no fy_ok_train / fy_ok_finetune /          |
|                    | fy_ok_decode (off gangs and premium-class work); fy_ok_batch kept when healthy     |

Jobs opt in with constraints, e.g. ``sbatch --constraint=fy_ok_train``. Red, quarantined and unknown nodes
carry no ``fy_ok_*`` feature, nor does a node whose drain is held on its own agent's evidence (core/price.py
rule 3). A node without fresh data keeps the features it last had.

Reconcile: the wanted state is re-asserted every tick; a node is updated when its available or active
feature set or its weight differs from the wanted one (so a ``scontrol reconfigure`` that wiped the features
is repaired on the next tick). Never touched: nodes drained by someone else, nodes whose Slurm state is
unknown or empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from slurm_fleetyield.core.model import (
    FY_PREFIX,
    Envelope,
    NodeDecision,
    Observations,
    SlurmNode,
    Tier,
)
from slurm_fleetyield.core.plan import UpdateNodes
from slurm_fleetyield.core.price import Priced

OK_BATCH_TIERS = frozenset({Tier.GREEN, Tier.YELLOW, Tier.PROBATION})
# in service: under the stake rule (core/stake.py) every class feature the envelope allows, less withheld ones
SERVICE_TIERS = frozenset({Tier.GREEN, Tier.YELLOW, Tier.RED, Tier.PROBATION})
_GREEN = frozenset({Tier.GREEN})  # the tier rule: gang and premium-class features on green nodes only
_DECODE = f"{FY_PREFIX}ok_decode"
_TRAIN = f"{FY_PREFIX}ok_train"
_BATCH = f"{FY_PREFIX}ok_batch"
_GREEN_TIER = f"{FY_PREFIX}tier_green"
_SPARE = f"{FY_PREFIX}spare"  # hot spares (core/spares.py)
_GANG = f"{FY_PREFIX}ok_gang"  # twin of fy_ok_train (and on spares): job_submit maps gangs to it
_PREEMPT = f"{FY_PREFIX}ok_preempt"  # twin of fy_ok_batch (and on spares): the preemptible QOS's jobs
_CLASS = frozenset({_TRAIN, f"{FY_PREFIX}ok_finetune", _DECODE, _BATCH})
_NO_ENVELOPE = Envelope()  # of a node without an envelope (never mutated: frozen)


def trainable(env: Envelope, lemon: bool) -> bool:
    """The envelope half of ``fy_ok_train``: NVLink intact (or a board without NVLink), not a lemon. A
    green node with it carries the feature; a yellow one may be lent it (core/gangs.py)."""
    return not lemon and (env.nvlink_full or not env.nvlink)


def fy_features(
    tier: Tier,
    env: Envelope,
    lemon: bool = False,
    lent: bool = False,
    train_lent: bool = False,
    batch_wall: bool = False,
    service: bool = False,
    reserve: bool = True,
) -> tuple[str, ...]:
    """The fy_ features of a node in ``tier`` with envelope ``env`` (``lemon``: see learn; ``lent``: a
    premium node lent fy_ok_decode by core/premium.py; ``train_lent``: a yellow node lent fy_ok_train by
    core/gangs.py; ``batch_wall``: ``premium.batch``, a green premium node carries fy_ok_batch only when
    lent; ``service``: the stake rule, every in-service tier carries the class features its envelope allows
    and core/stake.py says which are withheld; ``reserve``: ``premium.reserve``, decode on a premium node
    only when lent), sorted."""
    f = [f"{FY_PREFIX}tier_{tier.value}", f"{FY_PREFIX}premium" if env.premium else f"{FY_PREFIX}nonpremium"]
    if env.nvlink_full:
        f.append(f"{FY_PREFIX}nvlink_full")
    if env.hbm_full:
        f.append(f"{FY_PREFIX}hbm_full")
    barred = lemon and not service  # the tier rule keeps lemons off gang and premium-class work
    batch_tiers, class_tiers = (SERVICE_TIERS, SERVICE_TIERS) if service else (OK_BATCH_TIERS, _GREEN)
    if tier in batch_tiers and not (
        batch_wall and tier is Tier.GREEN and env.premium and not barred and not lent
    ):
        f.append(f"{FY_PREFIX}ok_batch")
    if lemon:
        f.append(f"{FY_PREFIX}lemon")
    if tier in class_tiers and not barred:
        if trainable(env, False):
            f.append(f"{FY_PREFIX}ok_train")
        if env.hbm_full:
            f.append(f"{FY_PREFIX}ok_finetune")
            if not env.premium or lent or not reserve:
                f.append(f"{FY_PREFIX}ok_decode")
    elif train_lent and tier is Tier.YELLOW and trainable(env, lemon):
        f.append(f"{FY_PREFIX}ok_train")
    if tier is Tier.CANARY:
        f.append(f"{FY_PREFIX}canary")
    return tuple(sorted(f))


def route(
    obs: Observations, priced: Priced, envelopes: Mapping[str, Envelope], *args: Any, **kwargs: Any
) -> tuple[dict[str, NodeDecision], tuple[UpdateNodes, ...]]:
    """Each node's decision (``decide``, the same arguments) and the updates of those whose Slurm view
    differs from their decision (``updates``)."""
    decisions = decide(obs, priced, envelopes, *args, **kwargs)
    return decisions, updates(decisions, {n for n, d in decisions.items() if differs(d, obs.slurm[n])})


def decide(
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    lent: frozenset[str] = frozenset(),
    lent_reason: str = "",
    train_lent: frozenset[str] = frozenset(),
    train_reason: str = "",
    opened: Mapping[str, tuple[str, ...]] | None = None,
    open_reason: str = "",
    batch_wall: bool = False,
    walled: Mapping[str, str] | None = None,
    withheld: Mapping[str, frozenset[str]] | None = None,
    service: bool = True,
    reserve: bool = False,
    spares: Mapping[str, str] | None = None,
    spares_on: bool = False,
    names: Iterable[str] | None = None,
) -> dict[str, NodeDecision]:
    """Each node's decision: of every node Slurm knows, or of ``names`` (nodes of Slurm's view) only.

    ``lent``: premium nodes that carry fy_ok_decode this tick (core/premium.py), ``lent_reason`` why;
    ``train_lent``: yellow nodes that carry fy_ok_train this tick (core/gangs.py), ``train_reason`` why;
    ``opened``: class features kept open per node (core/keep_open.py), ``open_reason`` why; ``batch_wall``:
    ``premium.batch`` (green premium nodes carry fy_ok_batch only when lent); ``walled``: nodes reclaimed for
    a pending premium job (core/reclaim.py), which carry no fy_ok_batch, with why (the loop lends them
    fy_ok_decode only to keep decode submittable); ``withheld``: class features a node does not carry by the
    stake rule (core/stake.py); ``service``: that rule is on (class features on every in-service tier);
    ``reserve``: ``premium.reserve`` (fy_ok_decode on premium nodes only when lent); ``spares``: hot spares
    (core/spares.py) with why, which carry fy_spare, fy_ok_gang and fy_ok_preempt and no class feature;
    ``spares_on``: ``spares.enabled`` (fy_ok_gang twins fy_ok_train, fy_ok_preempt twins fy_ok_batch).

    A node's decision reads its Slurm row, priced node and envelope, what ``loans`` names of the loans for
    it, and the four flags; nothing else."""
    opened = opened or {}
    walled = walled or {}
    withheld = withheld or {}
    spares = spares or {}
    cache: dict[tuple[Tier, bool, bool, bool, bool, bool, bool], tuple[str, ...]] = {}  # a handful per call
    slurms, pnodes = obs.slurm, priced.nodes
    decisions: dict[str, NodeDecision] = {}
    for name in sorted(slurms) if names is None else names:
        slurm = slurms[name]
        pn = pnodes[name]
        env = envelopes.get(name, _NO_ENVELOPE)
        is_lent = name in lent
        gang = name in train_lent
        extra = opened.get(name, ()) if opened else ()
        wall = walled.get(name) if walled else None
        drop = withheld.get(name) if withheld else None
        spare = spares.get(name) if spares else None
        reason = pn.reason
        if pn.keep_fy is not None:
            fy = pn.keep_fy
            if (
                reserve and env.premium and not is_lent and _DECODE in fy
            ):  # a loan ends while the node is dark
                fy = tuple(f for f in fy if f != _DECODE)
            if batch_wall and env.premium and not is_lent and not pn.lemon and _GREEN_TIER in fy:
                fy = tuple(f for f in fy if f != _BATCH)
        else:
            tier = pn.feature_tier or pn.tier
            key = (tier, env.premium, env.nvlink_full, env.hbm_full, pn.lemon, is_lent, gang)
            hit = cache.get(key)
            if hit is None:
                hit = cache[key] = fy_features(
                    tier, env, pn.lemon, is_lent, gang, batch_wall, service, reserve
                )
            fy = hit
        if drop:
            gone = sorted(drop.intersection(fy))
            if gone:
                fy = tuple(f for f in fy if f not in drop)
                reason = f"{reason}; {', '.join(gone)} withheld (expected loss above the work it would do)"
        if spare is not None:  # no ordinary work: only gangs and the preemptible QOS land there
            fy = tuple(f for f in fy if f not in _CLASS)
            reason = f"{reason}; {spare}"
        if is_lent:
            what = "fy_ok_decode and fy_ok_batch" if batch_wall else "fy_ok_decode"
            reason = f"{reason}; {what} lent (premium widening: {lent_reason})"
        if gang and _TRAIN in fy:
            reason = f"{reason}; fy_ok_train lent (gang widening: {train_reason})"
        if extra:
            fy = tuple(sorted({*fy, *extra}))
            reason = f"{reason}; {', '.join(extra)} kept open ({open_reason})"
        if wall is not None:  # premium: fy_ok_decode only when lent (the loop lends it only to keep open)
            fy = tuple(f for f in fy if f != _BATCH)
            reason = f"{reason}; {wall} (premium reclaim)"
        if spares_on:
            twins = {_GANG} if spare is not None or _TRAIN in fy else set()
            if spare is not None or _BATCH in fy:
                twins.add(_PREEMPT)
            if spare is not None:
                twins.add(_SPARE)
            if twins:
                fy = tuple(sorted({*fy, *twins}))
        managed = pn.managed and _slurm_known(slurm)
        decisions[name] = NodeDecision(
            name,
            pn.tier,
            pn.health,
            pn.risk,
            fy,
            (*_admin(slurm.available_features), *fy),
            pn.weight,
            _state_text(slurm.states),
            reason,
            pn.evidence,
            env,
            managed,
        )
    return decisions


def loans(
    lent: frozenset[str] = frozenset(),
    lent_reason: str = "",
    train_lent: frozenset[str] = frozenset(),
    train_reason: str = "",
    opened: Mapping[str, tuple[str, ...]] | None = None,
    open_reason: str = "",
    walled: Mapping[str, str] | None = None,
    withheld: Mapping[str, frozenset[str]] | None = None,
    spares: Mapping[str, str] | None = None,
) -> dict[str, tuple[object, ...]]:
    """What ``route`` reads of the loans, walls, withheld features and spares, per node that has any (a
    node not named reads none): the loan of fy_ok_decode and why, of fy_ok_train and why, the features kept
    open and why, the wall, the features withheld and the spare's reason."""
    out: dict[str, tuple[object, ...]] = {}
    for n in {*lent, *train_lent, *(opened or ()), *(walled or ()), *(withheld or ()), *(spares or ())}:
        extra = (opened or {}).get(n, ())
        out[n] = (
            lent_reason if n in lent else None,
            train_reason if n in train_lent else None,
            extra,
            open_reason if extra else None,
            (walled or {}).get(n),
            (withheld or {}).get(n),
            (spares or {}).get(n),
        )
    return out


def differs(decision: NodeDecision, slurm: SlurmNode) -> bool:
    """Whether Slurm's view of a node FleetYield manages differs from its decision: the weight, or either
    feature list (order aside)."""
    if not decision.managed:
        return False
    if slurm.weight != decision.weight:
        return True
    return _lists_differ(slurm.available_features, slurm.active_features, decision.features)


def updates(decisions: Mapping[str, NodeDecision], differ: Iterable[str]) -> tuple[UpdateNodes, ...]:
    """The ``UpdateNodes`` of the nodes in ``differ``: one per distinct (features, weight), in the order of
    each group's first node name."""
    groups: dict[tuple[tuple[str, ...], int], list[str]] = {}
    for name in sorted(differ):
        d = decisions[name]
        groups.setdefault((d.features, d.weight), []).append(name)
    ordered = sorted(groups.items(), key=lambda kv: kv[1][0])  # stable plan order: by first node name
    return tuple(UpdateNodes(tuple(nodes), f, w) for (f, w), nodes in ordered)


def _slurm_known(slurm: SlurmNode) -> bool:
    return bool(slurm.states) and "UNKNOWN" not in slurm.states


# Slurm's feature lists and state sets repeat across nodes and ticks: what route derives from them is a
# pure function of them, kept by value (functools.lru_cache, bounded).
@lru_cache(maxsize=4096)
def _admin(available: tuple[str, ...]) -> tuple[str, ...]:
    """The admin's features of a Slurm feature list (those FleetYield does not own), in their order."""
    return tuple(f for f in available if not f.startswith(FY_PREFIX))


@lru_cache(maxsize=1024)
def _state_text(states: frozenset[str]) -> str:
    return "+".join(sorted(states))


@lru_cache(maxsize=8192)
def _lists_differ(available: tuple[str, ...], active: tuple[str, ...], features: tuple[str, ...]) -> bool:
    """Does either of Slurm's feature lists hold other features than ``features`` (order aside)?"""
    want = set(features)
    return set(available) != want or set(active) != want
