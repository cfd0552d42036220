"""The ring files' cluster block (test_ring3.py, test_ring4.py), written once: each file's one ring, up from
unaddressed cables (rings.py), `topology` run on it before anything is addressed, each node's forwarding as
bootstrap will find it, the first bootstrap, and the ring down after the file; and the three checks every ring
passes, a test class each file collects on its own ring. A file makes its fixture with `ring_fixture` and names it
`ring_cluster`: no cluster is started beyond the one each file started before."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from sparkcluster.sim import SimCluster
from tests.support.rings import (
    bootstrap,
    comm_env_is_the_rings,
    each_cable_its_own_subnets,
    forwarding_state,
    found_before_addressing,
    ring,
    topology,
)


@dataclass(frozen=True)
class Ring:
    cluster: SimCluster
    before: dict  # `topology --json` on the unaddressed cables (discovery on IPv6 link-local alone)
    code: int  # its exit code
    first: subprocess.CompletedProcess  # the first bootstrap's
    found: dict[str, dict[str, str]]  # each node's forwarding and rp_filter before bootstrap (forwarding_state)
    configs: pytest.TempPathFactory  # where a later bootstrap keeps its XDG config

    @property
    def bootstrapped(self) -> SimCluster:
        """The ring, its first bootstrap done (what the tests after the first three take)."""
        assert self.first.returncode == 0, self.first.stdout + self.first.stderr
        return self.cluster


def ring_fixture(count: int, tag: str, *, needs_torch: bool = False) -> Callable[..., Iterator[Ring]]:
    """The module-scoped fixture of a file's ring of `count` nodes (`needs_torch`: skipped without it)."""
    @pytest.fixture(scope="module")
    def ring_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ring]:
        if needs_torch:
            pytest.importorskip("torch")
        c = ring(count, tag)
        try:
            code, before = topology(c)
            found = {h.name: forwarding_state(c, h.name) for h in c.topology.hosts}
            first = bootstrap(c, tmp_path_factory.mktemp("cfg"))
            yield Ring(c, before, code, first, found, tmp_path_factory)
        finally:
            c.down()
    return ring_cluster


class TestEveryRing:
    """What every ring passes, on the collecting file's `ring_cluster`."""

    def test_topology_finds_every_cable_before_anything_is_addressed(self, ring_cluster: Ring) -> None:
        found_before_addressing(ring_cluster.cluster, ring_cluster.code, ring_cluster.before)

    def test_bootstrap_gives_each_cable_its_own_subnets_then_changes_nothing(self, ring_cluster: Ring) -> None:
        each_cable_its_own_subnets(ring_cluster.cluster, ring_cluster.first, ring_cluster.configs.mktemp("cfg"))

    def test_neighbours_answer_over_each_link_and_the_comm_env_is_the_rings(self, ring_cluster: Ring) -> None:
        comm_env_is_the_rings(ring_cluster.cluster, ring_cluster.first)
