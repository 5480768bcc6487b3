import math
import random

import pytest

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.model import Health
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.risk import Scorer, compile_signals, logit, signal_values


def test_quiet_gpu_has_base_probability_and_node_combines():
    r = Runner(Fleet(1))
    res = r.tick()
    nr = res.risks["gpu000"]
    base = Params().risk.base_probability
    assert all(g.probability == base for g in nr.gpus)
    assert nr.probability == pytest.approx(1 - (1 - base) ** 8)
    assert nr.health is Health.OK


def test_remap_pending_makes_gpu_warn_with_explained_contribution():
    f = Fleet(1)
    f.set("gpu000", 4, s.REMAP_PENDING, 1)
    res = Runner(f).tick()
    g = res.risks["gpu000"].gpus[4]
    assert [c.signal for c in g.contributions] == ["remap_pending"]
    assert g.probability == pytest.approx(1 / (1 + math.exp(-(logit(Params().risk.base_probability) + 3.5))))
    assert g.health is Health.WARN
    assert res.risks["gpu000"].health is Health.WARN


def test_superbench_boundary_for_correctable_rows():
    f = Fleet(2)
    f.set("gpu000", 0, s.ROWS_CORR, 10)
    f.set("gpu001", 0, s.ROWS_CORR, 11)
    res = Runner(f).tick()
    assert res.risks["gpu000"].gpus[0].contributions[0].weight == 1.0
    assert res.risks["gpu001"].gpus[0].contributions[0].weight == 3.5


def test_remap_failure_is_red():
    f = Fleet(1)
    f.set("gpu000", 1, s.REMAP_FAILURE, 1)
    res = Runner(f).tick()
    assert res.risks["gpu000"].health is Health.BAD
    assert res.risks["gpu000"].probability >= Params().risk.red_threshold


def test_disabled_signal_and_zero_weight_do_not_contribute():
    f = Fleet(1)
    f.set("gpu000", 0, s.REMAP_PENDING, 1)
    off = Params.model_validate({"risk": {"signals": [n for n in s.SIGNAL_NAMES if n != "remap_pending"]}})
    muted = Params.model_validate({"risk": {"weights": {"remap_pending": 0}}})
    for p in (off, muted):
        assert Runner(Fleet(1), p).tick().risks["gpu000"].gpus[0].contributions == ()
        assert Runner(f, p).tick().risks["gpu000"].gpus[0].contributions == ()


def test_nonfatal_xid_is_risk_only():
    f = Fleet(1)
    r = Runner(f)
    r.tick()
    f.xid("gpu000", 5, 13, 3)
    res = r.tick()
    g = res.risks["gpu000"].gpus[5]
    assert [(c.signal, c.value) for c in g.contributions] == [("xid_nonfatal", 3.0)]
    assert res.plan.of_kind("drain") == ()


def test_repeat_offender_raises_risk_of_that_gpu_more_than_siblings():
    f = Fleet(4)
    r = Runner(f)
    r.tick()
    f.push("gpu000", 79, 3, r.now)
    r.tick()
    f.drain_by_admin("gpu000", "")  # stays drained by us; then the admin resumes it
    f.slurm_update("gpu000", states=frozenset({"IDLE"}), reason="")
    res = r.tick()
    gpus = res.risks["gpu000"].gpus
    assert {c.signal for c in gpus[3].contributions} >= {"gpu_repeat_offender"}
    assert {c.signal for c in gpus[0].contributions} == {"node_repeat_offender"}
    assert gpus[3].probability > gpus[0].probability


def test_fast_scorer_agrees_with_obvious_path():
    rng = random.Random(3)
    f = Fleet(20)
    r = Runner(f)
    r.tick()
    for _ in range(5):
        for n in f.nodes:
            for gi in range(8):
                for field in (s.SBE_VOL, s.NVLINK_CRC_FLIT, s.PCIE_REPLAY, s.THERMAL_VIOLATION, s.ROWS_CORR):
                    if rng.random() < 0.2:
                        f.bump(n, gi, field, rng.choice([1, 5, 50, 2e8]))
                if rng.random() < 0.1:
                    f.set(n, gi, s.GPU_TEMP, rng.uniform(70, 95))
                if rng.random() < 0.1:
                    f.set(n, gi, s.THROTTLE_REASONS, rng.choice([0x4, 0x8, 0x48, 0xC8]))
                if rng.random() < 0.05:
                    f.xid(n, gi, rng.choice([13, 43, 92]))
        r.tick()
    res = r.last
    compiled = compile_signals(r.params, res.sensed.layout)
    scorer = Scorer(compiled, r.params, res.sensed.layout)
    fired = 0
    for node in res.sensed.nodes.values():
        for g in node.gpus:
            _z, contribs = scorer.score(g, 0, 0)
            slow = {name: (v, c) for name, v, c in signal_values(g, compiled, 0, 0) if c}
            fast = {c.signal: (c.value, c.weight) for c in contribs}
            assert fast.keys() == slow.keys()
            for k, (v, c) in fast.items():
                assert v == pytest.approx(slow[k][0]) and c == slow[k][1]
            fired += len(contribs)
    assert fired > 50


def test_one_fault_seen_through_several_reports_is_one_event_of_history():
    """An XID 79 reaches the fatal history three times (pushed XID, pushed 'GPU missing' of that GPU, the
    scrape's unnamed 'GPU missing'): one failure, not a repeat offender. A second failure of the same GPU
    later than the dedup window counts again."""
    from slurm_fleetyield.core.model import Tier
    from slurm_fleetyield.core.params import Params as P
    from slurm_fleetyield.core.risk import fatal_uuids
    from slurm_fleetyield.core.state import ControllerState, NodeMemory

    def uuids(history: tuple[tuple[float, str], ...], now: float = 10_000.0) -> list[str]:
        st = ControllerState(nodes={"n": NodeMemory(Tier.GREEN, 0.0, "", fatal_history=history)})
        return fatal_uuids(st, "n", P(), now)

    one_fault = ((1000.0, "GPU-a"), (1000.2, "GPU-a"), (1001.5, ""))
    assert uuids(one_fault) == ["GPU-a"]
    two_gpus = (*one_fault, (1002.0, "GPU-b"), (1002.1, "GPU-b"), (1003.0, ""))
    assert uuids(two_gpus) == ["GPU-a", "GPU-b"]
    window = P().learn.lemon_dedup_s
    again = (*one_fault, (1000.0 + window + 1, "GPU-a"))
    assert uuids(again, now=1000.0 + window + 10) == ["GPU-a", "GPU-a"]
    assert uuids(((1000.0, ""), (1000.0 + window + 1, ""))) == ["", ""]  # node-wide events apart
    assert uuids(((5.0, "GPU-a"),), now=5.0 + P().risk.fatal_history_days * 86_400.0 + 1) == []
