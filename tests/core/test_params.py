import pytest
from pydantic import ValidationError

from slurm_fleetyield.core.params import (
    DEFAULT_QUARANTINE_XIDS,
    DEFAULT_RISK_ONLY_XIDS,
    GPU_FATAL_PER_DAY,
    Params,
    RiskParams,
)
from slurm_fleetyield.core.signals import SIGNAL_NAMES


def test_defaults_are_documented_and_derived_from_llama3():
    p = Params()
    assert p.sense.stale_after_s == 60
    assert p.risk.horizon_days == 7
    assert pytest.approx(256 / (54 * 16384)) == GPU_FATAL_PER_DAY
    assert p.risk.base_probability == pytest.approx(0.00202, rel=0.01)
    # the catalog's derivation (tests/test_xids.py keeps them equal); the nine drained before it still are
    assert p.quarantine.quarantine_xids == DEFAULT_QUARANTINE_XIDS
    assert {48, 64, 74, 79, 95, 109, 110, 119, 120} <= set(DEFAULT_QUARANTINE_XIDS)
    assert p.quarantine.risk_only_xids == DEFAULT_RISK_ONLY_XIDS
    assert {13, 31, 43, 63, 92, 94} <= set(DEFAULT_RISK_ONLY_XIDS)
    for group in (p.sense, p.risk, p.profile, p.price, p.quarantine):
        for name, f in type(group).model_fields.items():
            assert f.description, f"{type(group).__name__}.{name} has no description"


def test_unknown_signal_name_is_an_error_quoting_it():
    with pytest.raises(ValidationError, match="bogus_signal"):
        Params.model_validate({"risk": {"signals": ["sbe_rate", "bogus_signal"]}})


def test_thresholds_must_be_ordered_and_error_quotes_values():
    with pytest.raises(ValidationError, match=r"yellow_threshold=0\.6.*red_threshold=0\.5"):
        RiskParams(yellow_threshold=0.6, red_threshold=0.5)


def test_extra_keys_are_rejected():
    with pytest.raises(ValidationError, match="stale_afterr"):
        Params.model_validate({"sense": {"stale_afterr": 3}})


def test_xid_sets_must_be_disjoint():
    with pytest.raises(ValidationError, match=r"\[79\]"):
        Params.model_validate({"quarantine": {"risk_only_xids": [13, 79]}})


def test_steps_override_must_be_monotone():
    with pytest.raises(ValidationError, match="sbe_rate"):
        Params.model_validate({"risk": {"steps": {"sbe_rate": [[10, 1.0], [5, 2.0]]}}})
    ok = Params.model_validate({"risk": {"steps": {"temp_margin": [[10, 0.5], [0, 2.0]]}}})
    assert ok.risk.steps["temp_margin"][1] == (0, 2.0)


def test_bad_weight_and_tier_weight_rejected():
    with pytest.raises(ValidationError, match="-1"):
        Params.model_validate({"risk": {"weights": {"sbe_rate": -1}}})
    with pytest.raises(ValidationError, match="purple"):
        Params.model_validate({"price": {"tier_weights": {"purple": 5}}})


def test_resolution_must_fit_shortest_window():
    with pytest.raises(ValidationError, match="history_resolution_s=900"):
        Params.model_validate({"sense": {"trend_windows_s": [600, 3600], "history_resolution_s": 900}})


def test_signal_tuple_is_ordered_and_complete_by_default():
    assert Params().risk.signals == SIGNAL_NAMES
    assert len(set(SIGNAL_NAMES)) == len(SIGNAL_NAMES)
