"""Scheduler rules of the simulated Slurm: scenario tables of nodes, jobs and expected placements."""

from __future__ import annotations

from slurm_fleetyield.core.plan import DrainNode, Plan, RequeueJobs, UpdateNodes
from slurm_fleetyield.sim.cluster import SimSlurm


def cluster(n: int = 4, requeued: list[int] | None = None) -> SimSlurm:
    sink = requeued if requeued is not None else []
    return SimSlurm([(f"n{i}", 8, "h100", ("h100",)) for i in range(n)], sink.append)


def test_constraint_filter_is_an_and_of_features() -> None:
    s = cluster()
    s.apply(
        Plan(
            (
                UpdateNodes(("n1",), ("h100", "fy_ok_train", "fy_ok_batch"), 1),
                UpdateNodes(("n2",), ("h100", "fy_ok_batch"), 1),
            )
        )
    )
    placed = s.schedule(0.0, [(1, frozenset({"fy_ok_train", "fy_ok_batch"}), 1, 8, 10.0)])
    assert placed == [(1, ("n1",))]
    assert s.schedule(0.0, [(2, frozenset({"fy_ok_decode"}), 1, 1, 10.0)]) == []


def test_submission_is_refused_only_when_no_node_in_any_state_carries_the_constraint() -> None:
    s = cluster()
    train, both = frozenset({"fy_ok_train"}), frozenset({"fy_ok_train", "fy_ok_batch"})
    assert s.accepts(frozenset()) and not s.accepts(train)
    s.apply(Plan((UpdateNodes(("n1",), ("h100", "fy_ok_train"), 1),)))
    assert s.accepts(train) and not s.accepts(both)  # an AND: one node must carry both
    s.set_drain("n1", "fleetyield: XID 79")
    s.set_down("n1", True)
    assert s.accepts(train)  # Slurm counts drained and down nodes: the job pends (ReqNodeNotAvail)
    s.apply(Plan((UpdateNodes(("n1",), ("h100",), 1),)))
    assert not s.accepts(train)  # the cached answer follows a feature change


def test_lowest_weight_first_ties_by_name() -> None:
    s = cluster()
    s.apply(
        Plan(
            (
                UpdateNodes(("n0", "n1"), ("h100",), 100),
                UpdateNodes(("n3",), ("h100",), 10),
                UpdateNodes(("n2",), ("h100",), 10),
            )
        )
    )
    placed = s.schedule(0.0, [(1, frozenset(), 2, 8, 10.0), (2, frozenset(), 1, 8, 10.0)])
    assert placed == [(1, ("n2", "n3")), (2, ("n0",))]


def test_gang_is_all_or_nothing() -> None:
    s = cluster(3)
    s.start(99, ("n0",), 8, 100.0, "batch")
    placed = s.schedule(0.0, [(1, frozenset(), 3, 8, 10.0)])
    assert placed == []
    assert all(s.nodes[n].free == 8 for n in ("n1", "n2"))


def test_drained_and_down_nodes_get_nothing() -> None:
    s = cluster(3)
    s.set_drain("n0", "fleetyield: XID 79")
    s.set_down("n1", True)
    assert s.schedule(0.0, [(1, frozenset(), 1, 8, 10.0)]) == [(1, ("n2",))]
    assert s.read_nodes()["n0"].drained_by_us
    assert "DOWN" in s.read_nodes()["n1"].states


def test_drain_requeues_listed_jobs_and_backfill_respects_reservation() -> None:
    requeued: list[int] = []
    s = cluster(2, requeued)
    s.start(7, ("n0",), 8, 100.0, "pretrain")
    s.apply(Plan((DrainNode("n0", "fleetyield: approved", (7,), "approved"),)))
    assert requeued == [7]
    s2 = cluster(2)
    s2.start(5, ("n0",), 8, 50.0, "batch")
    # head gang needs both nodes: reserved from t=50; a long 1-node job may not take n1, a short one may
    q = [(1, frozenset(), 2, 8, 10.0), (2, frozenset(), 1, 8, 100.0), (3, frozenset(), 1, 8, 40.0)]
    assert s2.schedule(0.0, q) == [(3, ("n1",))]


def test_reclaim_requeue_requeues_only_running_listed_jobs() -> None:
    requeued: list[int] = []
    s = cluster(2, requeued)
    s.start(7, ("n0",), 4, 100.0, "batch")
    s.start(8, ("n0",), 4, 100.0, "batch")
    report = s.apply(Plan((RequeueJobs("n0", (7, 9), 3, "premium reclaim: ..."),)))  # 9: not running
    assert requeued == [7] and report.results[0].command == ("scontrol", "requeue", "7,9")
    assert not s.read_nodes()["n0"].drained_by_us  # a requeue drains nothing


