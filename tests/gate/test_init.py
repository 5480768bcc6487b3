"""The package surface (slurm_fleetyield/gate/__init__.py): lazy exports, nothing heavy for the pure core."""

from __future__ import annotations

import subprocess
import sys

import slurm_fleetyield.gate as gate


def test_every_export_resolves_to_its_module() -> None:
    for name in gate.__all__:
        obj = getattr(gate, name)
        module = gate._EXPORTS[name]
        assert getattr(sys.modules[f"slurm_fleetyield.gate.{module}"], name) is obj
    assert sorted(gate.__all__) == sorted(gate._EXPORTS)


def test_proposal_module_stays_pure() -> None:
    code = (
        "import sys, slurm_fleetyield.gate.proposal;"
        "heavy = ('cryptography', 'sqlite3', 'slurm_fleetyield.gate.gatekeeper');"
        "bad = [m for m in heavy if m in sys.modules];"
        "sys.exit(repr(bad) if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
