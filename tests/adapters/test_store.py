"""SQLite store: inbox idempotence, one-transaction commits, and convergence after a crash (real kill -9)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from slurm_fleetyield.adapters.store import LogRow, Store, StoreError
from slurm_fleetyield.core.model import FatalEvent


def ev(i: str, node: str = "gpu-01") -> FatalEvent:
    return FatalEvent(
        event_id=i, node=node, time=10.0, kind="xid", gpu=3, uuid="GPU-x", xid=79, message="off bus"
    )


def test_wal_and_full_sync(tmp_path):
    store = Store(tmp_path / "fy.db")
    conn = store._conn()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    store.close()


def test_inbox_is_idempotent_by_event_id(tmp_path):
    store = Store(tmp_path / "fy.db", clock=lambda: 5.0)
    assert store.put_events([ev("a"), ev("b")]) == (2, 0)
    assert store.put_events([ev("b"), ev("c")]) == (1, 1)
    assert [e.event_id for e in store.pending()] == ["a", "b", "c"]
    assert store.pending()[0] == ev("a")  # round-trips exactly
    store.acknowledge(["a"])
    assert [e.event_id for e in store.pending()] == ["b", "c"]
    assert store.put_events([ev("a")]) == (0, 1)  # a processed event stays a duplicate
    assert store.inbox_counts() == {"pending": 2, "processed": 1}


def test_commit_tick_is_one_transaction(tmp_path):
    store = Store(tmp_path / "fy.db")
    store.put_events([ev("a")])
    store.commit_tick(
        1,
        100.0,
        {"version": 1, "x": [1, 2]},
        ["a"],
        [LogRow(100.0, "drain", "gpu-01", "drained", {"xid": 79})],
        {"tick": 1, "nodes": {}},
    )
    assert store.load_state().tick == 1 and store.load_state().state == {"version": 1, "x": [1, 2]}
    assert store.pending() == [] and store.last_result() == {"tick": 1, "nodes": {}}
    assert store.events()[0]["kind"] == "drain" and store.events()[0]["data"] == {"xid": 79}
    # a failing commit (NaN is not JSON) changes nothing at all
    store.put_events([ev("b")])
    with pytest.raises(ValueError):
        store.commit_tick(2, 101.0, {"bad": float("nan")}, ["b"], [LogRow(101.0, "x")])
    assert store.load_state().tick == 1 and [e.event_id for e in store.pending()] == ["b"]
    assert len(store.events()) == 1


def test_events_newest_first_filtered_and_pruned(tmp_path):
    store = Store(tmp_path / "fy.db", events_keep=100)
    for t in range(150):
        store.commit_tick(t, float(t), {}, (), [LogRow(float(t), "tier_change", f"n{t % 2}", f"m{t}")])
    rows = store.events(limit=5)
    assert [r["message"] for r in rows] == ["m149", "m148", "m147", "m146", "m145"]
    assert all(r["node"] == "n1" for r in store.events(limit=10, node="n1"))
    assert len(store.events(limit=1000)) == 100


def test_crash_before_commit_converges(tmp_path):
    """No commit after taking events = crash between apply and commit: the same events come back."""
    path = tmp_path / "fy.db"
    store = Store(path)
    store.put_events([ev("a")])
    store.commit_tick(1, 1.0, {"n": 1})
    taken = store.pending()
    # "apply" happened, then the process died before commit_tick(2, ...)
    store.close()
    store = Store(path)
    assert store.pending() == taken and store.load_state().tick == 1
    store.commit_tick(2, 2.0, {"n": 2}, [e.event_id for e in taken])
    assert store.pending() == [] and store.load_state().state == {"n": 2}


_CHILD = """
import sys
from slurm_fleetyield.adapters.store import LogRow, Store
from slurm_fleetyield.core.model import FatalEvent
store = Store(sys.argv[1])
tick = 0
while True:
    tick += 1
    store.put_events([FatalEvent(event_id=f"e{tick}", node="n", time=tick, kind="xid", xid=79)])
    store.commit_tick(tick, float(tick), {"tick": tick, "pad": "x" * 5000}, [f"e{tick}"],
                      [LogRow(float(tick), "tick", "n", str(tick))], {"tick": tick})
    print(tick, flush=True)
"""


def test_kill_9_mid_write_leaves_a_consistent_database(tmp_path):
    path = tmp_path / "fy.db"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        last = 0
        while last < 50 and time.monotonic() < deadline:
            last = int(child.stdout.readline())
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
        child.stdout.close()
    assert last >= 50
    store = Store(path)
    assert store._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    state = store.load_state()
    assert state.tick >= last and state.state["tick"] == state.tick  # committed ticks are never lost
    assert store.last_result() == {"tick": state.tick}
    assert store.events(limit=1)[0]["message"] == str(state.tick)  # state and log from the same commit
    # at most the one event put after the last commit is pending: taken again on the next tick
    assert [e.event_id for e in store.pending()] in ([], [f"e{state.tick + 1}"])


def test_readonly_open(tmp_path):
    with pytest.raises(StoreError, match="no such database"):
        Store(tmp_path / "missing.db", readonly=True)
    Store(tmp_path / "fy.db").commit_tick(3, 3.0, {"a": 1}, (), (), {"tick": 3})
    ro = Store(tmp_path / "fy.db", readonly=True)
    assert ro.last_result() == {"tick": 3}
    with pytest.raises(sqlite3.OperationalError):
        ro.append_log([LogRow(1.0, "x")])


_MARKS_CHILD = r"""
import sys
from slurm_fleetyield.adapters.store import Store, TickMarks
store = Store(sys.argv[1])
for i in range(1, 100000):
    store.put_outcomes("gpu-01", [{"job_id": str(i), "start_time": float(i), "end_time": i + 1.0}])
    row = {"job_id": i, "start": float(i), "end": i + 1.0, "workload": "batch", "nodes": ["gpu-01"],
           "gpus": 8,
           "state": "COMPLETED", "useful_gpu_s": 8.0, "wasted_gpu_s": 0.0, "premium_misuse_gpu_s": 0.0,
           "failure": False, "tier_at_start": "green", "cause": "completed"}
    marks = TickMarks(outcome_keys=[k.key for k in store.pending_outcomes()], attempts=[(str(i), float(i))],
                      ledger=[row], gate_marks=[(f"p-{i:012x}", "executed", "gpu-01")])
    store.commit_tick(i, float(i), {"tick": i}, marks=marks)
    print(i, flush=True)
