from core.builders import L40S, Fleet, Runner, mixed_fleet, tier_params
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import TIER_WEIGHTS, weight_of


def test_weight_order_yellow_first_premium_last_under_the_tier_rule():
    p = tier_params()
    order = [
        weight_of(Tier.YELLOW, False, p),
        weight_of(Tier.GREEN, False, p),
        weight_of(Tier.YELLOW, True, p),
        weight_of(Tier.GREEN, True, p),
        weight_of(Tier.RED, False, p),
        weight_of(Tier.QUARANTINED, False, p),
    ]
    assert order == sorted(order) and len(set(order)) == len(order)
    assert TIER_WEIGHTS[Tier.PROBATION] < TIER_WEIGHTS[Tier.GREEN]


def test_stake_rule_weights_order_nodes_by_hazard_over_the_fleet_base():
    from slurm_fleetyield.core.model import GpuRisk, Health, NodeRisk
    from slurm_fleetyield.core.price import RISK_STEP, risk_weight

    p = Params()
    base = p.risk.base_probability

    def node(pg: float) -> NodeRisk:
        gpus = tuple(GpuRisk("n", i, f"u{i}", "L40S", Health.OK, pg if i == 0 else base) for i in range(8))
        return NodeRisk("n", Health.OK, 1 - (1 - pg) * (1 - base) ** 7, gpus)

    at_base, twice, far = node(base), node(1 - (1 - base) ** 10), node(0.4)
    green = weight_of(Tier.GREEN, False, p)
    assert risk_weight(Tier.GREEN, False, at_base, 1.0, p) == green
    # one GPU at 10x the base: the node's hazard is 17/8 = 2.1x the base, two half-doublings
    assert risk_weight(Tier.YELLOW, False, twice, 1.0, p) == green + 2 * RISK_STEP
    assert (
        green < risk_weight(Tier.YELLOW, False, twice, 1.0, p) < risk_weight(Tier.YELLOW, False, far, 1.0, p)
    )
    assert risk_weight(Tier.YELLOW, False, far, 1.0, p) < TIER_WEIGHTS[Tier.CANARY]
    # learning raised every GPU's base 2x: the same node is no longer above it
    assert risk_weight(Tier.YELLOW, False, twice, 2.0, p) == green


def test_stake_rule_keeps_the_premium_shadow_price_without_the_reservation():
    """Work that does not need premium GPUs takes them last under the stake rule too (premium.reserve off):
    a premium node at the fleet's base weighs more than the riskiest in-service non-premium node, and the
    risk order still holds among premium nodes. Without it, at synthetic load 0.9 (128 nodes, 30 faults per
    1,000 node-days, tuning seeds 100-109) decode and batch held premium nodes the 8-node gangs waited for:
    premium misuse 41.8k vs 10.6k GPU-h, net goodput vs Slurm +0.01% vs +0.64%."""
    from slurm_fleetyield.core.model import GpuRisk, Health, NodeRisk
    from slurm_fleetyield.core.price import risk_weight

    p = Params()
    assert p.stake.enabled and not p.premium.reserve
    base = p.risk.base_probability

    def node(pg: float) -> NodeRisk:
        gpus = tuple(GpuRisk("n", i, f"u{i}", "H100", Health.OK, pg if i == 0 else base) for i in range(8))
        return NodeRisk("n", Health.OK, 1 - (1 - pg) * (1 - base) ** 7, gpus)

    riskiest_other = risk_weight(Tier.YELLOW, False, node(0.99), 1.0, p)
    premium_at_base = risk_weight(Tier.GREEN, True, node(base), 1.0, p)
    assert riskiest_other < premium_at_base < risk_weight(Tier.YELLOW, True, node(0.4), 1.0, p)
    assert weight_of(Tier.GREEN, True, p) > weight_of(Tier.GREEN, False, p)
    # an explicit 0 still switches the shadow price off
    off = Params.model_validate({"price": {"premium_offset": 0}})
    assert weight_of(Tier.GREEN, True, off) == weight_of(Tier.GREEN, False, off)


def test_stake_rule_weights_put_premium_nodes_after_the_others():
    """Through a tick: on a mixed fleet, every in-service H100 node weighs more than every L40S node."""
    f = mixed_fleet(2, 2)
    res = Runner(f).tick()
    weights = {n: d.weight for n, d in res.nodes.items()}
    assert max(weights["l0"], weights["l1"]) < min(weights["h0"], weights["h1"]), weights


def test_relative_thresholds_follow_the_learned_base():
    from slurm_fleetyield.core.price import relative

    assert relative(0.05, 1.0) == 0.05 and relative(0.05, 0.5) == 0.05
    assert abs(relative(0.05, 2.0) - (1 - 0.95**2)) < 1e-12
    assert relative(0.5, 40.0) < 1.0


def test_weight_overrides():
    p = Params.model_validate({"price": {"tier_weights": {"green": 7}, "premium_offset": 0}})
    assert weight_of(Tier.GREEN, True, p) == 7


def test_red_node_keeps_running_no_drain_and_proposal_logged_once():
    f = Fleet(1, model=L40S)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)
    f.run_job(1, ("gpu000",))
    r = Runner(f, tier_params())
    res = r.tick()
    d = res.nodes["gpu000"]
    assert d.tier is Tier.RED and "fy_tier_red" in d.fy_features
    assert not [x for x in d.fy_features if x.startswith("fy_ok_")]
    assert res.plan.of_kind("drain") == ()
    assert [e.kind for e in res.events].count("drain_proposal") == 1
    assert "drain_proposal" not in [e.kind for e in r.tick().events]


def test_tier_change_event():
    f = Fleet(1)
    r = Runner(f)
    r.tick()
    f.set("gpu000", 0, s.REMAP_PENDING, 1)
    ev = [e for e in r.tick().events if e.kind == "tier_change"]
    assert ev and ev[0].data["from"] == "green" and ev[0].data["to"] == "yellow"


def test_unknown_keeps_last_features_and_weight():
    f = Fleet(2)
    f.set("gpu000", 0, s.REMAP_PENDING, 1)
    r = Runner(f)
    before = r.tick().nodes["gpu000"]
    f.nodes["gpu000"].sampled = False
    after = r.tick().nodes["gpu000"]
    assert after.tier is Tier.UNKNOWN
    assert after.fy_features == before.fy_features and after.weight == before.weight
    assert r.last.plan.empty  # nothing to change, nothing destructive


def test_never_seen_node_is_unknown_without_admission():
    f = Fleet(1)
    f.nodes["gpu000"].sampled = False
    d = Runner(f).tick().nodes["gpu000"]
    assert d.tier is Tier.UNKNOWN and "fy_tier_unknown" in d.fy_features
    assert not [x for x in d.fy_features if x.startswith("fy_ok_")]
