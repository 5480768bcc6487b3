"""The A/B's emulated admin (chaos/admin.py): approves each open proposal once, ``delay_s`` after first seeing
it, through ``fleetyield approve`` in the controller's container; a failing ``pending`` decides nothing."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence

from slurm_fleetyield.chaos import admin, report
from slurm_fleetyield.chaos.log import ChaosLog


class Controller:
    """The exec seam: answers ``fleetyield pending --json`` and records ``approve`` calls."""

    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []
        self.approved: list[str] = []
        self.up = True

    def __call__(self, argv: Sequence[str]) -> tuple[int, str]:
        assert argv[:4] == ("docker", "exec", admin.CONTROLLER, "fleetyield"), argv
        if not self.up:
            return 1, "connection refused"
        if argv[4] == "pending":
            return 0, json.dumps(self.rows)
        assert argv[4] == "approve" and "--key" in argv, argv
        self.approved.append(argv[5])
        for r in self.rows:
            if r["id"] == argv[5]:
                r["status"] = "approved"
        return 0, json.dumps({"http_status": 200, "status": "approved"})


def test_each_proposal_is_approved_once_after_the_delay():
    ctl, now, buf = Controller(), [1000.0], io.StringIO()
    a = admin.Admin(ctl, 8.0, lambda: now[0], ChaosLog(buf))
    ctl.rows = [{"id": "p-000000000001", "node": "gpu-h100-1", "risk": 0.6, "status": "pending"}]
    assert a.step() == []  # seen now: not yet
    now[0] += 7.9
    assert a.step() == [] and ctl.approved == []
    now[0] += 0.2
    assert a.step() == ["p-000000000001"] and ctl.approved == ["p-000000000001"]
    ctl.rows[0]["status"] = "pending"  # even if the controller still lists it: decided once
    now[0] += 30
    assert a.step() == [] and ctl.approved == ["p-000000000001"]
    recs = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [r["type"] for r in recs] == ["admin_seen", "admin_approve"]
    assert recs[1]["after_s"] == 8.1 and recs[1]["rc"] == 0 and recs[1]["node"] == "gpu-h100-1"


def test_a_controller_that_does_not_answer_decides_nothing():
    ctl = Controller()
    ctl.rows = [{"id": "p-000000000002", "node": "n", "status": "pending"}]
    ctl.up = False
    a = admin.Admin(ctl, 0.0, lambda: 0.0)
    assert a.step() == [] and a.seen == {}


def test_the_report_says_whether_an_admin_approved_proposals():
    assert "no admin approves drain proposals" in report._admin_text(None)
    assert "approves each drain proposal 8 s after it appears" in report._admin_text(8.0)
