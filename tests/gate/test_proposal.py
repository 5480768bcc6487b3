"""The Proposal model (slurm_fleetyield/gate/proposal.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from slurm_fleetyield.gate.proposal import (
    PROPOSAL_ID_RE,
    Proposal,
    ProposalStatus,
    new_proposal_id,
    proposal_ids_in_reason,
)

from .helpers import T0, make_proposal


def test_ids_are_short_and_unique() -> None:
    ids = {new_proposal_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(PROPOSAL_ID_RE.fullmatch(i) for i in ids)


def test_new_is_pending_and_expires_after_ttl() -> None:
    p = Proposal.new(node="n1", gpus=[0, 5], risk=0.9, evidence="e", now=T0, ttl_s=60)
    assert p.status is ProposalStatus.PENDING and p.settled_at is None
    assert p.expires_at == T0 + 60 and p.gpus == (0, 5)
    assert p.is_open(T0 + 59.9) and not p.is_open(T0 + 60)


def test_settled_is_a_new_final_value() -> None:
    p = make_proposal()
    s = p.settled(ProposalStatus.APPROVED, T0 + 1, "alice")
    assert (s.status, s.settled_at, s.settled_by) == (ProposalStatus.APPROVED, T0 + 1, "alice")
    assert p.status is ProposalStatus.PENDING and not s.is_open(T0 + 1)
    with pytest.raises(ValueError):
        p.settled(ProposalStatus.PENDING, T0, "x")


def test_json_round_trip() -> None:
    p = make_proposal()
    assert Proposal.model_validate_json(p.model_dump_json()) == p


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "p-XYZ"},
        {"node": "has space"},
        {"gpus": (-1,)},
        {"risk": float("nan")},
        {"ttl_s": 0},
        {"evidence": "x" * (64 * 1024 + 1)},
    ],
)
def test_invalid_proposals_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        make_proposal(**bad)


def test_final_status_needs_settled_at() -> None:
    data = make_proposal().model_dump()
    data["status"] = "approved"
    with pytest.raises(ValidationError, match="settled_at"):
        Proposal.model_validate(data)


def test_reason_references() -> None:
    assert proposal_ids_in_reason("fleetyield advice #p-0123456789ab, done by hand") == ["p-0123456789ab"]
    assert proposal_ids_in_reason("#p-0123456789ab #p-aaaaaaaaaaaa") == ["p-0123456789ab", "p-aaaaaaaaaaaa"]
    assert proposal_ids_in_reason("p-0123456789ab without hash") == []
    assert proposal_ids_in_reason("#p-0123456789abc too long") == []
