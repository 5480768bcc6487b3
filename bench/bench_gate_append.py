"""Benchmark the gate's append throughput on both backends: SQLite ``gate.db`` and the PostgreSQL store.

Input: none. Output: per backend and round, proposals recorded per second through ``Gatekeeper.propose``
(one transaction each: the gate lock, the lease-free path, a superseded check, the proposal row, one
hash-chained audit entry with its head row, then the head file rewritten with fsync), and the audit
verification time of the whole chain at the end. Backends alternate round by round in one run, so a busy
machine slows both alike. SQLite: a file under ``--dir`` (WAL, synchronous=FULL). PostgreSQL: ``--url``, or
a throwaway cluster from tests/pgcluster.py (unix socket; ``--fsync`` turns the server's fsync on).

    .venv/bin/python bench/bench_gate_append.py [--n 500] [--rounds 3] [--fsync] [--url URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_fleetyield.gate.gatekeeper import Gatekeeper
from slurm_fleetyield.gate.proposal import Proposal


def _round(gk: Gatekeeper, tag: str, n: int, t0: float) -> float:
    start = time.perf_counter()
    for i in range(n):
        gk.propose(
            Proposal.new(
                id=f"p-{tag}{i:08x}",
                node=f"gpu-{tag}-{i}",
                gpus=(0,),
                risk=0.9,
                evidence="bench",
                affected_jobs=(),
                now=t0 + i,
                ttl_s=3600,
            )
        )
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500, help="proposals per round and backend")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the SQLite gate.db goes (default: a temp dir)")
    ap.add_argument("--url", default=None, help="a PostgreSQL database (default: a throwaway cluster)")
    ap.add_argument("--fsync", action="store_true", help="throwaway cluster: fsync on")
    args = ap.parse_args()
    cluster = None
    url = args.url
    if url is None:
        from pgcluster import PgCluster, bindir

        found = bindir()
        if found is None:
            raise SystemExit("no PostgreSQL binaries: pass --url")
        cluster = PgCluster(found)
        cluster.start(fsync=args.fsync)
        url = cluster.database()
    tmp = Path(args.dir or tempfile.mkdtemp(prefix="fy-gate-bench-"))
    rates: dict[str, list[float]] = {"sqlite": [], "postgresql": []}
    try:
        gks = {
            "sqlite": Gatekeeper.open(tmp / "sqlite"),
            "postgresql": Gatekeeper.open(tmp / "pg", url=url),
        }
        for r in range(args.rounds):
            for name, gk in gks.items():
                rate = _round(
                    gk, f"{'ab'[name == 'postgresql']}{r:03x}", args.n, 1_700_000_000.0 + r * 10 * args.n
                )
                rates[name].append(rate)
                print(f"round {r} {name:10s} {rate:8.1f} proposals/s", flush=True)
        for name, gk in gks.items():
            t = time.perf_counter()
            report = gk.verify_audit()
            took = time.perf_counter() - t
            assert report.ok, report
            print(
                f"{name:10s} median {statistics.median(rates[name]):8.1f} proposals/s "
                f"(min {min(rates[name]):.1f}, max {max(rates[name]):.1f}); "
                f"verify {report.entries} entries {took:.3f} s"
            )
            gk.close()
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
