"""Keep open: every class feature job_submit.lua adds stays on some node, so Slurm never refuses a class.

Input: the Slurm view, this tick's routed decisions (the fy_ features every managed node will carry), priced
nodes, envelopes, the nodes kept open last tick (``ControllerState.kept_open``), ``Params`` (``keep_open``).
Output: ``Opened``: per node the class features it carries only so that its class stays submittable, the
next ``kept_open`` memory, the reason route appends, and log events when a feature is opened, moved, closed,
or has no node that could carry it.

Why: job_submit.lua ANDs ``fy_ok_train`` / ``fy_ok_finetune`` / ``fy_ok_decode`` to every job of its class.
Slurm checks a constraint against every node of the partition at submission, whatever the node's state:
when no node has the feature the job is refused outright ("Invalid feature specification", or "Requested
node configuration is not available" when the feature exists but not with the job's other constraints) and
never pends. A job that never pends is demand the widening stages cannot see: gang widening (core/gangs.py)
lends yellow nodes only to *pending* training jobs. So in a fleet whose green nodes are all gone (a
high-fault fleet where repaired nodes stay yellow for weeks, or a small cluster after two faults) every
training, fine-tune and decode job would be refused until a node turned green again. Measured on the
docker cluster: a feature carried only by a DRAINED node keeps submission open (the job pends with
"ReqNodeNotAvail"); a feature on no node at all is refused. Premium widening's rule 6
(``premium.keep_decode_open``) covers decode on premium nodes; this rule covers every class feature.

Rule, per tick, for each of ``fy_ok_train``, ``fy_ok_finetune``, ``fy_ok_decode``: when no node carries it
after routing (managed nodes: the features routed this tick; nodes FleetYield leaves alone: what Slurm
shows), one node carries it too: a yellow node priced from fresh data into its own tier (not a lemon, not
in a lifecycle stage, not held), in service, whose envelope the feature needs (``fy_ok_train``: NVLink
intact or none; ``fy_ok_finetune`` and ``fy_ok_decode``: full HBM; decode prefers non-premium nodes). Among
those: the largest GPU count first (a job asking for a whole node of the biggest kind must find one), then
the node kept open last tick (no hopping between equals), the lowest risk, the name. Nothing is opened on
red, quarantined, rehabilitating or unknown nodes; when no node qualifies the feature stays closed and an
event says which class Slurm will refuse. A kept-open node keeps its yellow weight; a job of the class may
run on it (as gang widening would lend it to a waiting gang), which is the price of not refusing the job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from slurm_fleetyield.core.gangs import own_features
from slurm_fleetyield.core.model import FY_PREFIX, Envelope, LogEvent, NodeDecision, Observations, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.premium import idle_gpus
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.route import trainable

OK_TRAIN = f"{FY_PREFIX}ok_train"
OK_FINETUNE = f"{FY_PREFIX}ok_finetune"
OK_DECODE = f"{FY_PREFIX}ok_decode"
# The class features job_submit.lua adds, with the envelope each needs (route.fy_features' green rule).
NEEDS: tuple[tuple[str, Callable[[Envelope, bool], bool]], ...] = (
    (OK_TRAIN, trainable),
    (OK_FINETUNE, lambda env, lemon: env.hbm_full and not lemon),
    (OK_DECODE, lambda env, lemon: env.hbm_full and not lemon),
)
CLASS_OF = {OK_TRAIN: "pretrain/default", OK_FINETUNE: "finetune", OK_DECODE: "decode"}


@dataclass(frozen=True, slots=True)
class Opened:
    lent: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> features kept open on it
    memory: tuple[tuple[str, str], ...] = ()  # (feature, node) kept open, sorted: ControllerState.kept_open
    reason: str = ""
    events: tuple[LogEvent, ...] = ()


def carried(
    obs: Observations, decisions: Mapping[str, NodeDecision], wanted: tuple[str, ...]
) -> frozenset[str]:
    """Of ``wanted``, the features some node carries after this tick's routing (a managed node: its routed
    fy_ features; a node left alone: what Slurm shows). Stops as soon as every one is found."""
    left = set(wanted)
    for name, d in decisions.items():
        if d.managed:
            fy = d.fy_features
        else:
            s = obs.slurm.get(name)
            fy = s.available_features if s is not None else ()
        left.difference_update(fy)
        if not left:
            break
    return frozenset(wanted).difference(left)


def keep_open(
    obs: Observations,
    decisions: Mapping[str, NodeDecision],
    priced: Priced,
    envelopes: Mapping[str, Envelope],
    before: tuple[tuple[str, str], ...],
    params: Params,
    now: float,
) -> Opened:
    was = dict(before)
    if not params.keep_open.enabled:
        return Opened(events=_changed(was, {}, now))
    wanted = tuple(f for f, _ in NEEDS)
    have = carried(obs, decisions, wanted)
    missing = [(f, need) for f, need in NEEDS if f not in have]
    if not missing:
        return Opened(events=_changed(was, {}, now))
    in_service = idle_gpus(obs)
    pnodes = priced.nodes
    yellow: list[tuple[str, PricedNode, Envelope, int]] = []
    for name in in_service:
        pn = pnodes.get(name)
        if pn is None or pn.tier is not Tier.YELLOW or not own_features(pn) or pn.lemon:
            continue
        env = envelopes.get(name)
        if env is None:
            continue
        yellow.append((name, pn, env, obs.slurm[name].gpu_count))
    now_open: dict[str, str] = {}  # feature -> node kept open; "" where no node qualifies
    for f, need in missing:
        cands = [
            (f == OK_DECODE and env.premium, -gpus, was.get(f) != name, pn.risk, name)
            for name, pn, env, gpus in yellow
            if need(env, pn.lemon)
        ]
        now_open[f] = min(cands)[-1] if cands else ""
    lent: dict[str, list[str]] = {}
    for f, n in now_open.items():
        if n:
            lent.setdefault(n, []).append(f)
    reason = "no other node carries it: Slurm would refuse the class at submission"
    return Opened(
        {n: tuple(sorted(fs)) for n, fs in lent.items()},
        tuple(sorted(now_open.items())),
        reason,
        _changed(was, now_open, now),
    )


def _changed(was: Mapping[str, str], now_open: Mapping[str, str], now: float) -> tuple[LogEvent, ...]:
    """Events of the change from ``was`` to ``now_open`` (feature -> node, "" = no node qualifies)."""
    out: list[LogEvent] = []
    for f in sorted(set(was) | set(now_open)):
        old, new = was.get(f), now_open.get(f)
        if old == new:
            continue
        who = CLASS_OF[f]
        if old:
            why = f"moved to {new}" if new else "no node qualifies" if new == "" else "another carries it"
            out.append(LogEvent(now, old, "open_return", f"{f} no longer kept open here: {why}"))
        if new:
            why = f"no other node carries it (Slurm would refuse {who} jobs at submission)"
            out.append(LogEvent(now, new, "open_lend", f"{f} kept open on this yellow node: {why}"))
        elif new == "":
            why = f"Slurm refuses {who} jobs at submission until a node is green, or yellow with the envelope"
            out.append(LogEvent(now, "", "class_unsubmittable", f"no node can carry {f}: {why}"))
        elif old == "":
            out.append(LogEvent(now, "", "class_submittable", f"{f} carried again: {who} jobs accepted"))
    return tuple(out)
