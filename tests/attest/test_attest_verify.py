"""slurm_fleetyield/attest/verify: every rejection of the brief, and zero false fails on clean quotes."""

from __future__ import annotations

from pathlib import Path

import pytest
from attest_rig import NODE, Clock, Controller, make_attestor

from node_agent.attest import keys as node_keys
from node_agent.attest.quote import build_quote
from node_agent.attest.service import Attestor, implant_module
from slurm_fleetyield.attest.verdict import check, drain_reason


def _names(verdict: dict) -> list[str]:
    return [d["name"] for d in verdict["differences"]]


def test_clean_quote_passes(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    v = ctl.handover(attestor, clock.now + 5)
    assert v["status"] == "pass", v["reasons"]
    assert v["authenticated"] and not v["differences"]
    check(v, ctl.key.public_key())
    assert ctl.store.latest_verdict(NODE)["nonce"] == v["nonce"]


def test_fifty_back_to_back_clean_handovers_never_false_fail(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    statuses = []
    for i in range(60):
        statuses.append(ctl.handover(attestor, clock.now + 61 * i)["status"])  # time moves on
    assert statuses == ["pass"] * 60


def test_quote_signed_by_another_key_fails(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    good = attestor.quote(nonce, clock.now)
    from node_agent.attest.chain import Record

    forged = build_quote(
        NODE, nonce, [Record.from_dict(r) for r in good["records"]], Ed25519PrivateKey.generate(), clock.now
    )
    v = ctl.service.attest(NODE, forged, clock.now)
    assert v["status"] == "fail" and not v["authenticated"]
    assert "signature does not verify" in v["reasons"][0]
    assert ctl.store.latest_verdict(NODE) is None  # unauthenticated: never stored, never drains


def test_replayed_nonce_fails(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    quote = attestor.quote(nonce, clock.now)
    assert ctl.service.attest(NODE, quote, clock.now)["status"] == "pass"
    again = ctl.service.attest(NODE, quote, clock.now + 1)
    assert again["status"] == "fail" and again["reasons"][0].startswith("nonce replayed")


def test_unknown_nonce_fails(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    v = ctl.service.attest(NODE, attestor.quote("ee" * 32, clock.now), clock.now)
    assert v["status"] == "fail" and v["reasons"][0].startswith("nonce unknown")


def test_expired_nonce_fails_and_is_burnt(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    quote = attestor.quote(nonce, clock.now)
    v = ctl.service.attest(NODE, quote, clock.now + ctl.service.nonce_ttl_s + 1)
    assert v["status"] == "fail" and v["reasons"][0].startswith("nonce expired")
    assert ctl.service.attest(NODE, quote, clock.now + 1)["reasons"][0].startswith("nonce replayed")


def test_nonce_of_another_node_fails(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    nonce = ctl.service.issue_nonce("gpu-h100-2", clock.now)["nonce"]
    v = ctl.service.attest(NODE, attestor.quote(nonce, clock.now), clock.now)
    assert v["reasons"][0].startswith("nonce wrong_node")


def test_tampered_record_breaks_the_chain(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    """A node (key holder) that edits a record after measuring: the replay no longer gives its pcr."""
    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    quote = attestor.quote(nonce, clock.now)
    quote["records"][2]["digest"] = "00" * 32  # hide a module; value no longer matches either
    quote["records"][2].pop("value")
    key = node_keys.load_or_create(attestor.state_dir)
    resigned = {k: v for k, v in quote.items() if k != "signature"}
    import base64

    from node_agent.attest.quote import signed_payload

    resigned["signature"] = base64.b64encode(key.sign(signed_payload(resigned))).decode()
    v = ctl.service.attest(NODE, resigned, clock.now)
    assert v["status"] == "fail" and any(r.startswith("chain: replay gives") for r in v["reasons"])


def test_edited_quote_without_resigning_fails_signature(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    nonce = ctl.service.issue_nonce(NODE, clock.now)["nonce"]
    quote = attestor.quote(nonce, clock.now)
    quote["records"][0]["value"] = "6.1.0-evil"
    assert "signature does not verify" in ctl.service.attest(NODE, quote, clock.now)["reasons"][0]


@pytest.mark.parametrize(
    ("implant", "record"),
    [
        ("ld_preload", "/etc/ld.so.preload"),
        ("systemd_unit", "/etc/systemd"),
        ("module", "kernel/modules"),
        ("cron", "/var/spool/cron"),
    ],
)
def test_implant_fails_naming_the_record(
    ctl: Controller, attestor: Attestor, clock: Clock, implant: str, record: str
) -> None:
    root = attestor.spec.root
    if implant == "ld_preload":
        (root / "etc/ld.so.preload").write_text("/tmp/.x/libhook.so\n")
    elif implant == "systemd_unit":
        (root / "etc/systemd/system/miner.service").write_text("[Service]\nExecStart=/tmp/.x/m\n")
    elif implant == "module":
        implant_module(attestor.state_dir, "rootkit_x")
    else:
        (root / "var/spool/cron/alice").write_text("@reboot /tmp/.x/m\n")
    v = ctl.handover(attestor, clock.now + 10)
    assert v["status"] == "fail" and v["authenticated"]
    assert _names(v) == [record]
    diff = v["differences"][0]
    assert diff["problem"] == "not_allowed" and diff["actual"] not in diff["expected"]
    assert drain_reason(v) == f"fleetyield: attestation failed ({record})"
    assert ctl.service.gate(NODE, clock.now + 11, 3600) == (False, drain_reason(v))


def test_two_implants_are_both_named(ctl: Controller, attestor: Attestor, clock: Clock) -> None:
    (attestor.spec.root / "etc/ld.so.preload").write_text("/x.so\n")
    implant_module(attestor.state_dir, "rootkit_x")
    v = ctl.handover(attestor, clock.now)
    assert drain_reason(v) == "fleetyield: attestation failed (kernel/modules, /etc/ld.so.preload)"


def test_unknown_node_fails(tmp_path: Path, ctl: Controller, clock: Clock) -> None:
    stranger = make_attestor(tmp_path, clock, node="gpu-h100-9")
    v = ctl.handover(stranger, clock.now)
    assert v["status"] == "fail" and "not enrolled" in v["reasons"][0]


def test_multiple_allowed_values_and_node_overrides(
    tmp_path: Path, ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    """A second golden state (e.g. a kernel upgrade) merged into the policy: both pass."""
    (attestor.spec.root / "proc/sys/kernel/osrelease").write_text("6.1.0-29-amd64\n")
    # another release: its modules come from another /lib/modules tree (none here), so both records move
    assert _names(ctl.handover(attestor, clock.now)) == ["kernel/osrelease", "kernel/module-files"]
    ctl.learn_from(attestor, clock.now)
    assert ctl.handover(attestor, clock.now)["status"] == "pass"
    (attestor.spec.root / "proc/sys/kernel/osrelease").write_text("6.1.0-28-amd64\n")
    assert ctl.handover(attestor, clock.now)["status"] == "pass"


def test_new_record_not_in_policy_is_unexpected(tmp_path: Path, ctl: Controller, clock: Clock) -> None:
    wider = make_attestor(tmp_path, clock, persistence=["/etc/ld.so.preload", "/opt/site/hooks"])
    v = ctl.handover(wider, clock.now)
    assert v["status"] == "fail"
    problems = {d["name"]: d["problem"] for d in v["differences"]}
    assert problems["/opt/site/hooks"] == "unexpected_record"
    assert problems["/etc/systemd"] == "missing_record"


def test_quarantine_candidates_follow_the_latest_verdict(
    ctl: Controller, attestor: Attestor, clock: Clock
) -> None:
    assert ctl.handover(attestor, clock.now)["status"] == "pass"
    assert ctl.service.quarantine_candidates() == []
    (attestor.spec.root / "etc/ld.so.preload").write_text("/x.so\n")
    ctl.handover(attestor, clock.now + 1)
    [(node, reason, _doc)] = ctl.service.quarantine_candidates()
    assert (node, reason) == (NODE, "fleetyield: attestation failed (/etc/ld.so.preload)")
    (attestor.spec.root / "etc/ld.so.preload").unlink()
    assert ctl.handover(attestor, clock.now + 2)["status"] == "pass"
    assert ctl.service.quarantine_candidates() == []
