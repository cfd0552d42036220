"""Round 5's M5: a ring's middle node lost mid-`stage`. The next node is re-sourced on an address it can reach (on
a 3-ring the head is its neighbour: a second sender on the head's address facing it), and where no cable joins
it to any node left (a 4-ring's diagonal), the message says its source in the chain went away, not that a healthy
cable failed.

The chain runs against scripted nodes: a blob sender listens on the address it was bound to; a fetch connects only
to an address on a subnet the fetching node holds (else `Network is unreachable`, as the kernel says), and only
where a sender listens; a node that is gone raises Unreachable for every command."""

from __future__ import annotations

import shlex
from dataclasses import replace
from ipaddress import IPv4Interface, ip_address
from pathlib import Path

from sparkcluster.engine.command import Command
from sparkcluster.engine.facts import HostFacts
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.modelref import ModelRef
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result, Unreachable
from sparkcluster.node.network import facing
from sparkcluster.staging.blobwire import EXIT_CONNECTION
from sparkcluster.staging.chain import Chain, CopyJob, NodeResult, StageResult, detour
from sparkcluster.staging.hfcache import Manifest, NodeModel, NodeStatus, SnapshotFile
from tests.support.fabric import RING3, RING4, TWINS, node

MODEL = ModelRef("org/tiny")
BLOB = SnapshotFile("model.safetensors", "b" * 64, 10)


def addressed_ring(cables: list[tuple[str, int, str, int]]) -> dict[str, HostFacts]:
    """A ring as bootstrap addresses it: wire w on 10.103.w.0/24, node i at .1i."""
    names = list(dict.fromkeys(n for a, _, b, _ in cables for n in (a, b)))
    ipv4: dict[str, dict[str, str]] = {n: {} for n in names}
    for c, (a, pa, b, pb) in enumerate(cables):
        for t in (0, 1):
            for n, p in ((a, pa), (b, pb)):
                ipv4[n][TWINS[p][t]] = f"10.103.{2 * c + t}.1{names.index(n) + 1}/24"
    return {n: node(i, {0, 1}, ipv4[n]) for i, n in enumerate(names, start=1)}


class Cluster:
    def __init__(self, facts: dict[str, HostFacts], lost_when_fetched: str) -> None:
        self.facts, self.lost_when_fetched = facts, lost_when_fetched
        self.gone: set[str] = set()
        self.listening: dict[str, str] = {}  # "address:port" -> node
        self.fetched: list[tuple[str, str]] = []  # (node, the endpoint it fetched from)

    def holds(self, name: str) -> list[IPv4Interface]:
        return [a for i in self.facts[name].interfaces for a in i.ipv4]


class ScriptedNode:
    def __init__(self, host: Host, cluster: Cluster) -> None:
        self.host, self.cluster = host, cluster

    def run(self, command: Command) -> Result:
        c, name = self.cluster, self.host.name
        if name in c.gone:
            raise Unreachable(f"{self.host.address} dropped off while running {command.label()}: gone", "power on")
        words = shlex.split(command.script) if "blobwire" in command.name else []
        arg = {k: v for k, v in zip(words, words[1:]) if k.startswith("--")}
        if command.name.startswith("`blobwire serve`"):
            port = 40000 + len(c.listening)
            c.listening[f"{arg['--bind']}:{port}"] = name
            return Result(command, 0, f"{port} {port}\n", "", 0.0)
        if command.name.startswith("`blobwire fetch"):
            endpoint, ip = arg["--connect"], ip_address(arg["--connect"].rsplit(":", 1)[0])
            if not any(ip in a.network and str(a.ip) == arg["--source"] for a in c.holds(name)):
                return Result(command, EXIT_CONNECTION, "", f"blobwire: cannot connect to {endpoint}: [Errno 101] "
                              "Network is unreachable", 0.0)
            source = c.listening[endpoint]
            c.fetched.append((name, endpoint))
            if source == c.lost_when_fetched and source not in c.gone and name != source:
                c.gone.add(source)  # powered off while it sends
                return Result(command, EXIT_CONNECTION, "", "blobwire: connection reset by peer", 0.0)
            return Result(command, 0, "", "", 0.0)
        return Result(command, 0, "", "", 0.0)  # mkdir, df, links, finalize, stopping a sender ...


