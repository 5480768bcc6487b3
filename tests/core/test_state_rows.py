"""core/state_rows.py: the state as per-node documents plus fleet parts, written as a diff.

Round trip: whatever sequence of states is encoded (each as the diff to the previous accepted one) and
applied to a table, decoding the table gives the last state back (``ControllerState.__eq__``)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from core.builders import Fleet, Runner
from slurm_fleetyield.core import signals as s
from slurm_fleetyield.core.lifecycle import Attempt, Cause, LifecycleMemory, Remediation, Stage
from slurm_fleetyield.core.loop import tick
from slurm_fleetyield.core.model import FatalEvent, JobOutcome, JobView, Tier, WorkloadClass
from slurm_fleetyield.core.state import (
    ControllerState,
    Denial,
    GpuHistory,
    GpuTrack,
    LearnMemory,
    NodeHistory,
    NodeMemory,
    OpenProposal,
    Prediction,
    PremiumMemory,
    SettleMemory,
)
from slurm_fleetyield.core.state_rows import StateEncoder, StateRows, decode


class Table:
    """What a store holds: fleet parts and node documents, changed only by applying ``StateRows``."""

    def __init__(self) -> None:
        self.parts: dict[str, str] = {}
        self.nodes: dict[str, str] = {}

    def apply(self, rows: StateRows) -> None:
        if rows.full:
            self.parts.clear()
            self.nodes.clear()
        self.parts.update(rows.parts)
        for n in rows.deletes:
            del self.nodes[n]
        self.nodes.update(rows.nodes)
        assert len(self.nodes) == rows.node_count

    def load(self) -> ControllerState:
        return decode(self.parts, list(self.nodes.items()))


# ---- strategies -------------------------------------------------------------------------------------------

NAMES = ("a", "b", "c", "d", "e", "f")
LAYOUT = ("c0", "c1")
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
times_ = st.lists(finite, min_size=1, max_size=4, unique=True).map(lambda v: tuple(sorted(v)))
counters = st.tuples(*[st.one_of(st.none(), finite)] * len(LAYOUT))
opt_f = st.one_of(st.none(), finite)
opt_i = st.one_of(st.none(), st.integers(-5, 5))
text = st.text(max_size=6)

memories = st.builds(
    NodeMemory,
    st.sampled_from(Tier),
    finite,
    text,
    st.booleans(),
    st.lists(st.tuples(finite, text), max_size=2).map(tuple),
    opt_i,
    opt_i,
    st.lists(text, max_size=2).map(tuple),
    opt_i,
)


@st.composite
def gpu_histories(draw):  # type: ignore[no-untyped-def]
    t = draw(st.lists(finite, max_size=3, unique=True).map(lambda v: tuple(sorted(v))))
    return GpuHistory(draw(finite), draw(counters), draw(counters), t, tuple(draw(counters) for _ in t))


@st.composite
def tracks(draw, ring):  # type: ignore[no-untyped-def]
    raw = draw(counters)
    adj = draw(st.one_of(st.just(raw), counters))
    raw += draw(st.one_of(st.just(()), st.tuples(opt_f)))  # a quarantine XID's total: raw only, not in adj
    first = draw(st.sampled_from(ring))
    later = draw(st.lists(st.sampled_from(ring), max_size=2, unique=True))
    steps = [(first, draw(st.one_of(st.just(adj), counters)))]
    for t in sorted(x for x in later if x > first):
        steps.append((t, draw(st.one_of(st.just(adj), counters))))
    return GpuTrack(raw, adj, tuple(t for t, _ in steps), tuple(p for _, p in steps))


@st.composite
def histories(draw, rings):  # type: ignore[no-untyped-def]
    uuids = draw(st.lists(st.sampled_from(("GPU-0", "GPU-1", "GPU-2")), min_size=1, max_size=3, unique=True))
    if draw(st.booleans()):
        return {u: draw(gpu_histories()) for u in uuids}
    ring = draw(st.sampled_from(rings))
    gpus = {u: draw(st.one_of(tracks(ring), gpu_histories())) for u in uuids}
    return NodeHistory(draw(st.sampled_from((ring[-1], ring[-1] + 1.0))), ring, gpus)


@st.composite
def lifecycles(draw, name):  # type: ignore[no-untyped-def]
    cause = draw(
        st.one_of(st.none(), st.builds(Cause, st.sampled_from(("xid", "incident")), opt_i, opt_i, text))
    )
    attempts = draw(
        st.lists(st.builds(Attempt, st.sampled_from(Remediation), finite, finite, text), max_size=2).map(
            tuple
        )
    )
    return LifecycleMemory(
        name, draw(st.sampled_from(Stage)), draw(finite), cause, attempts, draw(text), 0, (), draw(opt_f)
    )


@st.composite
def states(draw):  # type: ignore[no-untyped-def]
    rings = draw(st.lists(times_, min_size=1, max_size=2))

    def some(strategy_of):  # type: ignore[no-untyped-def]
        names = draw(st.lists(st.sampled_from(NAMES), max_size=len(NAMES), unique=True))
        return {n: draw(strategy_of(n)) for n in names}

    preds = some(
        lambda n: st.builds(
            Prediction,
            st.just(n),
            finite,
            finite,
            finite,
            st.lists(st.tuples(text, finite), max_size=2).map(tuple),
            st.lists(st.tuples(st.integers(0, 7), text), max_size=2).map(tuple),
        )
    )
    return ControllerState(
        nodes=some(lambda n: memories),
        history=some(lambda n: histories(rings)),
        layout=LAYOUT,
        drain_times=tuple(draw(st.lists(finite, max_size=2))),
        processed_events=tuple(draw(st.lists(text, max_size=3))),
        held_fatal=tuple(
            draw(
                st.lists(
                    st.builds(
                        FatalEvent,
                        text,
                        st.sampled_from(NAMES),
                        finite,
                        st.sampled_from(("xid", "gpu_missing", "alert")),
                        st.none() | st.integers(0, 7),
                        st.none() | text,
                        st.none() | st.integers(1, 200),
                        text,
                        st.sampled_from(("push", "scrape")),
                    ),
                    max_size=2,
                )
            )
        ),
        last_tick=draw(opt_f),
        lifecycle=some(lambda n: lifecycles(n)),
        lifecycle_drained=frozenset(draw(st.lists(st.sampled_from(NAMES), max_size=2))),
        proposals=some(
            lambda n: st.builds(
                OpenProposal, text, st.just(n), finite, finite, finite, st.just((1, 2)), opt_f
            )
        ),
        denials=some(lambda n: st.builds(Denial, text, finite, finite)),
        settle=SettleMemory(tuple(draw(st.lists(st.integers(0, 99), max_size=3))), ((1.0, None),)),
        learn=LearnMemory(
            preds, draw(opt_f), (1, 2), (0.5, 0.25), (1.0, 0.0), draw(finite), 3, {"base": 1.0}
        ),
        premium=PremiumMemory(("a",), draw(opt_f), None, 2, None, ((7, 1.0),)),
    )


@settings(max_examples=100, deadline=None)
@given(
    st.lists(states(), min_size=1, max_size=4),
    st.lists(st.sampled_from(("keep", "forget", "seed")), max_size=4),
)
def test_any_sequence_of_states_round_trips_through_diffs(seq, moves):
    enc, table = StateEncoder(), Table()
    for i, state in enumerate(seq):
        rows = enc.encode(state)
        json.loads(json.dumps([rows.parts, rows.nodes]))  # plain JSON text all through
        table.apply(rows)
        enc.accept(rows)
        back = table.load()
        assert back == state
        assert back.to_dict() == state.to_dict()
        move = moves[i] if i < len(moves) else "keep"
        if move == "forget":
            enc.forget()
        elif move == "seed":  # a restart: the encoder knows what it loaded
            enc = StateEncoder()
            enc.seed(back)


@settings(max_examples=60, deadline=None)
@given(states())
def test_an_unchanged_state_writes_no_node(state):
    enc = StateEncoder()
    enc.accept(enc.encode(state))
    again = enc.encode(state)
    assert again.nodes == () and again.deletes == () and not again.full
    # and a copy equal by value (new objects) is no change either
    copy = decode(dict(enc.encode(state, full=True).parts), enc.encode(state, full=True).nodes)
    assert enc.encode(copy).nodes == ()


def test_real_ticks_round_trip_and_write_only_changed_nodes():
    """A fleet through the real core: faults, a quarantine, a proposal, jobs, predictions. Every tick's
    diff, applied, decodes to the tick's state; once settled, an unchanged fleet writes no node."""
    f = Fleet(40)
    r = Runner(f)
    enc, table = StateEncoder(), Table()
    written = []

    def step(state: ControllerState) -> None:
        rows = enc.encode(state)
        table.apply(rows)
        enc.accept(rows)
        written.append(len(rows.nodes))
        assert table.load() == state

    r.tick()
    step(r.state)
    f.bump("gpu001", 2, s.SBE_VOL, 7)
    f.set("gpu005", 3, s.REMAP_PENDING, 1)
    f.set("gpu005", 3, s.ROWS_CORR, 14)
    f.push("gpu003", 79, 3, r.now)
    f.jobs = [JobView(7, "PENDING", (), True, WorkloadClass.PRETRAIN, 8)]
    for _ in range(3):
        r.tick()
        step(r.state)
    obs = replace(
        f.observe(r.now + 30),
        outcomes=(JobOutcome(5, ("gpu002",), 8, WorkloadClass.BATCH, r.now - 100, r.now, "COMPLETED"),),
    )
    st_ = tick(r.state, obs, r.params, r.now + 30, random.Random(1)).state
    assert st_.lifecycle and st_.settle.settled and st_.learn.predictions
    step(st_)
    for _ in range(5):
        r.tick()
        step(r.state)
    assert written[0] == 40
    assert 0 in written[-5:], written  # settled ticks: sample times moved, nothing else
    # a restarted controller (seeded encoder, decoded state) writes what the running one writes
    restored = table.load()
    r.tick()
    running = enc.encode(r.state)
    r.now -= r.step
    r.state = restored
    enc = StateEncoder()
    enc.seed(restored)
    r.tick()
    after_restart = enc.encode(r.state)
    assert after_restart.nodes == running.nodes and after_restart.parts == running.parts


def test_decode_rejects_a_foreign_rows_format():
    enc = StateEncoder()
    rows = enc.encode(ControllerState.empty())
    parts = dict(rows.parts)
    meta = json.loads(parts["meta"])
    parts["meta"] = json.dumps({**meta, "rows_format": 99})
    try:
        decode(parts, [])
    except ValueError as exc:
        assert "rows format 99" in str(exc)
    else:
        raise AssertionError("accepted")
    del parts["clocks"]
    try:
        decode(parts, [])
    except ValueError as exc:
        assert "clocks" in str(exc)
    else:
        raise AssertionError("accepted")
