"""The simulator's event mode against its plain mode (``SimConfig.tick_mode``): generated small fleets, fault
plans and workloads run both ways give, at every tick that ran in both, the same plan, decisions, risks and
next state, and the same report (the metrics dict). Event mode skips a grid tick only before the last tick's
``wake_at`` with nothing the core reads changed (runner ``_skippable``), and moves the trend ring then
(``core.loop.resample``). ``FY_WAKE_EXAMPLES=N`` runs N generated fleets instead of 20."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_fleetyield.core import wake
from slurm_fleetyield.sim import runner


def _both(cfg: runner.SimConfig, policy: str = "fleetyield") -> tuple[dict[str, Any], ...]:
    inputs = runner.build_inputs(cfg)
    out = []
    for mode in ("plain", "event"):
        sim = runner.Simulation(replace(cfg, tick_mode=mode), policy, inputs)
        sim.tick_log = []
        metrics = sim.run()
        out.append({"metrics": metrics, "log": sim.tick_log, "skipped": sim.ticks_skipped})
    return tuple(out)


def _differences(plain: dict[str, Any], event: dict[str, Any]) -> list[str]:
    ran: dict[tuple[float, str], list[Any]] = {}
    for t, why, r in plain["log"]:
        ran.setdefault((t, why), []).append(r)
    seen: dict[tuple[float, str], int] = {}
    out = []
    for t, why, r in event["log"]:
        k = seen.get((t, why), 0)
        seen[(t, why)] = k + 1
        p = ran[(t, why)][k]
        for what, a, b in (
            ("plan", p.plan, r.plan),
            ("decisions", dict(p.nodes), dict(r.nodes)),
            ("risks", dict(p.risks), dict(r.risks)),
            ("state", p.state, r.state),
        ):
            if a != b:
                out.append(f"{what} at t={t} ({why})")
    if plain["metrics"] != event["metrics"]:
        out.append("metrics")
    return out


# FY_WAKE_EXAMPLES: a longer sweep by hand (the report cites one)
@settings(
    max_examples=int(os.environ.get("FY_WAKE_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    nodes=st.integers(8, 20),  # the synthetic workload has 8-node gangs
    days=st.sampled_from((1.0, 2.0, 3.0)),
    seed=st.integers(0, 10_000),
    load=st.floats(0.1, 0.9),
    node_rate=st.sampled_from((3.79, 100.0, 400.0)),
    precursor_share=st.floats(0.0, 0.8),
    lead_h=st.floats(2.0, 24.0),
    interval=st.sampled_from((900.0, 1800.0)),
    policy=st.sampled_from(("fleetyield", "fy_no_drain", "fy_no_spares")),
)
def test_event_mode_gives_the_plain_plans_and_report(
    nodes: int,
    days: float,
    seed: int,
    load: float,
    node_rate: float,
    precursor_share: float,
    lead_h: float,
    interval: float,
    policy: str,
) -> None:
    cfg = runner.make_config(
        nodes=nodes,
        days=days,
        seed=seed,
        workload="synthetic",
        load=load,
        node_rate_per_1000_node_days=node_rate,
        precursor_share=precursor_share,
        lead_h=lead_h,
        control_interval_s=interval,
    )
    plain, event = _both(cfg, policy)
    assert plain["skipped"] == 0
    assert len(event["log"]) + event["skipped"] == len(plain["log"])
    assert _differences(plain, event) == []


QUIET = dict(nodes=8, days=2.0, seed=3, workload="synthetic", load=0.15, node_rate_per_1000_node_days=3.79)


def test_event_mode_skips_ticks_on_a_quiet_fleet() -> None:
    """Not vacuous: on a lightly loaded fleet most grid ticks are skipped, and the runs still agree."""
    plain, event = _both(runner.make_config(**QUIET))
    assert event["skipped"] > len(plain["log"]) // 4
    assert _differences(plain, event) == []


def test_skipping_past_the_wake_time_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison has teeth: with ``wake_at`` ignored (never due) and no ring moved on a skip, a
    fault-heavy fleet's event run departs from its plain run."""
    monkeypatch.setattr(wake, "wake_at", lambda state, params, now: math.inf)
    monkeypatch.setattr(runner, "resample", lambda state, obs, params, now: state)
    cfg = runner.make_config(
        nodes=12,
        days=3.0,
        seed=1,
        workload="synthetic",
        node_rate_per_1000_node_days=400.0,
        precursor_share=0.5,
        lead_h=6.0,
    )
    plain, event = _both(cfg)
    assert event["skipped"] > 0
    assert _differences(plain, event) != []


def test_tick_mode_is_checked_and_kept_out_of_default_reports() -> None:
    """Event mode is the default; its reports are written as before the option (no ``tick_mode``)."""
    with pytest.raises(ValueError, match="tick_mode"):
        runner.make_config(tick_mode="sometimes")
    assert runner.make_config().tick_mode == "event"
    assert "tick_mode" not in runner.make_config().to_dict()
    assert runner.make_config(tick_mode="plain").to_dict()["tick_mode"] == "plain"
