"""The simulator and the live controller decide the same thing for the same observations AND the same admin.

``test_equivalence.py`` covers the machine's part of the loop; this covers the one human step. A stream is
recorded from a simulated fleet whose simulated admin approves pre-emptive drain proposals, with the
``GateDecision``s each tick received. It is then fed (a) through ``sim.runner.controller_step`` with those
decisions, and (b) through ``Daemon.tick_once`` with a real gate: the executor records the core's proposals in
a ``Gatekeeper``, and each approval is made as an admin makes it, BEFORE the tick at which the simulator's
decision arrives: ``fleetyield approve <id> --key <enrolled key> --config <cfg>`` (click's CliRunner) reads
the proposal from the gate, signs it and POSTs it to the daemon's real approval listener (``IngestServer``);
the daemon's intake then delivers it (re-sent every tick until Slurm shows the drain). Plans, decisions and
states must be identical tick by tick.

The simulated admin is enrolled under its own name (``runner.SIM_ADMIN``) and its laptop's clock is the
simulated clock (``gate.approvals``' time source), so the shell's fields of a decision (who, when) are the
simulator's as they are: the gate must record exactly ``GateDecision.admin`` and ``GateDecision.time``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rig import approval_listener

from sim.fleets import fault_heavy
from sim.test_equivalence import Replay, ReplayAgents, record_steps
from slurm_fleetyield.adapters.store import Store
from slurm_fleetyield.cli import main
from slurm_fleetyield.config import from_mapping
from slurm_fleetyield.core.plan import DrainNode
from slurm_fleetyield.core.state import ControllerState
from slurm_fleetyield.daemon import Daemon, TickOutcome
from slurm_fleetyield.executor import GateAccess
from slurm_fleetyield.gate import Gatekeeper, keygen
from slurm_fleetyield.gate import approvals as approvals_mod
from slurm_fleetyield.sim import runner

# test_approval.py's fleet: the simulated admin approves within the first day; the second approval's drain is
# held by the drain cap for hours (the daemon re-sends it every tick meanwhile)
# under the tier rule (tests/core/builders.py TIER_RULE): proposals at red without the stake rule's pay test
CORE = {
    "stake": {"enabled": False},
    "premium": {"reserve": True},
    "reclaim": {"enabled": True},
    "learn": {"enabled": False},  # absolute tier thresholds (price.relative): the drain cap holds one drain
    # nodes parked for a human count against the cap (issue 27 item 10): a 12-node fleet at this fault rate
    # keeps a 1-node cap full, so two nodes, which still hold one approval for hours
    "quarantine": {"drain_cap_fraction": 0.2},
}
CFG = dict(nodes=12, days=10, seed=23, lead_h=12.0, core=json.dumps(CORE))
N_FRAMES = 150  # enough for two approved drains now that parked (needs-human) nodes hold the drain cap
RNG_SEED = f"tick-{CFG['seed']}"  # the simulator's controller rng: the replay draws the recorded proposal ids


def record() -> list:
    """(now, nodes, jobs, samples, pending fatal events, gate decisions) of every controller step."""
    return record_steps(fault_heavy(**CFG))[:N_FRAMES]


@pytest.fixture(scope="module")
def frames() -> list:
    return record()


def simulator_path(frames: list) -> list:
    port = Replay(frames)
    state = ControllerState.empty()
    rng = random.Random(RNG_SEED)
    results = []
    for i, (now, _n, _j, samples, pending, decisions) in enumerate(frames):
        port.i = i
        r = runner.controller_step(
            state,
            port,
            samples,
            pending,
            runner.policy_params("fleetyield", CFG["core"]),
            now,
            rng,
            gate_decisions=decisions,
        )
        state = r.state
        results.append(r)
    return results


def daemon_path(
    frames: list, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, submit: bool = True
) -> Iterator[tuple[int, TickOutcome, Daemon]]:
    """Tick the daemon through the stream; each simulated approval is signed and submitted first."""
    clock = {"t": 0.0}
    # the admin's wall clock is the simulated clock (the CLI signs at ``approvals._time.time()``)
    monkeypatch.setattr(approvals_mod, "_time", SimpleNamespace(time=lambda: clock["t"]))
    key, pub = keygen(runner.SIM_ADMIN, tmp / "keys")
    auth = tmp / "authorized_keys"
    auth.write_text(pub.read_text())
    auth.chmod(0o644)
    gate_dir = tmp / "gate"
    config = from_mapping(
        {"sense": {"gpu_nodes_only": False}, "loop": {"push_reuse_samples_s": 0}, "core": CORE}
    )
    store = Store(tmp / "fy.db")
    port = Replay([f[:5] for f in frames])
    gate = GateAccess(gate_dir)
    daemon = Daemon(
        config,
        port,
        port,
        store,
        clock=lambda: clock["t"],
        monotonic=lambda: 0.0,
        rng=random.Random(RNG_SEED),
        control=ReplayAgents(),  # type: ignore[arg-type]
        gate=gate,
    )
    listener, cfg = approval_listener(
        tmp, store, gate_dir, auth, b"equivalence-push-secret", clock=lambda: clock["t"]
    )
    cli = CliRunner()
    try:
        for i, (now, _n, _j, _s, pending, decisions) in enumerate(frames):
            port.i = i
            clock["t"] = now
            for d in decisions if submit else ():
                out = cli.invoke(
                    main, [d.action, d.proposal_id, "--key", str(key), "--config", str(cfg), "--json"]
                )
                assert out.exit_code == 0, out.output
                doc = json.loads(out.output)
                assert doc["http_status"] == 200 and doc["status"] == f"{d.action}d", doc
                with Gatekeeper.open(gate_dir) as gk:  # the shell's fields are the simulator's as they are
                    p = gk.get(d.proposal_id)
                    assert (p.node, p.settled_by, p.settled_at) == (d.node, d.admin, d.time)
            store.put_events(list(pending), received_at=now)
            yield i, daemon.tick_once(push=bool(pending)), daemon
    finally:
        listener.stop()
        gate.close()
        store.close()


def test_a_signed_approval_through_the_daemons_gate_decides_as_the_simulated_admin(
    frames: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    approvals = [(i, d) for i, f in enumerate(frames) for d in f[5]]
    assert len(approvals) >= 2 and all(d.action == "approve" for _, d in approvals)
    sim_results = simulator_path(frames)
    approved = {
        (i, a.node): a
        for i, r in enumerate(sim_results)
        for a in r.plan.of_kind("drain")
        if isinstance(a, DrainNode) and a.cause == "approved"
    }
    assert len(approved) >= 2, "the stream must contain drains for approvals"
    # one approval drains at once, one is held by the drain cap and drains at a later tick
    assert any((i, d.node) in approved for i, d in approvals)
    assert any(
        (i, d.node) not in approved
        and any(h.node == d.node and h.rule == "drain_cap" for h in sim_results[i].plan.holds)
        for i, d in approvals
    )
    # each approval drains its node, the drain naming the admin and the proposal -- unless the cap held it
    # until the proposal closed (expired, or withdrawn because the node faulted and NHC drained it first;
    # the node is proposed, approved and drained anew later)
    closes = ("proposal_expired", "proposal_withdrawn")
    expired = {e.data.get("proposal_id") for r in sim_results for e in r.events if e.kind in closes}
    named = 0
    for i, d in approvals:
        drains = [a for (j, node), a in approved.items() if j >= i and node == d.node]
        assert drains, f"the approval of {d.node} never drained it"
        mine = [a for a in drains if f"[approved by {runner.SIM_ADMIN} #{d.proposal_id}]" in a.reason]
        assert mine or d.proposal_id in expired, f"approval {d.proposal_id}: drained as {drains[0].reason}"
        named += bool(mine)
    assert named >= 2
    executed: set[str] = set()
    for i, out, daemon in daemon_path(frames, tmp_path, monkeypatch):
        a = sim_results[i]
        now = frames[i][0]
        assert out.result.plan == a.plan, f"tick {i} at {now}: plans differ"
        assert dict(out.result.nodes) == dict(a.nodes), f"tick {i}: decisions differ"
        assert out.result.state == a.state, f"tick {i}: states differ"
        executed = daemon.store.gate_marked("executed")
    with Gatekeeper.open(tmp_path / "gate") as gk:
        assert {d.proposal_id: gk.get(d.proposal_id).status.value for _, d in approvals} == {
            d.proposal_id: "approved" for _, d in approvals
        }
        assert gk.verify_audit().ok
    # Slurm showed each approved drain naming its proposal: the intake marked it executed, no longer re-sent
    assert {d.proposal_id for _, d in approvals} <= executed


def test_without_the_signed_approval_the_daemon_does_not_drain(
    frames: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison has teeth: with no approval submitted the two paths part at the first approval."""
    first = next(i for i, f in enumerate(frames) if f[5])
    sim_results = simulator_path(frames[: first + 1])
    for i, out, _d in daemon_path(frames[: first + 1], tmp_path, monkeypatch, submit=False):
        if i < first:
            assert out.result.plan == sim_results[i].plan and out.result.state == sim_results[i].state
        else:
            drains = sim_results[i].plan.of_kind("drain")
            assert any(isinstance(a, DrainNode) and a.cause == "approved" for a in drains)
            assert not out.result.plan.of_kind("drain") and out.result.plan != sim_results[i].plan
            assert out.result.state != sim_results[i].state
