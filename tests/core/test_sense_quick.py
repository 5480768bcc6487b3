"""Sense's carry (core/carry_sense.py; ``quick``: only the nodes that may have changed) senses what a full
pass does.

Two runs read the same stream of samples: one carries ``ControllerState.memo`` and the history sense hands
back (so it takes the fast path whenever every node is sampled at one time), the other is the rule
(``sense.sense``: every node) on a history stripped of every reuse hint (``NodeHistory.quiet``), so each
tick works through every GPU. Readings tuples are reused from tick to tick unless a step changes them, as
the simulator does.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_fleetyield.core.carry_sense import sense as carried
from slurm_fleetyield.core.model import FleetScrape, GpuReading, NodeSample, Observations, SlurmNode
from slurm_fleetyield.core.params import Params
from slurm_fleetyield.core.sense import Sensed, sense
from slurm_fleetyield.core.signals import SBE_VOL, channel_layout
from slurm_fleetyield.core.state import NodeHistory

LAYOUT = channel_layout((79, 13))
PARAMS = Params().sense
GPUS = 2


class _Stream:
    """Per node: its readings tuple (kept until a step changes it), counters, expected and Slurm counts."""

    def __init__(self, n: int) -> None:
        self.names = [f"n{i}" for i in range(n)]
        self.sbe = {(name, g): 0.0 for name in self.names for g in range(GPUS)}
        self.xid = {(name, g): 0.0 for name in self.names for g in range(GPUS)}
        self.hidden: set[tuple[str, int]] = set()
        self.expected = dict.fromkeys(self.names, GPUS)
        self.gres = dict.fromkeys(self.names, GPUS)
        self.readings: dict[str, tuple[GpuReading, ...]] = {}
        self.slurm: dict[str, SlurmNode] = {}

    def _gpus(self, name: str) -> tuple[GpuReading, ...]:
        r = self.readings.get(name)
        if r is None:
            r = self.readings[name] = tuple(
                GpuReading(
                    g,
                    f"GPU-{name}-{g}",
                    "H100",
                    fields={SBE_VOL: self.sbe[name, g]},
                    xid_totals={79: self.xid[name, g]} if self.xid[name, g] else {},
                )
                for g in range(GPUS)
                if (name, g) not in self.hidden
            )
        return r

    def step(self, kind: str, name: str) -> None:
        key = (name, 0)
        if kind == "bump":
            self.sbe[key] += 3.0
        elif kind == "xid":
            self.xid[key] += 1.0
        elif kind == "hide":
            self.hidden ^= {key}
        elif kind == "same":  # a new tuple of equal readings
            pass
        elif kind == "expected":
            self.expected[name] = GPUS + 1 if self.expected[name] == GPUS else GPUS
        elif kind == "gres":
            self.gres[name] = GPUS + 1 if self.gres[name] == GPUS else GPUS
            self.slurm.pop(name, None)
        if kind in ("bump", "xid", "hide", "same"):
            self.readings.pop(name, None)

    def observe(self, now: float, odd: dict[str, str], scrape: bool = False) -> Observations:
        samples: Any = {}
        for name in self.names:
            how = odd.get(name)
            if how == "absent":
                continue
            t = now - 400.0 if how == "stale" else now - 7.0 if how == "early" else now
            err = "refused" if how == "error" else None
            samples[name] = NodeSample(name, t, self._gpus(name), self.expected[name], err)
        if scrape and not odd and len(set(self.expected.values())) == 1:  # the simulator's form
            samples = FleetScrape(now, {n: self._gpus(n) for n in self.names}, self.expected[self.names[0]])
        slurm = {}
        for name in self.names:
            v = self.slurm.get(name)
            if v is None:
                v = self.slurm[name] = SlurmNode(name, frozenset({"IDLE"}), gpu_count=self.gres[name])
            slurm[name] = v
        return Observations(now, slurm, samples)


def _stripped(history: Any) -> dict[str, Any]:
    """The history without reuse hints (as a restored state has it)."""
    return {
        n: NodeHistory(h.last_time, h.times, h.gpus) if type(h) is NodeHistory else h
        for n, h in history.items()
    }


def _values(history: Any) -> dict[str, dict[str, Any]]:
    return {n: {u: h[u] for u in h} for n, h in history.items()}


_STEPS = st.lists(
    st.tuples(
        st.sampled_from((0.0, 60.0, 900.0, 900.0, 900.0, 3600.0)),  # 0: a second tick at the same time
        st.lists(
            st.tuples(
                st.sampled_from(("bump", "xid", "hide", "same", "expected", "gres")), st.integers(0, 4)
            ),
            max_size=3,
        ),
        st.dictionaries(
            st.integers(0, 4), st.sampled_from(("absent", "stale", "error", "early")), max_size=2
        ),
        st.booleans(),  # whether the odd samples apply (most ticks: every node fresh at one time)
        st.booleans(),  # whether a uniform scrape comes as a FleetScrape
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), steps=_STEPS)
def test_quick_path_senses_what_a_full_pass_does(n: int, steps: list[Any]) -> None:
    stream = _Stream(n)
    memo: dict[str, Any] = {}
    hist_a: Any = {}
    hist_b: Any = {}
    now = 10_000.0
    prev: Sensed | None = None
    for dt, changes, odd_idx, apply_odd, scrape in steps:
        now += dt
        for kind, i in changes:
            stream.step(kind, stream.names[i % n])
        odd = {stream.names[i % n]: how for i, how in odd_idx.items()} if apply_odd else {}
        obs = stream.observe(now, odd, scrape)
        a = carried(obs, hist_a, LAYOUT, LAYOUT, PARAMS, now, memo)
        b = sense(obs, _stripped(hist_b), LAYOUT, LAYOUT, PARAMS, now)
        assert dict(a.nodes) == dict(b.nodes)
        assert list(a.nodes) == list(b.nodes)
        assert _values(a.history) == _values(b.history)
        assert list(a.history) == list(b.history)
        assert a.flagged == b.flagged
        assert dict(a.times) == dict(b.times)
        if prev is not None and a.changed is not None:
            # every node outside ``changed`` is the very node it was, as old
            assert a.since is prev.nodes
            for name in set(a.nodes) - set(a.changed):
                assert a.nodes[name] is prev.nodes[name]
                assert a.stale_s(name) == prev.stale_s(name)
        hist_a, hist_b, prev = a.history, b.history, a


def test_quiet_fleet_keeps_its_nodes_and_tracks() -> None:
    """No step changes anything: after the first ticks every node is the very object it was, and the fast
    path finds nothing changed (the sample age does not move)."""
    stream = _Stream(4)
    memo: dict[str, Any] = {}
    history: Any = {}
    now = 0.0
    seen = []
    for _ in range(6):
        now += 900.0
        s = carried(stream.observe(now, {}, scrape=True), history, LAYOUT, LAYOUT, PARAMS, now, memo)
        seen.append(s)
        history = s.history
    last, before = seen[-1], seen[-2]
    assert last.changed == ()
    assert all(last.nodes[n] is before.nodes[n] for n in stream.names)
    assert all(last.history.tracks[n] is before.history.tracks[n] for n in stream.names)  # type: ignore[attr-defined]
    assert last.history.clocks["n0"] is last.history.clocks["n3"]  # type: ignore[attr-defined]
    assert last.stale_s("n0") == 0.0 and last.sample_time("n0") == now
    # one GPU's counter moves: that node alone is sensed again
    stream.step("bump", "n2")
    now += 900.0
    s = carried(stream.observe(now, {}), history, LAYOUT, LAYOUT, PARAMS, now, memo)
    assert s.changed == ("n2",)
    assert s.nodes["n2"].gpus[0].growth is not None
    # an XID on another node: sensed again and flagged for quarantine's scrape evidence
    history = s.history
    stream.step("xid", "n1")
    now += 900.0
    s = carried(stream.observe(now, {}), history, LAYOUT, LAYOUT, PARAMS, now, memo)
    assert "n1" in s.changed and s.flagged == ("n1",)
    assert s.nodes["n1"].gpus[0].new_xids == ((79, 1.0),)
    # every agent now expects one more GPU: each node is sensed again and flagged as missing one
    for name in stream.names:
        stream.step("expected", name)
    history = s.history
    now += 900.0
    obs = stream.observe(now, {}, scrape=True)
    assert type(obs.samples) is FleetScrape
    s = carried(obs, history, LAYOUT, LAYOUT, PARAMS, now, memo)
    assert s.changed == tuple(stream.names) and s.flagged == tuple(stream.names)
    assert all(s.nodes[n].missing_gpus == 1 for n in stream.names)
