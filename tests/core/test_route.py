from core.builders import H100, L40S, Fleet, Runner, tier_params
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import Tier
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.route import fy_features


def test_admin_features_kept_in_order_then_sorted_fy():
    f = Fleet(1, admin_features=("zeta", "alpha", "fy_stale_from_before"))
    res = Runner(f).tick()
    d = res.nodes["gpu000"]
    assert d.features[:2] == ("zeta", "alpha")
    assert d.features[2:] == d.fy_features == tuple(sorted(d.fy_features))
    assert "fy_stale_from_before" not in d.features


def test_decode_never_on_premium_under_the_reservation():
    f = Fleet(0)
    f.add("h", H100)
    f.add("l", L40S)
    res = Runner(f, tier_params()).tick()
    assert "fy_ok_decode" not in res.nodes["h"].fy_features
    assert "fy_ok_decode" in res.nodes["l"].fy_features
    for tier in Tier:
        from slurm_fleetyield.core.model import Envelope

        assert "fy_ok_decode" not in fy_features(
            tier, Envelope(premium=True, nvlink_full=True, hbm_full=True)
        )


def test_without_the_reservation_decode_runs_on_premium_nodes_too():
    f = Fleet(0)
    f.add("h", H100)
    f.add("l", L40S)
    res = Runner(f).tick()
    assert "fy_ok_decode" in res.nodes["h"].fy_features
    assert "fy_ok_decode" in res.nodes["l"].fy_features


def test_the_tier_rule_without_the_reservation_puts_decode_on_premium_nodes():
    # premium.reserve false lends nothing (core/premium.py), so the tier rule must not wall decode off
    f = Fleet(0)
    f.add("h", H100)
    res = Runner(f, Params(stake={"enabled": False})).tick()
    assert "fy_ok_decode" in res.nodes["h"].fy_features


def test_yellow_node_admits_batch_only_under_the_tier_rule():
    f = Fleet(2)  # gpu001 green: it carries every class feature, so none is kept open on gpu000
    f.set("gpu000", 0, s.REMAP_PENDING, 1)
    d = Runner(f, tier_params()).tick().nodes["gpu000"]
    assert d.tier is Tier.YELLOW
    assert [x for x in d.fy_features if x.startswith("fy_ok_")] == ["fy_ok_batch"]
    assert "fy_tier_yellow" in d.fy_features


def test_canary_tier_features():
    from slurm_fleetyield.core.model import Envelope

    fy = fy_features(Tier.CANARY, Envelope(premium=False, nvlink_full=True, hbm_full=True))
    assert "fy_canary" in fy and not [x for x in fy if x.startswith("fy_ok_")]


# An all-H100 fleet lends one node fy_ok_decode (premium.keep_decode_open): off here, grouping is the point.
_CLOSED = Params.model_validate({"premium": {"keep_decode_open": False}})


def test_grouping_100_identical_nodes_is_one_update():
    res = Runner(Fleet(100), _CLOSED).tick()
    updates = res.plan.of_kind("update")
    assert len(updates) == 1 and len(updates[0].nodes) == 100


def test_distinct_admin_features_make_distinct_groups():
    f = Fleet(0)
    for i in range(10):
        f.add(f"n{i}", admin_features=(f"rack{i % 2}",))
    assert len(Runner(f, _CLOSED).tick().plan.of_kind("update")) == 2


def test_reconfigure_wiping_features_is_repaired_next_tick():
    f = Fleet(3)
    r = Runner(f)
    r.tick()
    assert r.tick().plan.empty
    f.slurm_update("gpu001", available_features=("rack1", "ib"), active_features=("rack1", "ib"), weight=1)
    res = r.tick()
    (u,) = res.plan.of_kind("update")
    assert u.nodes == ("gpu001",) and "fy_tier_green" in u.features


def test_active_features_drift_alone_triggers_update():
    f = Fleet(1)
    r = Runner(f)
    r.tick()
    f.slurm_update("gpu000", active_features=("rack1",))
    assert r.tick().plan.of_kind("update")


def test_admin_drained_node_untouched():
    f = Fleet(2)
    f.drain_by_admin("gpu000", "bad fan")
    f.push("gpu000", 79, 1, 1_000_000.0)
    res = Runner(f).tick()
    touched = {n for a in res.plan.actions for n in getattr(a, "nodes", (getattr(a, "node", None),))}
    assert "gpu000" not in touched
    assert not res.nodes["gpu000"].managed
    assert "gpu001" in touched


def test_unknown_slurm_state_not_updated():
    f = Fleet(2)
    f.slurm_update("gpu000", states=frozenset({"UNKNOWN"}))
    f.slurm_update("gpu001", states=frozenset())
    assert Runner(f).tick().plan.empty
