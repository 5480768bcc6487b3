import json

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.explain import explain, explain_dict


def test_explain_shows_numbers_for_every_gpu_and_signal():
    f = Fleet(2)
    r = Runner(f)
    r.tick()
    f.set("gpu000", 4, s.REMAP_PENDING, 1)
    f.bump("gpu000", 1, s.SBE_VOL, 30)
    res = r.tick()
    text = explain("gpu000", res)
    assert "tier yellow" in text
    assert "remap_pending" in text and "+3.50" in text
    assert (
        "sbe_rate" in text and "value        180" in text and "+3.00" in text
    )  # 30 in 600 s = 180/h >= 100/h
    assert text.count("gpu ") >= 8
    assert f"{res.risks['gpu000'].probability:.4f}" in text
    d = explain_dict("gpu000", res)
    json.dumps(d, allow_nan=False)
    assert len(d["gpus"]) == 8 and len(d["gpus"][0]["signals"]) == len(s.SIGNAL_NAMES)


def test_explain_unknown_node_json_safe():
    f = Fleet(1)
    f.nodes["gpu000"].sampled = False
    res = Runner(f).tick()
    d = explain_dict("gpu000", res)
    assert d["risk"] is None and d["tier"] == "unknown"
    json.dumps(d, allow_nan=False)
    assert "risk unknown" in explain("gpu000", res)


def _stake_fleet(state: str) -> Fleet:
    from slurm_fleetyield.core.model import JobView, WorkloadClass

    f = Fleet(4)
    f.set("gpu000", 2, s.REMAP_FAILURE, 1)  # red: p ~0.9 within the horizon, above the 1024-GPU stake's
    f.set("gpu000", 3, s.REMAP_FAILURE, 1)  # break-even (~0.86)
    nodes = ("gpu003",) if state == "RUNNING" else ()
    f.jobs = [JobView(17, state, nodes, True, WorkloadClass.PRETRAIN, 1000)]
    return f


def test_explain_shows_the_stake_arithmetic_of_a_withheld_class():
    from slurm_fleetyield.core import stake

    res = Runner(_stake_fleet("RUNNING")).tick()  # running: nothing waits, the breaker does not hold
    d = explain_dict("gpu000", res)
    json.dumps(d, allow_nan=False)
    st = d["stake"]
    assert st["weighed"] and st["gpus"] == 8
    rows = {c["class"]: c for c in st["classes"]}
    train = rows["pretrain"]
    assert train["source"] == {"job_id": 17, "gpus": 1000, "state": "RUNNING"} and train["stake_gpus"] == 1024
    assert train["lost_s"] == 3600 / 2 + 600
    (fig,) = [x for x in stake.figures(res.withheld.stakes, res.nodes["gpu000"].risk, 8, 7 * 86_400.0)
              if x.stake.workload == "pretrain"]  # fmt: skip
    assert train["loss_gpu_h_per_h"] == fig.loss > train["cost_gpu_h_per_h"] == 8
    assert train["decision"] == "withheld" and not train["carries"]
    assert rows["batch"]["decision"] == "carried" and rows["batch"]["carries"]
    text = explain("gpu000", res)
    assert "pretrain fy_ok_train: stake 1024 GPU(s) (largest pretrain job 17: 1000 GPUs, RUNNING" in text
    assert f"expected loss {fig.loss:.4g} vs cost 8 -> withheld" in text


def test_explain_says_when_the_capacity_breaker_kept_a_class():
    res = Runner(_stake_fleet("PENDING")).tick()  # pending on 4 nodes: withholding one passes 20%
    assert "pretrain" in res.withheld.tripped
    train = next(c for c in explain_dict("gpu000", res)["stake"]["classes"] if c["class"] == "pretrain")
    assert train["decision"] == "carried_by_breaker" and train["carries"]
    assert "capacity breaker (20% of 32 in-service GPUs, leaving room for the largest pending" in train["why"]


def test_explain_of_a_node_out_of_service_says_the_stake_rule_does_not_weigh_it():
    f = Fleet(2)
    f.push("gpu001", 79, 0, 1_000_000.0)
    res = Runner(f).tick()
    st = explain_dict("gpu001", res)["stake"]
    assert st == {"weighed": False, "why": st["why"]} and "tier quarantined" in st["why"]
    assert "stake: not weighed (tier quarantined" in explain("gpu001", res)
