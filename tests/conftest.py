"""Shared fixtures: a session-scoped simulated cluster built with the same code as `sparkcluster sim`, and
no_connection (tests/support/refusals.py), under which a test fails if anything connects."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sparkcluster.sim import SimCluster, UpOptions
from tests.support.helpers import SESSION_DRIVERS, SESSION_HOSTS, require_sim, unique_name
from tests.support.refusals import no_connection  # noqa: F401 (a fixture every test may ask for)


def pytest_configure(config: pytest.Config) -> None:
    # scripts/test.sh runs the unit tests in two processes, then the `serial` ones alone: they time a stub
    # server to a few percent, which a busy second core would skew.
    config.addinivalue_line("markers", "serial: measures a clock closely; run alone, never beside another test")


@pytest.fixture(scope="session")
def cluster() -> Iterator[SimCluster]:
    """Three Sparks with a Docker engine each; spark-2 runs a 580 driver. Tests that change a host's
    disk or processes must use `fresh_host` (or restore what they changed)."""
    require_sim(docker=True)
    c = SimCluster.up(UpOptions(count=SESSION_HOSTS, name=unique_name("session"), drivers=SESSION_DRIVERS))
    try:
        yield c
    finally:
        c.down()


@pytest.fixture
def fresh_host(cluster: SimCluster) -> Iterator[str]:
    """spark-3, reset to a fresh disk after the test, whatever the test did to it."""
    yield "spark-3"
    cluster.reset("spark-3")
