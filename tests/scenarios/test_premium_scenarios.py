"""Premium widening scenario table: (fleet, queue, expected premium nodes carrying fy_ok_decode), via tick."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from core.builders import H100, L40S, Fleet, Runner
from core.builders import tier_params as Params  # the tier rule's mechanisms (builders.TIER_RULE)

from slurm_fleetyield.core.model import JobView, WorkloadClass

D, P, F = WorkloadClass.DECODE, WorkloadClass.PRETRAIN, WorkloadClass.FINETUNE


pytestmark = pytest.mark.usefixtures("tier_rule")  # Runner() runs builders.TIER_RULE


@dataclass
class Case:
    name: str
    premium: int
    nonpremium: int
    running: tuple[tuple[int, tuple[str, ...], WorkloadClass, int], ...] = ()
    pending: tuple[tuple[int, WorkloadClass, int], ...] = ()
    lent: int = 0
    lacks: tuple[str, ...] = field(default_factory=tuple)
    premium_params: dict[str, float] = field(default_factory=dict)


FRESH = {"claim_grace_s": 3600.0}  # pending premium jobs keep their claim for the whole scenario


CASES = [
    Case("quiet fleet: nothing lent", 4, 2),
    Case("decode fits on an idle L40S: nothing lent", 4, 2, pending=((1, D, 8),)),
    Case("decode stuck, L40S full: one node lent", 4, 1, ((9, ("l0",), D, 8),), ((1, D, 8),), lent=1),
    Case(
        "decode stuck, a finetune that fits a premium node waits: nothing lent while its claim holds",
        1,
        1,
        ((9, ("l0",), D, 8),),
        ((1, D, 8), (2, F, 4)),
        premium_params={**FRESH, "reserve_nodes": 0, "reserve_fraction": 0.0},
    ),
    Case(
        "... Slurm did not start that finetune within claim_grace_s: the claim lapsed, the node is lent",
        1,
        1,
        ((9, ("l0",), D, 8),),
        ((1, D, 8), (2, F, 4)),
        lent=1,
        premium_params={"reserve_nodes": 0, "reserve_fraction": 0.0},
    ),
    Case(
        "decode flood: all but the 1-node reserve",
        4,
        1,
        ((9, ("l0",), D, 8),),
        tuple((i, D, 8) for i in range(9)),
        lent=3,
    ),
    Case(
        "10 premium nodes: reserve is 10% (1 node)",
        10,
        1,
        ((9, ("l0",), D, 8),),
        tuple((i, D, 8) for i in range(20)),
        lent=9,
    ),
    Case(
        "2-node gang can start: it claims two premium nodes, decode borrows one of the others",
        4,
        1,
        ((9, ("l0",), D, 8),),
        ((1, D, 8), (2, P, 16)),
        lent=1,
        premium_params=FRESH,
    ),
    Case(
        "3-node gang blocked (2 premium nodes idle): decode borrows the idle ones beyond the reserve",
        4,
        1,
        ((9, ("l0",), D, 8), (8, ("h0", "h1"), P, 16)),
        ((1, D, 8), (2, D, 8), (3, D, 8), (4, P, 24)),
        lent=2,  # reserve: the 3-node gang, capped at half the 4 premium nodes
        premium_params=FRESH,
    ),
    Case(
        "... with the whole gang reserved (gang_reserve_max_fraction 1): only one node lent",
        4,
        1,
        ((9, ("l0",), D, 8), (8, ("h0", "h1"), P, 16)),
        ((1, D, 8), (2, D, 8), (3, D, 8), (4, P, 24)),
        lent=1,
        premium_params={**FRESH, "gang_reserve_max_fraction": 1.0},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_premium_widening_table(case: Case) -> None:
    f = Fleet(0)
    for i in range(case.premium):
        f.add(f"h{i}", H100)
    for i in range(case.nonpremium):
        f.add(f"l{i}", L40S)
    for jid, nodes, wl, gpus in case.running:
        f.jobs.append(JobView(jid, "RUNNING", nodes, True, wl, gpus))
        for n in nodes:
            f.slurm_update(n, states=frozenset({"ALLOCATED"}))
    for jid, wl, gpus in case.pending:
        f.jobs.append(JobView(jid, "PENDING", (), True, wl, gpus))
    r = Runner(f, Params(premium=case.premium_params), step=120.0)
    res = r.ticks(6)  # 10 minutes: past lend_after_s
    lent = [n for n, d in res.nodes.items() if d.envelope.premium and "fy_ok_decode" in d.fy_features]
    assert len(lent) == case.lent, (lent, res.nodes[lent[0]].reason if lent else "")
    for n, d in res.nodes.items():
        if not d.envelope.premium:
            assert ("fy_ok_decode" in d.fy_features) is True, n
    # the plan carried it to Slurm: the fleet's features match the decisions
    for n in lent:
        assert "fy_ok_decode" in f.nodes[n].slurm.available_features