def _plain_schedule(
    s: SimSlurm, now: float, queue: list[tuple[int, frozenset[str], int, int, float]]
) -> list[tuple[int, tuple[str, ...]]]:
    """The scheduling rules written as plainly as possible (every node, every job): the reference."""
    usable = [n for n in s.nodes.values() if not n.drain and not n.down]
    placed: list[tuple[int, tuple[str, ...]]] = []
    shadow: float | None = None
    reserved: frozenset[str] = frozenset()
    taken: dict[str, int] = {}
    for job_id, constraint, nn, gpn, remaining in queue[: s.bf_max_job_test]:
        cand = sorted((n for n in usable if constraint <= set(n.features)), key=lambda n: (n.weight, n.name))
        pick = [
            n.name
            for n in cand
            if n.free - taken.get(n.name, 0) >= gpn
            and not (shadow is not None and n.name in reserved and now + remaining > shadow)
        ][:nn]
        if len(pick) == nn:
            for name in pick:
                taken[name] = taken.get(name, 0) + gpn
            placed.append((job_id, tuple(pick)))
            continue
        if shadow is None:
            avail = []
            for n in cand:
                free = n.free - taken.get(n.name, 0)
                t = now if free >= gpn else None
                for end, g in sorted(
                    (s.running[j].end, s.running[j].gpus_per_node) for j in s.on_node[n.name]
                ):
                    if t is not None:
                        break
                    free += g
                    if free >= gpn:
                        t = end
                if t is not None:
                    avail.append((t, (n.weight, n.name), n.name))
            avail.sort()
            if len(avail) < nn:
                shadow, reserved = float("inf"), frozenset()
            else:
                shadow, reserved = avail[nn - 1][0], frozenset(a[2] for a in avail[:nn])
    return placed


def test_fast_pass_places_exactly_like_the_plain_rules() -> None:
    """Random fleets, features, weights, drains, running jobs and queues (ends that tie with ``now``
    included): the indexed scheduler and the plain scan place the same jobs on the same nodes, pass after
    pass, while jobs start, end, move their end and features change between passes."""
    import random

    feats = ("fy_a", "fy_b", "fy_c")
    for seed in range(40):
        rng = random.Random(seed)
        s = SimSlurm([(f"n{i:02d}", 8, "h100", ("h100",)) for i in range(rng.randint(2, 24))], None, 20)
        jid = 0
        now = 0.0
        for _ in range(25):
            for name in s.nodes:
                r = rng.random()
                if r < 0.2:
                    fs = tuple(sorted({"h100", *rng.sample(feats, rng.randint(0, 3))}))
                    s.set_features(name, fs, rng.choice((1, 1, 5, 50)))
                elif r < 0.23:
                    s.set_drain(name, "x")
                elif r < 0.27:
                    s.resume(name)
                elif r < 0.29:
                    s.set_down(name, rng.random() < 0.5)
            for j in list(s.running):
                if rng.random() < 0.3:
                    s.finish(j)
                elif rng.random() < 0.05:
                    s.extend(j, rng.choice((60.0, 600.0)))
            queue = []
            for _ in range(rng.randint(0, 40)):
                jid += 1
                c = frozenset(rng.sample(feats, rng.randint(0, 2)))
                nn = rng.choice((1, 1, 1, 2, 3))
                queue.append(
                    (
                        jid,
                        c,
                        nn,
                        rng.choice((1, 2, 4, 8)) if nn == 1 else 8,
                        rng.choice((60.0, 600.0, 6000.0)),
                    )
                )
            want = _plain_schedule(s, now, queue)
            assert s.schedule(now, queue) == want, (seed, now)
            for c in {q[1] for q in queue}:  # the kept lists of open nodes are the plain filter's
                plain = sorted(
                    (n for n in s.nodes.values() if c <= set(n.features) and not n.drain and not n.down),
                    key=lambda n: (n.weight, n.name),
                )
                assert s.open_candidates(c) == [n for n in plain if n.free > 0], (seed, now, c)
            for job_id, nodes in want:
                if rng.random() < 0.8:
                    gpn = next(q[3] for q in queue if q[0] == job_id)
                    end = now + rng.choice((60.0, 120.0, 600.0, 3600.0))
                    s.start(job_id, nodes, gpn, end, "batch")
            now += 60.0
