"""The store on SQLite and (``store_url``) PostgreSQL: inbox idempotence, one-transaction commits, and
convergence after a crash (real kill -9; SQLite)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_fleetyield.adapters.store import SCHEMA_VERSION, LogRow, Store, StoreError
from slurm_fleetyield.core.model import FatalEvent
from slurm_fleetyield.core.state import ControllerState


def st(n: float) -> ControllerState:
    """A small state told apart by ``last_tick``."""
    return ControllerState(last_tick=float(n))


BAD = ControllerState(last_tick=float("nan"))  # NaN is not JSON: its commit fails


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


def test_inbox_is_idempotent_by_event_id(store_url):
    store = Store(store_url, clock=lambda: 5.0)
    assert store.put_events([ev("a"), ev("b")]) == (2, 0)
    assert store.put_events([ev("b"), ev("c")]) == (1, 1)
    assert [e.event_id for e in store.pending()] == ["a", "b", "c"]
    assert store.pending()[0] == ev("a")  # round-trips exactly
    store.acknowledge(["a"])
    assert [e.event_id for e in store.pending()] == ["b", "c"]
    assert store.put_events([ev("a")]) == (0, 1)  # a processed event stays a duplicate
    assert store.inbox_counts() == {"pending": 2, "processed": 1}


def test_commit_tick_is_one_transaction(store_url):
    store = Store(store_url)
    store.put_events([ev("a")])
    store.commit_tick(
        1,
        100.0,
        st(1),
        ["a"],
        [LogRow(100.0, "drain", "gpu-01", "drained", {"xid": 79})],
        {"tick": 1, "nodes": {}},
    )
    assert store.load_state().tick == 1 and store.load_state().state == st(1)
    assert store.pending() == [] and store.last_result() == {"tick": 1, "nodes": {}}
    assert store.events()[0]["kind"] == "drain" and store.events()[0]["data"] == {"xid": 79}
    # a failing commit (NaN is not JSON) changes nothing at all
    store.put_events([ev("b")])
    with pytest.raises(ValueError):
        store.commit_tick(2, 101.0, BAD, ["b"], [LogRow(101.0, "x")])
    assert store.load_state().tick == 1 and [e.event_id for e in store.pending()] == ["b"]
    assert len(store.events()) == 1


def test_events_newest_first_filtered_and_pruned(store_url):
    store = Store(store_url, events_keep=100)
    for t in range(150):
        store.commit_tick(t, float(t), st(t), (), [LogRow(float(t), "tier_change", f"n{t % 2}", f"m{t}")])
    rows = store.events(limit=5)
    assert [r["message"] for r in rows] == ["m149", "m148", "m147", "m146", "m145"]
    assert all(r["node"] == "n1" for r in store.events(limit=10, node="n1"))
    assert len(store.events(limit=1000)) == 100


def test_crash_before_commit_converges(store_url):
    """No commit after taking events = crash between apply and commit: the same events come back."""
    path = store_url
    store = Store(path)
    store.put_events([ev("a")])
    store.commit_tick(1, 1.0, st(1))
    taken = store.pending()
    # "apply" happened, then the process died before commit_tick(2, ...)
    store.close()
    store = Store(path)
    assert store.pending() == taken and store.load_state().tick == 1
    store.commit_tick(2, 2.0, st(2), [e.event_id for e in taken])
    assert store.pending() == [] and store.load_state().state == st(2)


_CHILD = """
import sys
from slurm_fleetyield.adapters.store import LogRow, Store
from slurm_fleetyield.core.model import FatalEvent
from slurm_fleetyield.core.state import ControllerState
store = Store(sys.argv[1])
tick = 0
while True:
    tick += 1
    store.put_events([FatalEvent(event_id=f"e{tick}", node="n", time=tick, kind="xid", xid=79)])
    state = ControllerState(last_tick=float(tick), processed_events=("x" * 5000,))
    store.commit_tick(tick, float(tick), state, [f"e{tick}"],
                      [LogRow(float(tick), "tick", "n", str(tick))], {"tick": tick})
    print(tick, flush=True)
