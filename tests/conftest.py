"""Root of the test tree. Being a conftest in a directory without ``__init__.py``, pytest (default
``prepend`` import mode) puts this directory on ``sys.path``, so the shared rig (``tests/rig.py``) imports as
``rig`` from every test directory."""

import pytest


@pytest.fixture
def tier_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Runner(fleet)`` without params runs the tier rule (tests/core/builders.py ``TIER_RULE``): for the
    tests of the mechanisms that serve it (premium widening, reclaim, gang widening, keep-open, proposals at
    red)."""
    from core.builders import Runner, tier_params

    monkeypatch.setattr(Runner, "default_params", staticmethod(tier_params))
