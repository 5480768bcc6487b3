"""The pieces the controller tests share: a real fake-backend agent process, and the Slurm command seam.

``AgentProcess``: ``fleetyield-agent serve --backend fake`` on 127.0.0.1 (a free port, its own state dir),
optionally pushing to a controller with a shared secret; ``ready()`` polls it, ``close()`` stops it by pid.
``FakeCommands``: the subprocess seam of ``SlurmCli`` (``runner=``): answers ``scontrol``/``squeue`` reads
like Slurm 22.05 from ``nodes`` (one ``node_line`` a node) and ``jobs``, records every command; ``on_update``
lets a rig apply the ``scontrol update``s it is given. ``wait_for`` polls with a deadline (never a fixed
sleep); ``free_port``; ``damage_btree_page`` (one SQLite page made unreadable, the rest intact). The fake
BMC: ``system_uuid`` (its system ids), ``start_fake_bmc``, ``stop_group``.
``approval_listener``: the real approval listener and the fy.toml an admin's CLI reads
(tests/test_gate_cli.py, tests/sim/test_equivalence_gate.py). Used by tests/test_daemon.py,
tests/web/webharness.py, tests/attest/wiring_rig.py, tests/node_agent/test_outcomes_remote.py and the Redfish
rigs (tests/conftest.py puts this directory on ``sys.path``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm_fleetyield.adapters.slurm import CommandResult

AGENT = str(Path(sys.executable).parent / "fleetyield-agent")
FAKE_BMC = Path(__file__).resolve().parents[1] / "contrib" / "redfish" / "fake_bmc.py"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def system_uuid(i: int) -> str:
    """The fake BMC's system id for the i-th node (the Redfish rigs, unit and docker end-to-end)."""
    return f"fe11e1d0-0000-4000-8000-{i:012d}"