"""


def _assert_integrity(store: Store) -> None:
    """SQLite's page-level check (PostgreSQL's WAL replay at the next start is its own)."""
    if not store._pg:
        assert store._conn().execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _kill_9_after(child_code: str, path: Path | str, ticks: int, timeout: float) -> int:
    """Run ``child_code`` (it commits to the store at ``path`` and prints each committed tick); SIGKILL it
    once it has printed ``ticks`` (or ``timeout`` s passed). Returns the last tick it printed."""
    child = subprocess.Popen([sys.executable, "-c", child_code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        last = 0
        while last < ticks and time.monotonic() < deadline:
            last = int(child.stdout.readline())
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
        child.stdout.close()
    return last


def test_kill_9_mid_write_leaves_a_consistent_database(store_url):
    path = store_url
    last = _kill_9_after(_CHILD, path, 50, timeout=30)
    assert last >= 50
    store = Store(path)
    _assert_integrity(store)
    state = store.load_state()
    assert state.tick >= last and state.state.last_tick == state.tick  # committed ticks are never lost
    assert store.last_result() == {"tick": state.tick}
    assert store.events(limit=1)[0]["message"] == str(state.tick)  # state and log from the same commit
    # at most the one event put after the last commit is pending: taken again on the next tick
    assert [e.event_id for e in store.pending()] in ([], [f"e{state.tick + 1}"])


def test_readonly_open(tmp_path):
    with pytest.raises(StoreError, match="no such database"):
        Store(tmp_path / "missing.db", readonly=True)
    Store(tmp_path / "fy.db").commit_tick(3, 3.0, st(3), (), (), {"tick": 3})
    ro = Store(tmp_path / "fy.db", readonly=True)
    assert ro.last_result() == {"tick": 3}
    with pytest.raises(sqlite3.OperationalError):
        ro.append_log([LogRow(1.0, "x")])


_MARKS_CHILD = r"""
import sys
from slurm_fleetyield.adapters.store import Store, TickMarks
from slurm_fleetyield.core.state import ControllerState
store = Store(sys.argv[1])
for i in range(1, 100000):
    store.put_outcomes("gpu-01", [{"job_id": str(i), "start_time": float(i), "end_time": i + 1.0}])
    row = {"job_id": i, "start": float(i), "end": i + 1.0, "workload": "batch", "nodes": ["gpu-01"],
           "gpus": 8,
           "state": "COMPLETED", "useful_gpu_s": 8.0, "wasted_gpu_s": 0.0, "premium_misuse_gpu_s": 0.0,
           "failure": False, "tier_at_start": "green", "cause": "completed"}
    marks = TickMarks(outcome_keys=[k.key for k in store.pending_outcomes()], attempts=[(str(i), float(i))],
                      ledger=[row], gate_marks=[(f"p-{i:012x}", "executed", "gpu-01")])
    store.commit_tick(i, float(i), ControllerState(last_tick=float(i)), marks=marks)
    print(i, flush=True)
