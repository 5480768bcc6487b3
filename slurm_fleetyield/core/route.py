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

from collections.abc import Callable, Mapping
from typing import Any

from slurm_fleetyield.core.model import (
    FY_PREFIX,
    Envelope,
    NodeDecision,
    Observations,
    SlurmNode,
    Tier,
    fast_new,
)
from slurm_fleetyield.core.plan import UpdateNodes
from slurm_fleetyield.core.price import Priced
from slurm_fleetyield.core.state import changed_keys, note_changes, slurm_view, sorted_names

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
_new_decision: Callable[..., NodeDecision] = fast_new(NodeDecision)  # one per node routed (model.fast_new)
_TEXT_CAP = 10_000
# route's derived texts, by value: admin features by Slurm's feature list, the state text by Slurm's state
# set, and whether Slurm's (available, active) lists differ from the wanted features
_Text = tuple[
    dict[tuple[str, ...], tuple[str, ...]],
    dict[frozenset[str], str],
    dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], bool],
]


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
    obs: Observations,
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    lent: frozenset[str] = frozenset(),
    lent_reason: str = "",
    memo: dict[str, Any] | None = None,
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
) -> tuple[Mapping[str, NodeDecision], tuple[UpdateNodes, ...]]:
    """``lent``: premium nodes that carry fy_ok_decode this tick (core/premium.py), ``lent_reason`` why;
    ``memo``: ``ControllerState.memo``, whose per-node results of earlier ticks are reused and updated;
    ``train_lent``: yellow nodes that carry fy_ok_train this tick (core/gangs.py), ``train_reason`` why;
    ``opened``: class features kept open per node (core/keep_open.py), ``open_reason`` why; ``batch_wall``:
    ``premium.batch`` (green premium nodes carry fy_ok_batch only when lent); ``walled``: nodes reclaimed for
    a pending premium job (core/reclaim.py), which carry no fy_ok_batch, with why (the loop lends them
    fy_ok_decode only to keep decode submittable); ``withheld``: class features a node does not carry by the
    stake rule (core/stake.py); ``service``: that rule is on (class features on every in-service tier);
    ``reserve``: ``premium.reserve`` (fy_ok_decode on premium nodes only when lent); ``spares``: hot spares
    (core/spares.py) with why, which carry fy_spare, fy_ok_gang and fy_ok_preempt and no class feature;
    ``spares_on``: ``spares.enabled`` (fy_ok_gang twins fy_ok_train, fy_ok_preempt twins fy_ok_batch)."""
    opened = opened or {}
    walled = walled or {}
    withheld = withheld or {}
    spares = spares or {}
    seen = memo.setdefault("route", {}) if memo is not None else None
    cache: dict[
        tuple[Tier, bool, bool, bool, bool, bool, bool], tuple[str, ...]
    ] = {}  # most nodes share a handful of these
    # Slurm's feature lists and state sets repeat across nodes and ticks: what route derives from them
    # (admin features, the state text, whether Slurm's lists differ from the wanted ones) is kept by value,
    # in the memo when there is one (pure functions of their keys; dropped past _TEXT_CAP entries).
    kept: _Text = memo.setdefault("route_text", ({}, {}, {})) if memo is not None else ({}, {}, {})
    if len(kept[0]) + len(kept[1]) + len(kept[2]) > _TEXT_CAP:
        for d in kept:
            d.clear()
    admin_of, state_text, lists_differ = kept
    # A node whose Slurm view, priced node and envelope are the very objects of its last routing, with the
    # same loans, is routed the same: its NodeDecision (and whether Slurm differs from it) is reused
    # (ControllerState.memo via ``memo``; not persisted). Last call's answer is the start when it is known
    # which nodes may differ from it (_todo); only those go through the per-node memo.
    slurms, pnodes = obs.slurm, priced.nodes
    names = sorted_names(memo.setdefault("route_names", {}) if memo is not None else None, slurms)
    loans = (frozenset(lent), frozenset(train_lent), opened, walled, withheld, spares)
    last = memo.get("route_last") if memo is not None else None
    snapshot = slurm_view(memo, obs)  # a copy: the shell's mapping may be updated in place
    flags = (batch_wall, service, reserve, spares_on)
    todo = _todo(last, names, (snapshot, pnodes, envelopes), loans, flags, memo)
    decisions: dict[str, NodeDecision]
    base: Mapping[str, NodeDecision] | None = None  # the answer carried, if any
    if todo is None or last is None:
        decisions, differ, items = {}, set(), names
    else:
        base = last["out"]
        decisions, differ = dict(base), {n for n in last["differ"] if n not in todo}
        items = sorted(n for n in todo if n in slurms)
    for name in items:
        slurm = slurms[name]
        pn = pnodes[name]
        env = envelopes.get(name, _NO_ENVELOPE)
        is_lent = name in lent
        gang = name in train_lent
        extra = opened.get(name, ()) if opened else ()
        wall = walled.get(name) if walled else None
        drop = withheld.get(name) if withheld else None
        spare = spares.get(name) if spares else None
        hit = seen.get(name) if seen is not None else None
        if (
            hit is not None
            and hit[0] is slurm
            and hit[1] is pn
            and hit[2] is env
            and hit[3] is is_lent
            and (not is_lent or hit[4] == lent_reason)
            and hit[7] is gang
            and (not gang or hit[8] == train_reason)
            and hit[9] == extra
            and hit[10] is batch_wall
            and hit[11] == wall
            and hit[12] == drop
            and hit[13] is service
            and hit[14] is reserve
            and hit[15] == spare
            and hit[16] is spares_on
        ):
            decisions[name] = hit[5]
            if hit[6]:
                differ.add(name)
            else:
                differ.discard(name)
            continue
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
        available = slurm.available_features
        admin = admin_of.get(available)
        if admin is None:
            admin = admin_of[available] = slurm.admin_features
        features = (*admin, *fy)
        states = state_text.get(slurm.states)
        if states is None:
            states = state_text[slurm.states] = "+".join(sorted(slurm.states))
        managed = pn.managed and _slurm_known(slurm)
        decisions[name] = _new_decision(
            name,
            pn.tier,
            pn.health,
            pn.risk,
            fy,
            features,
            pn.weight,
            states,
            reason,
            pn.evidence,
            env,
            managed,
        )
        differs = managed and slurm.weight != pn.weight
        if managed and not differs:  # Slurm's feature lists against the wanted ones, kept by value
            lists = (available, slurm.active_features, features)
            known = lists_differ.get(lists)
            if known is None:
                known = lists_differ[lists] = _lists_differ(*lists)
            differs = known
        if differs:
            differ.add(name)
        else:
            differ.discard(name)
        if seen is not None:
            seen[name] = (
                slurm,
                pn,
                env,
                is_lent,
                lent_reason,
                decisions[name],
                differs,
                gang,
                train_reason,
                extra,
                batch_wall,
                wall,
                drop,
                service,
                reserve,
                spare,
                spares_on,
            )
    if memo is not None:
        memo["route_last"] = {
            "names": names, "inputs": (snapshot, pnodes, envelopes), "loans": loans,
            "wall": flags,
            "out": decisions, "differ": frozenset(differ),
        }  # fmt: skip
        note_changes(memo, "route", decisions, base, todo or ())
    groups: dict[tuple[tuple[str, ...], int], list[str]] = {}
    for name in sorted(differ):  # the nodes whose Slurm view differs from their decision, by name
        groups.setdefault((decisions[name].features, pnodes[name].weight), []).append(name)
    ordered = sorted(groups.items(), key=lambda kv: kv[1][0])  # stable plan order: by first node name
    updates = tuple(UpdateNodes(tuple(nodes), f, w) for (f, w), nodes in ordered)
    return decisions, updates


