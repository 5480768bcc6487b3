"""The stake rule (core/stake.py): class features follow what the work that would land on a node stands to
lose, the capacity breaker, and drain proposals that pay."""

from __future__ import annotations

import math
from dataclasses import replace

from core.builders import H100, Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core import stake
from slurm_fleetyield.core.model import JobView, Tier, WorkloadClass
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.price import Priced, PricedNode

HORIZON = Params().risk.horizon_days * 86_400.0


def _priced(risks: dict[str, float], tier: Tier = Tier.YELLOW) -> Priced:
    return Priced({n: PricedNode(n, tier, 100, "", (), True, risk=p) for n, p in risks.items()})


def _fleet(n: int) -> Fleet:
    f = Fleet(0)
    for i in range(n):
        f.add(f"n{i}", H100)
    return f


def test_a_yellow_node_carries_every_class_feature_when_nothing_much_is_at_stake():
    f = Fleet(2)
    f.set("gpu000", 0, s.REMAP_PENDING, 1)
    d = Runner(f).tick().nodes["gpu000"]
    assert d.tier is Tier.YELLOW
    assert {"fy_ok_batch", "fy_ok_train"} <= set(d.fy_features)


def test_stakes_weigh_the_whole_gang_and_the_lost_progress():
    f = _fleet(1)
    f.jobs = [
        JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 48),
        JobView(2, "RUNNING", ("n0",), False, WorkloadClass.DECODE, 2),
    ]
    st = {x.workload: x for x in stake.stakes(f.observe(0.0), Params())}
    assert st["pretrain"].gpus == 64  # 48 rounded up to a power of two: the answer does not flicker
    assert st["pretrain"].lost_s == 3600 / 2 + 600  # half an hourly checkpoint + the restart
    assert st["decode"].gpus == 2 and st["decode"].lost_s == 120 / 2 + 600  # a service: in flight + restart
    assert st["batch"].gpus == 1  # nothing of the class around: one GPU


def test_a_node_about_to_fail_is_withheld_from_a_large_gang_but_not_from_small_work():
    f = _fleet(20)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 1024)]
    obs = f.observe(0.0)
    p = Params()
    gang = next(x for x in stake.stakes(obs, p) if x.workload == "pretrain")
    # the hazard at which the gang loses as much as the node's 8 GPUs would do
    even = 8 / (gang.gpus * gang.lost_s)
    below, above = -math.expm1(-0.5 * even * HORIZON), -math.expm1(-2 * even * HORIZON)
    rest = {f"n{i}": 0.01 for i in range(2, 20)}  # the breaker's cap is a share of these too
    w = stake.withhold(obs, _priced({"n0": below, "n1": above, **rest}), p, 0.0)
    assert w.nodes == {"n1": frozenset({"fy_ok_train"})}
    assert not w.tripped


def test_the_breaker_keeps_the_withheld_share_under_the_cap_while_the_class_waits():
    f = _fleet(10)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 1024)]
    obs = f.observe(0.0)
    risky = {f"n{i}": 0.9 + i / 100 for i in range(5)}  # 5 of 10 nodes would be withheld
    p = Params(stake={"withhold_cap_fraction": 0.2})
    w = stake.withhold(obs, _priced({**risky, **{f"n{i}": 0.01 for i in range(5, 10)}}), p, 0.0)
    assert w.tripped == ("pretrain",)
    assert sorted(w.nodes) == ["n3", "n4"]  # the two riskiest stay withheld: 16 of 80 GPUs
    assert [e.kind for e in w.events] == ["stake_breaker"]
    # no pending work of the class: nothing waits, the breaker does not hold
    f.jobs = [replace(f.jobs[0], state="RUNNING", nodes=("n9",))]
    w2 = stake.withhold(f.observe(0.0), _priced(risky), p, 0.0)
    assert len(w2.nodes) == 5 and not w2.tripped


