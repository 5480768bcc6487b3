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
