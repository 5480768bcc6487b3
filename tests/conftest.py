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


@pytest.fixture(scope="session")
def pg_cluster():
    """One real PostgreSQL server for the session (tests/pgcluster.py). Without PostgreSQL binaries the
    tests that need it skip, unless CI is set: there a missing PostgreSQL is a failure."""
    import os

    from pgcluster import PgCluster, bindir

    found = bindir()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(
                "CI is set but no PostgreSQL binaries were found (pg_config, /usr/lib/postgresql/*/bin)"
            )
        pytest.skip("no PostgreSQL binaries (install Debian's postgresql package)")
    cluster = PgCluster(found)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """The URL of a fresh, empty PostgreSQL database."""
    return pg_cluster.database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """Where a store test's ``Store`` lives: an SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "fy.db")
    return request.getfixturevalue("pg_url")
