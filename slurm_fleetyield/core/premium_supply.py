"""Premium supply: which nodes carry a class feature without a loan, and the idle GPUs premium nodes offer.

Input: the tick's ``Observations``, ``Priced`` nodes, envelopes, idle GPUs per node. Output: whether decode /
batch has a home without a loan (``decode_eligible``, ``batch_home``, ``decode_home``) and the supply of idle
GPUs: on nodes where decode or batch runs without a loan, and on eligible premium nodes (``supply``; rule 1
of core/premium.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from slurm_fleetyield.core.capacity import out_of_service
from slurm_fleetyield.core.model import Envelope, Observations, Tier
from slurm_fleetyield.core.price import Priced, PricedNode
from slurm_fleetyield.core.route import OK_BATCH_TIERS


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


def decode_home(obs: Observations, priced: Priced, envelopes: Mapping[str, Envelope]) -> bool:
    """Is some in-service non-premium node decode-eligible (so fy_ok_decode exists without a loan)?"""
    return _home(obs, priced, envelopes, lambda pn, env: not env.premium and decode_eligible(pn, env))


def _premium(env: Envelope | None) -> bool:
    return env is not None and env.premium


_NOTHING = (0, 0, False)


def share(n_idle: int, env: Envelope | None, pn: PricedNode | None) -> tuple[int, int, bool]:
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


Supply = Callable[
    [Mapping[str, int], Mapping[str, Envelope], Mapping[str, PricedNode]],
    tuple[dict[int, int], dict[int, int], list[str]],
]
"""``supply``'s signature: what core/premium.py asks of the supply."""


def supply(
    idle: Mapping[str, int],
    envelopes: Mapping[str, Envelope],
    pnodes: Mapping[str, PricedNode],
) -> tuple[dict[int, int], dict[int, int], list[str]]:
    """Rules 1 and 3 per node (``share`` of every node ``idle_gpus`` counts, i.e. not out of service): the
    idle GPUs that carry fy_ok_decode without lending and those that carry fy_ok_batch without lending,
    as histograms (free count -> nodes, what ``best_fit`` reads of them), and the eligible premium nodes
    by name. core/carry_place.py ``premium_supply`` keeps the histograms from call to call."""
    base: dict[int, int] = {}
    batch: dict[int, int] = {}
    eligible: list[str] = []
    for name, n_idle in idle.items():
        decode, batch_idle, premium = share(n_idle, envelopes.get(name), pnodes.get(name))
        if decode > 0:
            base[decode] = base.get(decode, 0) + 1
        if batch_idle > 0:
            batch[batch_idle] = batch.get(batch_idle, 0) + 1
        if premium:
            eligible.append(name)
    return base, batch, sorted(eligible)