def test_the_breaker_leaves_room_for_the_largest_pending_job_of_the_class():
    """A gang over most of the fleet cannot start on fewer nodes: withholding its feature from more than the
    nodes it leaves idles it whole. 20 nodes, a pending gang of 18: at most 2 nodes may withhold it (the two
    riskiest), though the 20% cap alone would allow 4."""
    f = _fleet(20)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 18 * 8)]
    risky = {f"n{i}": 0.9 + i / 100 for i in range(3)}
    # a gang that cannot checkpoint: 256 GPUs x half a day at stake, withheld from the risky nodes
    p = Params(stake={"withhold_cap_fraction": 0.2, "classes": {"pretrain": {"checkpoint_s": 0.0}}})
    w = stake.withhold(f.observe(0.0), _priced({**risky, **{f"n{i}": 0.01 for i in range(3, 20)}}), p, 0.0)
    assert sorted(w.nodes) == ["n1", "n2"] and w.tripped == ("pretrain",)
    (e,) = w.events
    assert e.data["largest_pending_gpus"] == 144 and e.data["withheld_gpus"] == 16
    # the same fleet with a gang of 16 nodes: room for all three
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 16 * 8)]
    w = stake.withhold(f.observe(0.0), _priced({**risky, **{f"n{i}": 0.01 for i in range(3, 20)}}), p, 0.0)
    assert sorted(w.nodes) == ["n0", "n1", "n2"] and not w.tripped


def test_a_fleet_wide_rise_of_the_learned_base_rate_withholds_from_no_node():
    """Every node at the risen base (a learned multiplier of 14) is where the work would go anyway: nothing
    is withheld. Taken against the unlearned base the same risks withhold the gang's feature from every
    node; a node above the risen base still loses it."""
    f = _fleet(20)
    f.jobs = [JobView(1, "RUNNING", ("n0",), True, WorkloadClass.PRETRAIN, 16_384)]
    obs = f.observe(0.0)
    p = Params()
    risen = stake.base_risk(8, 14.0, p)
    assert 0.18 < risen < 0.25
    flat = _priced({f"n{i}": risen for i in range(20)})
    assert stake.withhold(obs, flat, p, 0.0, multiplier=14.0).nodes == {}
    assert len(stake.withhold(obs, flat, p, 0.0, multiplier=1.0).nodes) == 20  # absolute: all of them
    bad = _priced({**{f"n{i}": risen for i in range(19)}, "n19": 0.6})
    assert set(stake.withhold(obs, bad, p, 0.0, multiplier=14.0).nodes) == {"n19"}


def test_out_of_service_nodes_and_the_old_rule_are_not_the_stages():
    f = _fleet(2)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 1024)]
    obs = f.observe(0.0)
    assert stake.withhold(obs, _priced({"n0": 0.99}, Tier.QUARANTINED), Params(), 0.0).nodes == {}
    assert stake.withhold(obs, _priced({"n0": 0.99}), Params(stake={"enabled": False}), 0.0).nodes == {}
    assert stake.withhold(obs, _priced({"n0": math.nan}), Params(), 0.0).nodes == {}


def _pays(node: str, prob: float, f: Fleet, p: Params) -> tuple[bool, str]:
    obs = f.observe(0.0)
    return stake.drain_pays(node, prob, obs, p, stake.withhold(obs, Priced({}), p, 0.0))