"""


def test_kill_9_never_loses_a_committed_ledger_row_or_mark(tmp_path):
    path = tmp_path / "fy.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _MARKS_CHILD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 30
        last = 0
        while last < 40 and time.monotonic() < deadline:
            last = int(child.stdout.readline())
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
        child.stdout.close()
    assert last >= 40
    store = Store(path)
    assert store._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    tick = store.load_state().tick
    assert tick >= last
    ledger = store.ledger()
    assert sorted(r["job_id"] for r in ledger) == list(range(1, tick + 1))  # every committed row, once
    assert len(store.gate_marked("executed")) == tick
    # an outcome stored after the last commit is still pending (delivered on the next tick), none twice
    assert [o.job_id for o in store.pending_outcomes()] in ([], [str(tick + 1)])
    assert store.delivered_attempt(str(tick), float(tick)) and not store.delivered_attempt(
        str(tick + 1), tick + 1.0
    )


def test_outcomes_idempotent_and_ledger_totals(tmp_path):
    store = Store(tmp_path / "fy.db")
    rec = {"job_id": "5", "start_time": 10.0, "end_time": 20.0}
    assert store.put_outcomes("gpu-01", [rec, rec]) == (1, 1)
    assert store.put_outcomes("gpu-02", [rec]) == (1, 0)  # another node's record of the job
    assert store.outcome_counts() == {"pending": 2, "processed": 0}
    assert store.ledger_totals()["jobs"] == 0
    store.close()


class _View:
    def __init__(self, tick, nodes, deletes=(), replace=False):
        self.tick, self.nodes, self.deletes, self.replace = tick, tuple(nodes), tuple(deletes), replace
        self.header = {"tick": tick, "time": float(tick), "nodes": {}}


def _node(name, tick, explain=True):
    x = json.dumps({"node": name, "tick": tick}) if explain else None
    return (name, json.dumps({"node": name, "tier": "green"}), json.dumps({"proposal": None, "gpus": []}), x)


def test_view_upserts_only_the_given_nodes_in_the_tick_transaction(tmp_path):
    store = Store(tmp_path / "fy.db")
    store.commit_tick(1, 1.0, {"n": 1}, view=_View(1, [_node("a", 1), _node("b", 1)], replace=True))
    store.commit_tick(2, 2.0, {"n": 2}, view=_View(2, [_node("b", 2, explain=False)]))
    assert store.last_result_tick() == 2
    assert store.node_explanation("a") == (1, {"node": "a", "tick": 1})  # untouched since tick 1
    assert store.node_explanation("b") is None  # written without an explanation: none, never a stale one
    view = store.last_view()
    assert view["tick"] == 2 and set(view["nodes"]) == {"a", "b"} and view["floor"]["a"]["gpus"] == []
    # a failing commit (NaN state) leaves the previous view, header and nodes
    with pytest.raises(ValueError):
        store.commit_tick(3, 3.0, {"bad": float("nan")}, view=_View(3, [], deletes=["a"]))
    assert store.last_result_tick() == 2 and set(store.last_view()["nodes"]) == {"a", "b"}
    store.commit_tick(4, 4.0, {"n": 4}, view=_View(4, [], deletes=["a"]))
    assert set(store.last_view()["nodes"]) == {"b"}
    store.close()


def test_a_schema_2_database_is_read_then_migrated(tmp_path):
    """A store written before schema 3 (one ``last_result`` blob) is read as it is, read-only (no
    migration), and after migration until the daemon commits its first view."""
    path = tmp_path / "fy.db"
    legacy = {
        "tick": 7,
        "time": 7.0,
        "nodes": {"a": {"node": "a", "tier": "green", "explain": {"node": "a"}}},
    }
    store = Store(path)
    store.commit_tick(7, 7.0, {"n": 7}, last_result=legacy)
    conn = store._conn()
    conn.executescript("DROP TABLE view_header; DROP TABLE view_nodes; PRAGMA user_version = 2;")
    store.close()
    ro = Store(path, readonly=True)
    assert ro.last_result_tick() == 7 and ro.last_view() == legacy and ro.node_explanation("a") is None
    ro.close()
    store = Store(path)
    assert store._conn().execute("PRAGMA user_version").fetchone()[0] == 3
    assert store.last_view() == legacy and store.load_state().tick == 7
    store.commit_tick(8, 8.0, {"n": 8}, view=_View(8, [_node("a", 8)], replace=True))
    assert store.last_result_tick() == 8 and store.last_view()["nodes"] == {
        "a": {"node": "a", "tier": "green"}
    }
    assert store._conn().execute("SELECT COUNT(*) FROM last_result").fetchone()[0] == 0
    store.close()
