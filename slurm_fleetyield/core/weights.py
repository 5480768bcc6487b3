"""Shadow prices: the Slurm node weight of each tier, and of an in-service node by its risk.

Input: a node's tier, whether it is premium, its risk, the learned base multiplier, ``Params``. Output: the
weight (Slurm allocates the lowest weight first): by tier (``weight_of``), or under the stake rule by risk
over the fleet's base hazard (``risk_weight``); tier thresholds relative to the learned base
(``relative``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from slurm_fleetyield.core.model import NodeRisk, Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.state import ControllerState

# --- Shadow prices: Slurm allocates the LOWEST weight first ---------------------------------------------
# Yellow first: the work allowed there (batch, by feature) should use marginal nodes before healthy ones,
# which keeps green capacity free for work that needs it. Green next. Rehabilitation tiers sit with yellow.
# Unknown, red and quarantined last: jobs without fy_ constraints avoid them while anything else is free.
# Premium nodes add PREMIUM_OFFSET, larger than the spread of the service tiers, so non-premium work fills
# every non-premium node before it touches premium GPUs, and premium yellow still precedes premium green.
# The offset is a shadow price, not a reservation (premium.reserve is the wall): work that can run anywhere
# takes premium GPUs only when no other node fits it, so it costs that work nothing, while a premium node
# half-held by a decode or batch job is a node the all-or-nothing premium gangs cannot start on. Under the
# stake rule too (risk_weight orders nodes within each side): simulated 128 nodes x 30 days, synthetic load
# 0.9, 30 faults per 1,000 node-days, precursor share 0.25, tuning seeds 100-109: net goodput vs Slurm
# +0.01% [-0.19, +0.21] without it, +0.64% [+0.34, +0.93] with it (premium misuse 41.8k -> 10.6k GPU-h,
# pretrain queue delay 17.9 -> 9.6 h).
TIER_WEIGHTS: Mapping[Tier, int] = {
    Tier.YELLOW: 10,
    Tier.PROBATION: 20,
    Tier.GREEN: 100,
    Tier.CANARY: 500,
    Tier.UNKNOWN: 3_000,  # never-seen nodes only; a node seen before keeps its last weight
    Tier.RED: 5_000,
    Tier.QUARANTINED: 10_000,
    Tier.RETIRED: 10_000,
}
PREMIUM_OFFSET = 1_000

RISK_STEP, RISK_STEPS = 10, 39  # stake rule: an in-service node's weight grows by RISK_STEP per half-doubling
_RISK_ORDERED = frozenset({Tier.GREEN, Tier.YELLOW, Tier.PROBATION})


def weight_of(tier: Tier, premium: bool, params: Params) -> int:
    overrides = params.price.tier_weights
    base = overrides.get(tier.value, TIER_WEIGHTS[tier])
    offset = params.price.premium_offset
    if offset is None:  # an order, not a wall: under either rule, with or without the reservation
        offset = PREMIUM_OFFSET
    return base + (offset if premium else 0)


def base_multiplier(state: ControllerState, params: Params) -> float:
    """The learned multiplier of the fleet's base hazard (core/learn.py), 1 without learning."""
    return state.learn.multipliers.get("base", 1.0) if params.learn.enabled else 1.0


def relative(threshold: float, m: float) -> float:
    """A tier threshold relative to the fleet's own base: when learning raises every GPU's base hazard by
    ``m`` > 1, the threshold's hazard rises with it (p' = 1 - (1 - p)^m), so a fleet-wide rise is evidence
    against no node and a node at the base can never reach a tier above green."""
    return threshold if m <= 1.0 else -math.expm1(m * math.log1p(-threshold))


def risk_weight(tier: Tier, premium: bool, risk: NodeRisk | None, m: float, params: Params) -> int:
    """Stake rule: the node most likely to fail is used last. In-service green, yellow and probation nodes
    share green's weight plus RISK_STEP per half-doubling of the node's hazard over the fleet's base hazard
    for its GPUs (0 at or below the base, at most RISK_STEPS steps: below the canary weight)."""
    w = weight_of(Tier.GREEN, premium, params)
    if risk is None or not risk.gpus or not risk.probability > 0:
        return w
    base = -len(risk.gpus) * m * math.log1p(-params.risk.base_probability)
    hazard = math.inf if risk.probability >= 1 else -math.log1p(-risk.probability)
    steps = 2 * math.log2(hazard / base) if hazard < math.inf else RISK_STEPS
    return w + RISK_STEP * min(RISK_STEPS, max(0, math.floor(steps)))