def test_a_drain_pays_only_when_the_averted_loss_exceeds_the_capacity_drained():
    f = _fleet(1)
    p = Params()
    assert not _pays("n0", 0.6, f, p)[0]  # nothing at stake: downtime either way
    assert not _pays("n0", 0.999, f, p)[0]
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 1024)]  # a gang would land there next
    pays, why = _pays("n0", 0.9, f, p)
    assert pays and "averted" in why and "(p 0.50)" in why  # weighed at the precision telemetry can have
    assert not _pays("n0", 0.2, f, p)[0]  # 0.2 x (683 + 192) GPU-h averted < a day's swap
    # a 256-GPU gang: 171 GPU-h at stake pays a day's swap at p 0.9, not at the precision bound (0.5)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 256)]
    assert not _pays("n0", 0.9, f, p)[0]
    trusting = Params(stake={"drain_precision": 1.0})
    assert _pays("n0", 0.9, f, trusting)[0] and not _pays("n0", 0.5, f, trusting)[0]
    # a job that cannot be requeued runs to its end on the node: the drain averts nothing for it
    f.jobs = [JobView(1, "RUNNING", ("n0", "n9"), False, WorkloadClass.DECODE, 64)]
    assert not _pays("n0", 0.9, f, p)[0]


def test_a_red_node_with_nothing_at_stake_gets_no_proposal():
    f = Fleet(1)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)
    res = Runner(f).tick()
    assert res.nodes["gpu000"].tier is Tier.RED
    assert "drain_proposal" not in [e.kind for e in res.events]


def test_a_proposal_that_pays_logs_the_arithmetic():
    f = Fleet(1)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 1024)]  # a big gang would land there
    res = Runner(f).tick()
    ev = [e for e in res.events if e.kind == "drain_proposal"]
    assert len(ev) == 1 and ev[0].data["stake"].startswith("averted ")


def test_the_proposal_event_carries_drain_pays_figures():
    f = Fleet(1)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)
    f.jobs = [JobView(1, "PENDING", (), True, WorkloadClass.PRETRAIN, 1024)]
    res = Runner(f).tick()
    (ev,) = [e for e in res.events if e.kind == "drain_proposal"]
    fig = ev.data["stake_figures"]
    assert fig["pays"] is True and fig["averted_gpu_h"] > fig["cost_gpu_h"]
    assert fig["next_gpu_h"] == 1024 * (3600 / 2 + 600) / 3600  # the gang that would land there next
    assert fig["averted_gpu_h"] == fig["p"] * (fig["moved_gpu_h"] + fig["next_gpu_h"] + fig["repair_gpu_h"])
    assert (
        ev.data["stake"] == f"averted {fig['averted_gpu_h']:.1f} GPU-h (p {fig['p']:.2f}) vs cost 192.0 GPU-h"
    )


def test_stakes_say_which_job_they_come_from():
    f = _fleet(2)
    f.jobs = [
        JobView(5, "RUNNING", ("n0",), True, WorkloadClass.PRETRAIN, 16),
        JobView(9, "PENDING", (), True, WorkloadClass.PRETRAIN, 48),
        JobView(11, "PENDING", (), True, WorkloadClass.PRETRAIN, 48),  # a tie keeps the first
    ]
    st = {x.workload: x for x in stake.stakes(f.observe(0.0), Params())}
    assert (st["pretrain"].job_id, st["pretrain"].job_gpus, st["pretrain"].job_state) == (9, 48, "PENDING")
    assert st["batch"].job_id is None


def test_withhold_decides_by_the_figures_explain_shows():
    # one function (stake.figures) decides and explains: over a spread of risks, the nodes withheld are
    # exactly those whose figures say the loss exceeds the cost
    f = _fleet(40)
    f.jobs = [JobView(1, "RUNNING", ("n39",), True, WorkloadClass.PRETRAIN, 512)]  # running: no breaker
    obs = f.observe(0.0)
    p = Params()
    risks = {f"n{i}": 0.001 * 1.25**i for i in range(40)}
    w = stake.withhold(obs, _priced(risks), p, 0.0)
    expected = {}
    for n, r in risks.items():
        drop = frozenset(
            stake.CLASS_FEATURE[x.stake.workload]
            for x in stake.figures(w.stakes, r, 8, HORIZON)
            if x.withhold
        )
        if drop:
            expected[n] = drop
    assert w.nodes == expected and 0 < len(expected) < 40
    assert w.gpus == dict.fromkeys(risks, 8) and w.service_gpus == 320