def _todo(
    last: dict[str, Any] | None,
    names: list[str],
    inputs: tuple[Mapping[str, object], ...],
    loans: tuple[Mapping[str, object] | frozenset[str], ...],
    batch_wall: tuple[bool, bool, bool, bool],
    memo: dict[str, Any] | None = None,
) -> set[str] | None:
    """The nodes whose routing may differ from the last call's answer, or None (not known: route every
    node). Known when the node names are the very list of the last call (the same keys, core/state.py
    ``sorted_names``) and ``batch_wall`` is the same. Then a node is routed again when its Slurm view,
    priced node or envelope is another object, or when it carries a loan, an opened feature or a wall now
    or did in the last call (their reasons are compared by the per-node memo). Every other node has the very
    inputs of its memo entry, whose decision is the last answer."""
    if last is None or last["names"] is not names or last["wall"] != batch_wall:
        return None
    todo: set[str] = set()
    for new, old in zip(inputs, last["inputs"], strict=True):
        todo |= changed_keys(new, old, memo)
    for new_loan, old_loan in zip(loans, last["loans"], strict=True):
        todo.update(new_loan, old_loan)
    return todo


def _slurm_known(slurm: SlurmNode) -> bool:
    return bool(slurm.states) and "UNKNOWN" not in slurm.states


def _lists_differ(available: tuple[str, ...], active: tuple[str, ...], features: tuple[str, ...]) -> bool:
    """Does either of Slurm's feature lists hold other features than ``features`` (order aside)?"""
    want = set(features)
    return set(available) != want or set(active) != want