"""


def test_kill_9_never_loses_a_committed_ledger_row_or_mark(store_url):
    path = store_url
    last = _kill_9_after(_MARKS_CHILD, path, 40, timeout=30)
    assert last >= 40
    store = Store(path)
    _assert_integrity(store)
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


def test_outcomes_idempotent_and_ledger_totals(store_url):
    store = Store(store_url)
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


def test_view_upserts_only_the_given_nodes_in_the_tick_transaction(store_url):
    store = Store(store_url)
    store.commit_tick(1, 1.0, st(1), view=_View(1, [_node("a", 1), _node("b", 1)], replace=True))
    store.commit_tick(2, 2.0, st(2), view=_View(2, [_node("b", 2, explain=False)]))
    assert store.last_result_tick() == 2
    assert store.node_explanation("a") == (1, {"node": "a", "tick": 1})  # untouched since tick 1
    assert store.node_explanation("b") is None  # written without an explanation: none, never a stale one
    view = store.last_view()
    assert view["tick"] == 2 and set(view["nodes"]) == {"a", "b"} and view["floor"]["a"]["gpus"] == []
    # a failing commit (NaN state) leaves the previous view, header and nodes
    with pytest.raises(ValueError):
        store.commit_tick(3, 3.0, BAD, view=_View(3, [], deletes=["a"]))
    assert store.last_result_tick() == 2 and set(store.last_view()["nodes"]) == {"a", "b"}
    store.commit_tick(4, 4.0, st(4), view=_View(4, [], deletes=["a"]))
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
    store.commit_tick(7, 7.0, st(7), last_result=legacy)
    conn = store._conn()
    conn.executescript("DROP TABLE view_header; DROP TABLE view_nodes;")
    _state_as_blob(conn, 7, 7.0, st(7), version=2)
    store.close()
    ro = Store(path, readonly=True)
    assert ro.last_result_tick() == 7 and ro.last_view() == legacy and ro.node_explanation("a") is None
    ro.close()
    store = Store(path)
    assert store._conn().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.last_view() == legacy and store.load_state().tick == 7 and store.load_state().state == st(7)
    store.commit_tick(8, 8.0, st(8), view=_View(8, [_node("a", 8)], replace=True))
    assert store.last_result_tick() == 8 and store.last_view()["nodes"] == {
        "a": {"node": "a", "tier": "green"}
    }
    assert store._conn().execute("SELECT COUNT(*) FROM last_result").fetchone()[0] == 0
    store.close()


# --------------------------------------------------------------------------------------------------------
# The controller state as rows (schema 4): only what changed is written, a v3 blob is migrated
# --------------------------------------------------------------------------------------------------------


def _state_as_blob(
    conn: sqlite3.Connection, tick: int, now: float, state: ControllerState, version: int
) -> None:
    """Turn a schema-4 database back into the layout before it: the state as one JSON blob."""
    conn.executescript(
        "DROP TABLE state_head; DROP TABLE state_parts; DROP TABLE state_nodes; "
        "CREATE TABLE state (id INTEGER PRIMARY KEY CHECK (id = 1), tick INTEGER NOT NULL, "
        "time REAL NOT NULL, state TEXT NOT NULL);"
    )
    conn.execute("INSERT INTO state VALUES (1, ?, ?, ?)", (tick, now, json.dumps(state.to_dict())))
    conn.execute(f"PRAGMA user_version = {version}")


_FLEET = r'''
from slurm_fleetyield.core.model import Tier
from slurm_fleetyield.core.state import ControllerState, GpuTrack, NodeHistory, NodeMemory

N_NODES, EVERY = 300, 10  # node i changes at ticks t with t % EVERY == i % EVERY


def fleet_state(tick):
    """Deterministic state of tick ``tick``: every node's sample time moves, a tenth of the nodes change."""
    nodes, history = {}, {}
    for i in range(N_NODES):
        name = f"n{i:03d}"
        k = tick - (tick - i) % EVERY  # the last tick at which this node changed
        nodes[name] = NodeMemory(Tier.GREEN, 0.0, f"r{k} " + "x" * 2000)
        track = GpuTrack((float(k),), (float(k),), (0.0,), ((float(k),),))
        history[name] = NodeHistory(float(tick), (float(tick),), {f"GPU-{i}": track})
    return ControllerState(nodes=nodes, history=history, layout=("c",), last_tick=float(tick))
