"""Fixtures for the gate tests: two authorized admins (plus an unauthorized one) and a pending proposal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_fleetyield.gate.keys import AdminKey, keygen, load_authorized_keys
from slurm_fleetyield.gate.proposal import Proposal

from .helpers import make_proposal


@dataclass(frozen=True)
class Admins:
    dir: Path
    alice: Path  # private key paths
    bob: Path
    mallory: Path  # has a key pair but is not in authorized_keys
    authorized_file: Path
    keys: dict[str, AdminKey]


@pytest.fixture(scope="session")
def admins(tmp_path_factory: pytest.TempPathFactory) -> Admins:
    d = tmp_path_factory.mktemp("keys")
    alice, alice_pub = keygen("alice", d)
    bob, bob_pub = keygen("bob", d)
    mallory, _ = keygen("mallory", d)
    auth = d / "authorized_keys"
    auth.write_text("# FleetYield admins\n\n" + alice_pub.read_text() + bob_pub.read_text())
    auth.chmod(0o644)
    return Admins(d, alice, bob, mallory, auth, load_authorized_keys(auth))


@pytest.fixture
def proposal() -> Proposal:
    return make_proposal()