def stage_along(facts: dict[str, HostFacts], lost: str) -> tuple[StageResult, Cluster]:
    names = list(facts)
    hosts = tuple(Host(n, f"192.168.103.1{i}", "head" if i == 1 else "worker") for i, n in enumerate(names, 1))
    cluster = Cluster(facts, lost)
    session = Session(Inventory(Path("inv.yml"), "t", hosts, {}),
                      {h.name: ScriptedNode(h, cluster) for h in hosts}, facts)  # type: ignore[misc]
    # Each node's own address is its first twin's; each step of the chain runs on the cable between the two.
    own = {n: str(f.interface("enp1s0f0np0").ipv4[0].ip) for n, f in facts.items()}  # type: ignore[union-attr]
    hops = {(a, b): ends for a, b in zip(names, names[1:]) if (ends := facing(facts[a], facts[b]))}
    scans = {n: NodeModel(f"/home/spark/hub/{n}", None, (), ()) for n in names}
    statuses = {n: NodeStatus("complete") if n == names[0] else NodeStatus("missing", (BLOB.blob,)) for n in names}
    result = StageResult(str(MODEL), "c" * 40, names[0], {n: NodeResult(s.state) for n, s in statuses.items()})
    result.nodes[names[0]].state = "complete"
    job = CopyJob(session, MODEL, scans, "tcp", 1, lambda done: None)
    Chain(job, Manifest(MODEL, "c" * 40, (BLOB,)), names, statuses, own, result, hops).run()
    return result, cluster


def test_a_3_ring_losing_its_middle_node_refetches_from_the_head_on_the_cable_between_them():
    result, cluster = stage_along(addressed_ring(RING3), lost="spark-2")
    assert result.nodes["spark-3"].state == "complete", result.nodes["spark-3"].error
    # spark-1's address on its own cable with spark-3 (wire 4), not the one facing spark-2 (wire 0)
    assert cluster.fetched[-1] == ("spark-3", "10.103.4.11:40002")
    assert result.nodes["spark-2"].state == "failed" and "dropped off" in result.nodes["spark-2"].error


def test_a_4_ring_node_with_no_cable_to_any_node_left_names_its_lost_source_not_a_cable():
    result, _ = stage_along(addressed_ring(RING4), lost="spark-2")
    spark3 = result.nodes["spark-3"]
    assert (spark3.state, spark3.error, spark3.fix) == (
        "failed",
        "spark-2, the chain's source for spark-3, went away, and spark-1, the nearest node before it that is left, "
        "shares no subnet with spark-3 (no cable joins them); spark-3 was not staged (its partial copy is kept)",
        "bring spark-2 back (check that it is powered on and reachable), then run `sparkcluster stage org/tiny` "
        "again: it resumes where this stopped")
    assert result.nodes["spark-4"].state == "complete"  # the head's neighbour on the other side


def test_a_detour_uses_own_addresses_where_one_subnet_joins_them():
    facts = addressed_ring(RING3)
    assert detour("10.103.4.11", "10.103.2.13", facts["spark-1"], facts["spark-3"]) == ("10.103.4.11", "10.103.4.13")
    switch = {n: replace(f, interfaces=tuple(replace(i, ipv4=(f"10.100.0.1{k}/24",)) if i.name == "enp1s0f0np0" else i
                                             for i in f.interfaces)) for k, (n, f) in enumerate(facts.items(), 1)}
    assert detour("10.100.0.11", "10.100.0.13", switch["spark-1"], switch["spark-3"]) == ("10.100.0.11", "10.100.0.13")