'''


def _fleet_state(tick: int) -> ControllerState:
    ns: dict = {}
    exec(_FLEET, ns)
    return ns["fleet_state"](tick)


def _written_at(store: Store, tick: int) -> int:
    return store._conn().execute("SELECT COUNT(*) FROM state_nodes WHERE tick = ?", (tick,)).fetchone()[0]


def test_a_tick_writes_only_the_nodes_that_changed(store_url):
    store = Store(store_url)
    store.commit_tick(1, 1.0, _fleet_state(1))
    assert _written_at(store, 1) == 300  # first commit: everything
    store.commit_tick(2, 2.0, _fleet_state(2))
    assert _written_at(store, 2) == 30  # sample times moved everywhere: only the clocks part has them
    assert store.load_state().state == _fleet_state(2)
    # a restarted store diffs against what it loaded
    store.close()
    store = Store(store_url)
    assert store.load_state().state == _fleet_state(2)
    store.commit_tick(3, 3.0, _fleet_state(3))
    assert _written_at(store, 3) == 30 and Store(store_url).load_state().state == _fleet_state(3)
    # a node gone is deleted; one back is written
    gone = _fleet_state(4)
    gone = ControllerState(
        nodes={n: m for n, m in gone.nodes.items() if n != "n005"},
        history={n: h for n, h in gone.history.items() if n != "n005"},
        layout=gone.layout,
        last_tick=gone.last_tick,
    )
    store.commit_tick(4, 4.0, gone)
    assert store._conn().execute("SELECT COUNT(*) FROM state_nodes").fetchone()[0] == 299
    assert Store(store_url).load_state().state == gone
    store.close()


def test_another_writer_or_a_failed_commit_means_a_full_rewrite(store_url):
    a, b = Store(store_url), Store(store_url)
    a.commit_tick(1, 1.0, _fleet_state(1))
    b.commit_tick(2, 2.0, st(2))  # another writer replaced the state
    a.commit_tick(3, 3.0, _fleet_state(3))  # a's memory of tick 1 is stale: it must not diff against it
    assert _written_at(a, 3) == 300 and b.load_state().state == _fleet_state(3)
    with pytest.raises(ValueError):
        a.commit_tick(4, 4.0, BAD)
    a.commit_tick(5, 5.0, _fleet_state(5))  # unknown what a failed commit left: everything again
    assert _written_at(a, 5) == 300 and b.load_state().state == _fleet_state(5)
    a.close()
    b.close()


def test_a_schema_3_state_blob_is_migrated_to_rows(tmp_path):
    path = tmp_path / "fy.db"
    state = _fleet_state(9)
    store = Store(path)
    _state_as_blob(store._conn(), 9, 9.5, state, version=3)
    store.close()
    ro = Store(path, readonly=True)  # a read-only open does not migrate: the blob is read as it is
    assert ro.load_state().tick == 9 and ro.load_state().state == state
    ro.close()
    store = Store(path)
    conn = store._conn()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'state'").fetchone()[0] == 0
    loaded = store.load_state()
    assert (loaded.tick, loaded.time) == (9, 9.5) and loaded.state == state
    store.commit_tick(10, 10.0, loaded.state)
    assert _written_at(store, 10) == 0  # the migrated rows are the base of the next diff
    # (the blob held plain GPU histories: the first real tick rewrites each node once, in compact form)
    store.close()


def test_a_schema_3_state_that_cannot_be_read_fails_the_migration_and_changes_nothing(tmp_path):
    path = tmp_path / "fy.db"
    store = Store(path)
    _state_as_blob(store._conn(), 4, 4.0, st(4), version=3)
    store._conn().execute("UPDATE state SET state = ?", (json.dumps({"version": 99}),))
    store.close()
    with pytest.raises(StoreError, match=r"cannot migrate the stored controller state.*version 99"):
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert json.loads(conn.execute("SELECT state FROM state").fetchone()[0]) == {"version": 99}
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'state_nodes'").fetchone()[0] == 0
    conn.close()


_ROWS_CHILD = (
    _FLEET
    + r"""
import sys
from slurm_fleetyield.adapters.store import Store
store = Store(sys.argv[1])
tick = 0
while True:
    tick += 1
    store.commit_tick(tick, float(tick), fleet_state(tick))
    print(tick, flush=True)
"""
)


def test_kill_9_mid_commit_leaves_the_previous_consistent_state(store_url):
    """Each tick rewrites a tenth of the node rows and the clocks part: after a kill -9 the stored state is
    exactly the state of one committed tick (never some nodes of the next one)."""
    path = store_url
    last = _kill_9_after(_ROWS_CHILD, path, 25, timeout=60)
    assert last >= 25
    store = Store(path)
    _assert_integrity(store)
    loaded = store.load_state()
    assert loaded.tick >= last
    assert loaded.state == _fleet_state(loaded.tick)
    store.commit_tick(loaded.tick + 1, 0.0, _fleet_state(loaded.tick + 1))  # and it carries on from there
    assert _written_at(store, loaded.tick + 1) == 30
    assert Store(path).load_state().state == _fleet_state(loaded.tick + 1)
    store.close()


def test_agent_event_log_is_idempotent_by_event_id_and_its_memory_bounded(store_url):
    from slurm_fleetyield.adapters.store import INBOX_KEEP_S

    store = Store(store_url)
    rows = [(f"e{i}", LogRow(10.0, "agent_xid", "gpu-01", f"m{i}")) for i in range(3)]
    assert store.log_agent_events(rows, received_at=10.0) == (3, 0)
    assert store.log_agent_events(rows, received_at=11.0) == (0, 3)  # a replay or a retry
    assert len(store.events(limit=100)) == 3
    store.commit_tick(1, 10.0 + INBOX_KEEP_S + 1, st(1))  # seen ids older than the inbox's memory go
    assert store._conn().execute("SELECT COUNT(*) FROM agent_seen").fetchone() == (0,)
    store.close()


# --- issue #27 item 8: a damaged store is a clear error, never a silent fresh start -----------------------


def _committed_store(path: Path) -> bytes:
    store = Store(path)
    store.commit_tick(1, 1.0, st(1), (), [LogRow(1.0, "x", "n1", "m")])
    store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path.read_bytes()


def test_an_empty_existing_store_is_refused_not_started_over(tmp_path):
    path = tmp_path / "fy.db"
    path.write_bytes(b"")
    with pytest.raises(StoreError) as err:
        Store(path)
    assert str(path) in str(err.value) and "empty" in str(err.value)
    assert path.read_bytes() == b""  # nothing written over it


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed"])
def test_a_damaged_store_is_a_store_error_naming_the_file(tmp_path, damage):
    path = tmp_path / "fy.db"
    data = _committed_store(path)
    damaged = {
        "garbage": b"not sqlite at all " * 300,
        "truncated": data[: len(data) // 2 + 10],
        "zeroed": data[:100] + b"\x00" * (len(data) - 100),
    }[damage]
    path.write_bytes(damaged)
    with pytest.raises(StoreError) as err:
        store = Store(path)
        store.load_state()
    assert str(path) in str(err.value)
    assert path.read_bytes() == damaged  # changed nothing


def test_an_edited_state_row_is_a_store_error(tmp_path):
    path = tmp_path / "fy.db"
    _committed_store(path)
    with sqlite3.connect(path) as conn:
        first = conn.execute("SELECT MIN(part) FROM state_parts").fetchone()[0]
        conn.execute("UPDATE state_parts SET doc = '{not json' WHERE part = ?", (first,))
    with pytest.raises(StoreError, match=str(path)):
        Store(path).load_state()


def test_page_level_damage_is_found_at_open(tmp_path):
    # a flipped byte in a page the first reads never touch must stop the start, not a later tick
    path = tmp_path / "fy.db"
    store = Store(path)
    for t in range(1, 30):
        store.commit_tick(t, float(t), st(t), (), [LogRow(float(t), "x", "n1", "m" * 2000)])
    store._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = bytearray(path.read_bytes())
    page = len(data) // 4096 - 2  # an events page near the end
    data[page * 4096 : page * 4096 + 8] = b"\xff" * 8  # its b-tree page header
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=str(path)):
        Store(path)


# --- issue #30: the PostgreSQL backend (a real server, tests/pgcluster.py) ------------------------------


def test_ledger_rows_round_trip_on_both_backends(store_url):
    from slurm_fleetyield.adapters.store import TickMarks

    row = {
        "job_id": 42, "start": 10.0, "end": 20.5, "workload": None, "nodes": ["gpu-01", "gpu-02"], "gpus": 16,
        "state": "COMPLETED", "useful_gpu_s": 100.0, "wasted_gpu_s": 1.5, "premium_misuse_gpu_s": 0.0,
        "failure": True, "tier_at_start": "green", "cause": "xid",
    }  # fmt: skip
    store = Store(store_url)
    store.commit_tick(1, 30.0, st(1), marks=TickMarks(ledger=[row]))
    store.commit_tick(2, 31.0, st(2), marks=TickMarks(ledger=[row]))  # the same attempt again: one row
    assert store.ledger() == [row] and store.ledger(since=21.0) == []
    assert store.ledger_totals() == {
        "jobs": 1, "useful_gpu_s": 100.0, "wasted_gpu_s": 1.5, "premium_misuse_gpu_s": 0.0, "failures": 1
    }  # fmt: skip
    assert type(store.ledger_totals()["failures"]) is int
    store.close()


def test_postgresql_schema_version_is_recorded_and_a_newer_one_refused(pg_url):
    store = Store(pg_url)
    conn = store._conn()
    assert conn.execute("SELECT version FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    conn.execute("UPDATE schema_version SET version = 99")
    store.close()
    with pytest.raises(StoreError, match=r"postgresql://postgres@/t\d+.*schema version 99, this build knows"):
        Store(pg_url)


def test_postgresql_readonly_open_refuses_writes_and_an_empty_database(pg_cluster, pg_url):
    with pytest.raises(StoreError, match="no store schema"):
        Store(pg_cluster.database(), readonly=True)
    Store(pg_url).commit_tick(3, 3.0, st(3), (), (), {"tick": 3})
    ro = Store(pg_url, readonly=True)
    assert ro.last_result() == {"tick": 3} and ro.load_state().tick == 3
    import psycopg

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        ro.append_log([LogRow(1.0, "x")])
    ro.close()


def test_an_unreachable_postgresql_is_a_store_error_without_the_password(tmp_path):
    url = f"postgresql://fy:secret@/fy?host={tmp_path}&port=1"
    with pytest.raises(StoreError) as err:
        Store(url)
    assert "fy:***@" in str(err.value) and "secret" not in str(err.value)


def test_a_commit_with_a_stale_lease_token_is_refused_and_writes_nothing(pg_url):
    a, b = Store(pg_url), Store(pg_url)
    token_a = a.lease_acquire("ctl-a", 6.0, 100.0)
    a.commit_tick(1, 100.0, st(1), (), [LogRow(100.0, "x")], lease=("ctl-a", token_a))
    token_b = b.lease_acquire("ctl-b", 6.0, 107.0)  # a's lease lapsed at 106: b takes over
    assert token_b == token_a + 1
    b.put_events([ev("e1")])
    with pytest.raises(StoreError, match=f"fenced: token {token_a} of ctl-a is stale"):
        a.commit_tick(2, 108.0, st(2), ["e1"], [LogRow(108.0, "y")], lease=("ctl-a", token_a))
    assert b.load_state().tick == 1 and [e.event_id for e in b.pending()] == ["e1"] and len(b.events()) == 1
    b.commit_tick(2, 108.0, st(2), ["e1"], lease=("ctl-b", token_b))
    assert a.load_state().tick == 2 and a.pending() == []
    a.close()
    b.close()


def test_a_postgresql_connection_cut_is_an_error_then_reconnected(pg_url):
    import psycopg

    store = Store(pg_url)
    store.commit_tick(1, 1.0, st(1))
    pid = store._conn().execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(StoreError, match=r"postgresql:.* the database is unreachable"):  # seen once
        store.load_state()
    assert store.load_state().tick == 1  # the next call connects again
    store.commit_tick(2, 2.0, st(2))
    assert Store(pg_url).load_state().tick == 2
    store.close()