def start_fake_bmc(
    config: Path, log_path: Path, url: str, timeout_s: float = 30.0
) -> subprocess.Popen[bytes]:
    """``contrib/redfish/fake_bmc.py --fake --config CONFIG`` (sushy-emulator) in its own process group
    (``stop_group`` ends exactly it), output to ``log_path``; returns once ``url``/redfish/v1 answers 200."""
    log = log_path.open("wb")  # lives with the process
    proc = subprocess.Popen(
        [sys.executable, str(FAKE_BMC), "--fake", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sushy-emulator exited: {log_path.read_text()[-2000:]}")
        try:  # the service root is served without auth
            with urllib.request.urlopen(f"{url}/redfish/v1", timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)  # polling interval, not a fixed wait
    stop_group(proc)
    raise RuntimeError(f"sushy-emulator did not answer within {timeout_s:g} s")


def stop_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM the process group ``proc`` leads (SIGKILL after 10 s), if it still runs."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(
    predicate: Callable[[], object],
    timeout_s: float = 15.0,
    what: str = "condition",
    interval_s: float = 0.01,
) -> object:
    """The predicate's first truthy value; AssertionError (with the last value) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)  # polling interval, not a fixed wait
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def reset_mid_request(port: int, request: bytes, host: str = "127.0.0.1") -> None:
    """Three clients that leave rudely: one resets half-way through ``request``, one resets right after
    sending it whole (before the reply), one closes before reading the reply. Then a well-behaved client
    must still be answered (a caller asserts on that, and on stderr)."""
    import struct

    for cut in (len(request) // 2, len(request), -1):
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(request if cut < 0 else request[:cut])
        if cut >= 0:  # RST instead of FIN
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()


FIXTURES = Path(__file__).parent / "adapters" / "fixtures"
TICK_TIME = 1_768_212_200.0


def commit_one_tick(db: Path) -> None:
    """A store holding one committed tick, as a daemon that is now down leaves it: four nodes from a Slurm
    22.05 capture, gpu-01 sensed through a fake agent with XID 48, gpu-02 quarantined (fatal XID 79),
    dry-run (tests/test_cli.py, the Prolog's gate behind basic auth in tests/prolog_epilog/)."""
    import random

    from slurm_fleetyield.adapters.scrape import parse_exposition
    from slurm_fleetyield.adapters.slurm import SlurmCli
    from slurm_fleetyield.adapters.store import LogRow, Store
    from slurm_fleetyield.adapters.views import render_result
    from slurm_fleetyield.core.loop import tick
    from slurm_fleetyield.core.model import Observations
    from slurm_fleetyield.core.params import Params
    from slurm_fleetyield.core.state import ControllerState
    from slurm_fleetyield.ports import ApplyReport

    now = TICK_TIME
    text = (FIXTURES / "scontrol_show_node_o_22.05_edgecases.txt").read_text()
    nodes = SlurmCli(runner=lambda a, t: CommandResult(0, text, ""), version=(22, 5, 8)).read_nodes()
    sample = parse_exposition((FIXTURES / "agent_fake_h100_2gpu_xid48.txt").read_text(), "gpu-01", now)
    result = tick(
        ControllerState.empty(), Observations(now, nodes, {"gpu-01": sample}), Params(), now, random.Random(0)
    )
    store = Store(db)
    view = render_result(5, now, result, ApplyReport(), {"gpu-01": sample}, dry_run=True, duration_s=0.1)
    store.commit_tick(
        5,
        now,
        result.state,
        (),
        [LogRow(now, e.kind, e.node, e.message) for e in result.events]
        + [
            LogRow(now, "applied", "gpu-02", "scontrol update NodeName=gpu-02 ..."),
            LogRow(now, "dry_run", "gpu-01", "x"),
        ],
        view,
    )
    store.close()


def write_secret(path: Path, secret: bytes) -> Path:
    """The push secret as the agent and the controller read it (mode 0600)."""
    path.write_bytes(secret)
    path.chmod(0o600)
    return path


BTREE_PAGE_TYPES = (2, 5, 10, 13)  # interior index, interior table, leaf index, leaf table


def damage_btree_page(db: Path, page: int = 4) -> None:
    """Flip (XOR 0xFF) the 8-byte b-tree header of ``page`` (1-based) of the SQLite file ``db``, as a bad disk
    sector would. The file header and the schema (page 1) stay intact, so SQLite still opens the file and
    answers every query that misses that page; only a check of every page (``PRAGMA quick_check``) or a read
    of that table finds it. The WAL is checkpointed first so the page lives in the file; asserts that the
    file is big enough (>= 5 pages), that the page is a b-tree page, and that ``quick_check`` detects it."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    data = bytearray(db.read_bytes())
    assert data[:16] == b"SQLite format 3\x00", f"{db} is not an SQLite file"
    raw = int.from_bytes(data[16:18], "big")
    page_size = 65536 if raw == 1 else raw  # the header's encoding of 64 KiB
    pages = len(data) // page_size
    assert pages >= 5 and 2 <= page <= pages, f"{db}: {pages} pages of {page_size} bytes, damaging {page}"
    start = (page - 1) * page_size  # page 1 alone has the 100-byte file header before its b-tree header
    assert data[start] in BTREE_PAGE_TYPES, f"{db}: page {page} is not a b-tree page (type {data[start]})"
    data[start : start + 8] = bytes(b ^ 0xFF for b in data[start : start + 8])
    db.write_bytes(bytes(data))
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # still opens: the schema is intact
        try:
            (check,) = conn.execute("PRAGMA quick_check").fetchone()
        except sqlite3.DatabaseError as exc:  # "database disk image is malformed": detected too
            check = str(exc)
    assert check != "ok", f"{db}: quick_check misses the damage to page {page}"


def approval_listener(
    tmp: Path,
    store: Any,
    gate_dir: Path,
    authorized_keys: Path,
    secret: bytes,
    wake: threading.Event | None = None,
    clock: Callable[[], float] | None = None,
    on_unauthenticated: Callable[[str, str], None] | None = None,
    web_config: Path | None = None,
) -> tuple[Any, Path]:
    """The admin's side of the human gate: the controller's REAL approval listener (``IngestServer``, started
    on a free port) and the ``fy.toml`` that ``fleetyield pending/approve/deny --config`` read (store, gate
    and push sections pointing at it). With ``web_config`` the listener is served with that web-config file
    (TLS, basic auth) and fy.toml names it, with host ``localhost`` (the name on tests/pki.py's server
    certificate). Returns (server, config path); the caller stops the server."""
    from slurm_fleetyield.adapters.ingest import IngestServer

    kw: dict[str, Any] = {} if clock is None else {"clock": clock}
    if on_unauthenticated is not None:
        kw["on_unauthenticated"] = on_unauthenticated
    push_extra = ""
    if web_config is not None:
        from node_agent.webconfig import load_web_config

        kw["web"] = load_web_config(web_config)
        push_extra = f'web_config_file = "{web_config}"\n'
    server = IngestServer(
        "127.0.0.1",
        0,
        secret,
        store,
        wake if wake is not None else threading.Event(),
        gate_dir=str(gate_dir),
        authorized_keys=str(authorized_keys),
        **kw,
    )
    server.start()
    cfg = tmp / "fy.toml"
    cfg.write_text(
        f'[store]\npath = "{tmp / "fy.db"}"\n'
        f'[gate]\nstate_dir = "{gate_dir}"\nauthorized_keys = "{authorized_keys}"\n'
        f'[push]\nhost = "{"127.0.0.1" if web_config is None else "localhost"}"\nport = {server.port}\n'
        f'secret_file = "{tmp / "push.secret"}"\n{push_extra}'
    )
    return server, cfg


class AgentProcess:
    """``fleetyield-agent serve --backend fake``: ``gpus`` GPUs of ``model``, ``seed``, state in
    ``state_dir`` (default ``tmp/agent-<node>``); with ``secret`` the push secret file is ``tmp/secret_name``
    (passed as ``--push-secret-file``), with ``push_url`` too it pushes there. ``extra_args`` go last.
    With ``wait`` the constructor returns once ``ready()``."""

    ready_path = "/metrics"

    def __init__(
        self,
        tmp: Path,
        node: str,
        *,
        gpus: int = 8,
        model: str | None = "h100",
        seed: int | None = 7,
        state_dir: Path | None = None,
        push_url: str | None = None,
        secret: bytes | None = None,
        secret_name: str = "secret",
        extra_args: Sequence[str] = (),
        wait: bool = True,
        timeout_s: float = 15.0,
    ) -> None:
        self.node = node
        self.state_dir = state_dir or tmp / f"agent-{node}"
        self.port = free_port()
        args = [AGENT, "serve", "--backend", "fake", "--listen", "127.0.0.1", "--port", str(self.port)]
        args += ["--state-dir", str(self.state_dir), "--gpus", str(gpus), "--hostname", node]
        if model is not None:
            args += ["--model", model]
        if seed is not None:
            args += ["--seed", str(seed)]
        if push_url:
            args += ["--push-url", push_url]
        if secret is not None:
            args += ["--push-secret-file", str(write_secret(tmp / secret_name, secret))]
        args += list(extra_args)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if wait:
            wait_for(self.ready, timeout_s, what=f"agent {node} {self.ready_path}")

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent {self.node} exited: {self.proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.ready_path}", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def inject(self, gpu: int, xid: int) -> None:
        """``fleetyield-agent fault inject``: the fake backend raises that XID on that GPU."""
        where = ("--state-dir", str(self.state_dir), "--gpu", str(gpu))
        subprocess.run(
            (AGENT, "fault", "inject", *where, "--xid", str(xid)), check=True, capture_output=True, timeout=30
        )

    def close(self) -> str:
        """SIGTERM (SIGKILL after 10 s); returns what the agent wrote to stderr."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        err = self.proc.stderr.read().decode()
        self.proc.stderr.close()
        return err


def node_line(
    name: str,
    state: str = "IDLE",
    features: str = "h100,ib",
    weight: int = 1,
    reason: str = "",
    gres: str = "gpu:h100:8(S:0-1)",
) -> str:
    """One node of ``scontrol show node --oneliner`` as Slurm 22.05 prints it."""
    feats = features or "(null)"
    line = (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUTot=32 CPULoad=0.01 "
        f"AvailableFeatures={feats} ActiveFeatures={feats} Gres={gres} "
        f"NodeAddr={name} NodeHostName={name} Version=22.05.8 OS=Linux 6.1.0-18-amd64 #1 SMP Debian "
        f"RealMemory=1031000 AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 "
        f"TmpDisk=0 Weight={weight} Owner=N/A MCS_label=N/A Partitions=gpu CfgTRES=cpu=32,gres/gpu=8 "
        "AllocTRES="
    )
    return line + (f" Reason={reason} [root@2026-01-12T10:00:00]" if reason else "")


class FakeCommands:
    """The subprocess seam of ``SlurmCli``: answers reads from ``nodes`` (name -> ``node_line``) and
    ``jobs``, fails node reads while ``fail_reads``, records every command; ``on_update`` sees each
    ``scontrol update`` (a no-op here)."""

    def __init__(self, nodes: Sequence[str] = ()) -> None:
        self.nodes: dict[str, str] = {n: node_line(n) for n in nodes}
        self.jobs: list[dict] = []
        self.calls: list[tuple[str, ...]] = []
        self.fail_reads = False
        self.lock = threading.Lock()

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        argv = tuple(argv)
        with self.lock:
            self.calls.append(argv)
            if argv[:2] == ("scontrol", "--version"):
                return CommandResult(0, "slurm-wlm 22.05.8\n", "")
            if argv[:3] == ("scontrol", "show", "node"):
                if self.fail_reads:
                    return CommandResult(1, "", "slurm_load_node error: Unable to contact slurm controller")
                return CommandResult(0, "\n".join(self.nodes.values()) + "\n", "")
            if argv[:2] == ("squeue", "--json"):
                return CommandResult(0, json.dumps({"jobs": self.jobs}), "")
            if argv[:3] == ("scontrol", "show", "hostnames"):
                return CommandResult(0, "\n".join(argv[3].split(",")) + "\n", "")
            if argv[:3] == ("scontrol", "show", "hostlist"):
                return CommandResult(0, argv[3] + "\n", "")
            if argv[:2] == ("scontrol", "update"):
                self.on_update(argv)
            return CommandResult(0, "", "")

    def on_update(self, argv: tuple[str, ...]) -> None:
        """Called (under ``lock``) for every ``scontrol update``; a rig may apply it to ``nodes``."""

    def writes(self) -> list[tuple[str, ...]]:
        with self.lock:
            return [c for c in self.calls if c[1] in ("update", "requeue")]

    def drains(self) -> list[tuple[str, ...]]:
        with self.lock:
            return [c for c in self.calls if c[1:2] == ("update",) and "State=DRAIN" in c]
