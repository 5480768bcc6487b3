"""The leader lease and its fencing token on a real PostgreSQL (tests/pgcluster.py): two holders racing,
expiry and takeover, a stale token refused at the executor boundary, the token monotonic. Clocks are
injected: the lease's expiry is tested without sleeping."""

from __future__ import annotations

import threading

from slurm_fleetyield.adapters.slurm import CommandResult, SlurmCli
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.core.plan import DrainNode, Plan, RebootNode
from slurm_fleetyield.executor import Executor
from slurm_fleetyield.lease import Leadership, SoleLeadership

T0 = 1_768_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_two_holders_racing_for_a_free_lease_one_wins_each_round(pg_url):
    a, b = Store(pg_url), Store(pg_url)
    for rnd in range(20):
        now = T0 + rnd * 100.0  # every round starts after the previous lease lapsed
        barrier = threading.Barrier(2)
        got: dict[str, int | None] = {}

        def race(
            store: Store, name: str, now: float = now, barrier: threading.Barrier = barrier, got=got
        ) -> None:
            barrier.wait()
            got[name] = store.lease_acquire(name, 6.0, now)

        threads = [threading.Thread(target=race, args=(s, n)) for s, n in ((a, "a"), (b, "b"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, tok in got.items() if tok is not None]
        assert len(winners) == 1, (rnd, got)
        assert a.lease_row()["holder"] == winners[0] and a.lease_row()["token"] == got[winners[0]]
    a.close()
    b.close()


def test_expiry_and_takeover_with_a_new_token(pg_url):
    clock = Clock()
    a = Leadership(Store(pg_url), "ctl-a", ttl_s=6.0, renew_s=2.0, clock=clock)
    b = Leadership(Store(pg_url), "ctl-b", ttl_s=6.0, renew_s=2.0, clock=clock)
    assert a.renew() and a.token == 1 and not b.renew() and b.token is None
    clock.t += 4.0
    assert a.renew() and a.token == 1  # renewed in time: the same token
    clock.t += 5.9
    assert not b.renew()  # a's renewal at +4 runs until +10
    assert a.status()["leader"] == "ctl-a" and b.status()["leader"] == "ctl-a" and not b.status()["leading"]
    clock.t += 0.2  # a died at +4: its lease lapsed
    assert b.renew() and b.token == 2 and b.gained.is_set()
    assert b.status() | {"expires_in_s": None} == {
        "mode": "lease", "self": "ctl-b", "leader": "ctl-b", "leading": True, "token": 2, "expires_in_s": None
    }  # fmt: skip
    assert not a.renew() and a.token is None  # the old leader, back, is a standby now


def test_an_action_of_a_deposed_leader_is_refused_before_it_reaches_slurm(pg_url):
    clock = Clock()
    a = Leadership(Store(pg_url), "ctl-a", ttl_s=6.0, renew_s=2.0, clock=clock)
    b = Leadership(Store(pg_url), "ctl-b", ttl_s=6.0, renew_s=2.0, clock=clock)
    sent: list[list[str]] = []

    def runner(argv, timeout):
        sent.append(list(argv))
        return CommandResult(0, "", "")

    store = Store(pg_url)
    executor = Executor(SlurmCli(runner=runner, version=(22, 5, 8)), store, fence=a.fence)
    plan = Plan(
        (DrainNode("gpu-01", "fleetyield: XID 79"), RebootNode("gpu-02", "rehab", intent="gpu-02/1/reboot"))
    )
    assert a.renew()
    report = executor.apply(plan, clock())
    assert all(r.ok for r in report.results) and any("gpu-01" in " ".join(c) for c in sent)
    # a stalls past its TTL (a GC pause, a partition); b takes over; a still believes it leads (token 1)
    clock.t += 6.5
    assert b.renew() and b.token == 2 and a.token == 1
    sent.clear()
    report = executor.apply(Plan((DrainNode("gpu-03", "fleetyield: XID 79"),)), clock())
    assert sent == [] and not report.results[0].ok
    assert (
        report.results[0].detail == "fenced: token 1 of ctl-a is stale (the lease was taken over or lapsed)"
    )
    assert store.intent("gpu-04/1/reboot") is None
    executor.apply(Plan((RebootNode("gpu-04", "rehab", intent="gpu-04/1/reboot"),)), clock())
    assert sent == [] and store.intent("gpu-04/1/reboot") is None  # not even recorded
    # without the lease at all (a standby): refused too
    standby = Executor(
        SlurmCli(runner=runner, version=(22, 5, 8)), store, fence=Leadership(store, "ctl-c").fence
    )
    assert (
        standby.apply(Plan((DrainNode("gpu-05", "x"),)), clock())
        .results[0]
        .detail.startswith("fenced: ctl-c")
    )
    assert sent == []


def test_the_token_is_monotonic_across_takeovers_and_kept_across_renewals(pg_url):
    store = Store(pg_url)
    now, seen = T0, []
    for i in range(12):
        holder = "ab"[i % 2]
        token = store.lease_acquire(holder, 6.0, now)
        assert token is not None
        assert store.lease_acquire(holder, 6.0, now + 1.0) == token  # a renewal keeps it
        assert store.lease_acquire("ab"[(i + 1) % 2], 6.0, now + 2.0) is None  # held: refused
        seen.append(token)
        now += 10.0  # lapses
    assert seen == sorted(set(seen)) and seen[0] == 1 and len(seen) == 12
    # a holder re-taking its own lapsed lease gets a new token too: its old actions are fenced
    assert store.lease_acquire("a", 6.0, now) == seen[-1] + 1


def test_a_clean_release_lets_the_standby_take_over_at_once(pg_url):
    clock = Clock()
    a = Leadership(Store(pg_url), "ctl-a", clock=clock)
    b = Leadership(Store(pg_url), "ctl-b", clock=clock)
    assert a.renew() and not b.renew()
    a.release()
    assert not a.fence()[0] and b.renew() and b.token == 2


def test_sqlite_is_one_controller_trivially_leading():
    sole = SoleLeadership("ctl")
    assert sole.renew() and sole.leading and sole.fence() == (True, "") and sole.status()["leader"] == "ctl"
