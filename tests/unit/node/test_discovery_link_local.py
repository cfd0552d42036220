"""Issue 43 (part A): twins left with NVIDIA's link-local addresses (169.254/16 on every twin, as the "Connect two
Sparks" playbook leaves them) are read as the cables make them. A node answers an ARP for any of its addresses on
any wire, so the peer's other twin's 169.254 address answers on this twin's cable too: that is still one device on
the wire, not a switch. The probe outputs are recorded on the simulator (tests/fixtures/discovery/record.py)."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Interface
from pathlib import Path

import pytest

from sparkcluster.engine.facts import HostFacts
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.node.discovery import check_cabling, fabric_from
from sparkcluster.node.fabric import SWITCH, End, Fabric, Kind, Sightings, build_fabric, cabling_problems
from tests.support.fabric import recorded


def discovered(case: str) -> Fabric:
    nodes, facts, answers = recorded(case)
    return fabric_from(nodes, facts, answers)


def direct(fabric: Fabric) -> list[tuple[End, End]]:
    return [(link.a, link.b) for link in fabric.links]


def test_the_recorded_pair_shows_the_peers_other_twin_answering_on_twin_0():
    """The reproduction's cause, in the recording itself: spark-2's twin-1 address answers on twin 0's cable."""
    _, facts, answers = recorded("pair-link-local")
    twin1_of_spark2 = str(facts["spark-2"].interface("enP2p1s0f1np1").ipv4[0].ip)  # type: ignore[union-attr]
    assert twin1_of_spark2.startswith("169.254.") and twin1_of_spark2 in answers["spark-1"]["enp1s0f1np1"]


def test_a_link_local_pair_is_a_pair_twin_to_twin():
    fabric = discovered("pair-link-local")
    assert fabric.kind is Kind.PAIR and fabric.complete
    assert direct(fabric) == [
        (End("spark-1", 1, "enp1s0f1np1"), End("spark-2", 1, "enp1s0f1np1")),
        (End("spark-1", 1, "enP2p1s0f1np1"), End("spark-2", 1, "enP2p1s0f1np1"))]
    assert cabling_problems(fabric, "pair") == []


@pytest.mark.parametrize("case, count", [("ring3-link-local", 3), ("ring4-link-local", 4)])
def test_a_link_local_ring_is_a_ring_of_crosswise_cables(case: str, count: int):
    fabric = discovered(case)
    nodes = tuple(f"spark-{i}" for i in range(1, count + 1))
    assert fabric.kind is Kind.RING and fabric.complete
    assert fabric.ring_order() == nodes and len(fabric.cables()) == count and len(fabric.links) == 2 * count
    # Every cable runs from port 1 of a node to port 0 of the next, each twin to the same twin.
    for link in fabric.links:
        assert {link.a.port, link.b.port} == {0, 1} and link.a.twin == link.b.twin
    assert cabling_problems(fabric, "ring") == []


def test_a_link_local_switch_is_still_a_switch():
    fabric = discovered("switch3-link-local")
    assert fabric.kind is Kind.SWITCH
    assert {(l.a.node, l.a.netdev, l.b.node) for l in fabric.links} == {
        (n, netdev, SWITCH) for n in ("spark-1", "spark-2", "spark-3") for netdev in ("enp1s0f1np1", "enP2p1s0f1np1")}
    assert cabling_problems(fabric, "switch") == []


def test_two_nodes_on_a_link_local_switch_that_answers_are_a_switch():
    """The switch's own voice (the simulator's bridge) answers the multicast: with spark-3 gone, two nodes remain
    on it, and the one peer answering for both its twins' addresses does not hide that third voice."""
    nodes, facts, answers = recorded("switch3-link-local")
    gone = {a for i in facts["spark-3"].interfaces for a in (*i.ipv6_link_local, *(str(x.ip) for x in i.ipv4))}
    two = {n: {t: tuple(a for a in seen if a.split("%")[0] not in gone) for t, seen in answers[n].items()}
           for n in nodes[:2]}
    assert fabric_from(nodes[:2], {n: facts[n] for n in nodes[:2]}, two).kind is Kind.SWITCH


def without_ipv6(facts: HostFacts) -> HostFacts:
    return replace(facts, interfaces=tuple(replace(i, ipv6_link_local=()) for i in facts.interfaces))


def test_a_link_local_pair_without_ipv6_is_a_pair_by_its_ipv4_answers_alone():
    """IPv6 link-local off (a netplan's `link-local: [ipv4]`): only the unicast echoes answer, both of the peer's
    addresses on each twin that hears them; one node is one far end, on the twin of the same index."""
    nodes, facts, answers = recorded("pair-link-local")
    v4 = {n: {t: tuple(a for a in seen if "fe80" not in a) for t, seen in answers[n].items()} for n in nodes}
    fabric = build_fabric(nodes, {n: without_ipv6(f) for n, f in facts.items()}, v4)
    assert fabric.kind is Kind.PAIR
    assert direct(fabric)[0] == (End("spark-1", 1, "enp1s0f1np1"), End("spark-2", 1, "enp1s0f1np1"))


def test_two_interfaces_of_one_node_answering_the_multicast_share_a_wire_a_switch():
    """The multicast is answered by each interface on the wire from its own fe80 address: two interfaces of one
    peer answering on one twin are two devices on one segment, which no direct cable makes."""
    nodes, facts, answers = recorded("pair-link-local")
    both = [facts["spark-2"].interface(t).ipv6_link_local[0]  # type: ignore[union-attr]
            for t in ("enp1s0f1np1", "enP2p1s0f1np1")]
    shared: Sightings = {**answers, "spark-1": {**answers["spark-1"], "enp1s0f1np1": tuple(both)}}
    assert build_fabric(nodes, facts, shared).links[0].b.node == SWITCH


def test_the_same_link_local_address_on_two_cables_is_no_conflict():
    """Link-local addresses are unique on their link only (IPv4 link-local defends one by ARP there): the same
    169.254 address on twins of two nodes on different cables is no duplicate to refuse. What answers from it
    names neither node, so discovery reads that cable by its IPv6 answers, and the ring stays a ring."""
    nodes, facts, answers = recorded("ring3-link-local")
    held = facts["spark-1"].interface("enp1s0f0np0").ipv4  # type: ignore[union-attr]
    assert str(held[0].ip) in answers["spark-3"]["enp1s0f1np1"]  # spark-1's address answered on spark-3's twin
    other = facts["spark-2"]
    was = str(other.interface("enP2p1s0f1np1").ipv4[0].ip)  # type: ignore[union-attr]
    facts["spark-2"] = replace(other, interfaces=tuple(replace(i, ipv4=held) if i.name == "enP2p1s0f1np1" else i
                                                       for i in other.interfaces))
    # It answers where its old address did (on spark-1's twin 0 toward spark-2), as well as on spark-3's.
    answers = {n: {t: tuple(str(held[0].ip) if a == was else a for a in seen) for t, seen in twins.items()}
               for n, twins in answers.items()}
    hosts = tuple(Host(n, f"192.168.43.1{i}", "head" if i == 1 else "worker") for i, n in enumerate(nodes, 1))
    result = check_cabling(Inventory(Path("inv.yml"), "t", hosts, {}), fabric_from(nodes, facts, answers), facts)
    assert result.problems == () and result.duplicates == ()
    assert result.fabric.kind is Kind.RING and result.fabric.complete


def test_a_routable_address_two_nodes_hold_is_still_named():
    """The rule above is link-local's alone: a 10.x address held twice is refused, with the removal (issue 39 M3)."""
    nodes, facts, answers = recorded("ring3-link-local")
    for n in ("spark-1", "spark-2"):
        f = facts[n]
        facts[n] = replace(f, interfaces=tuple(replace(i, ipv4=(*i.ipv4, IPv4Interface("10.43.0.5/24")))
                                               if i.name == "enp1s0f0np0" else i for i in f.interfaces))
    hosts = tuple(Host(n, f"192.168.43.1{i}", "head" if i == 1 else "worker") for i, n in enumerate(nodes, 1))
    result = check_cabling(Inventory(Path("inv.yml"), "t", hosts, {}), fabric_from(nodes, facts, answers), facts)
    assert [d.address for d in result.duplicates] == ["10.43.0.5"]
    assert result.problems[0].what.startswith("duplicate address 10.43.0.5: ")


def test_the_simulators_link_local_ring_node_holds_one_address_per_twin():
    """As IPv4 link-local picks one per interface: a ring node's four cabled twins, four addresses (a pair's or a
    switch node's two keep theirs)."""
    from sparkcluster.sim.netns import link_local_batch
    from sparkcluster.sim.topology import Subnets, build_topology
    host = build_topology("t", 3, Subnets(150), ["590.48.01"], kind="ring").hosts[0]
    assert link_local_batch(host) == [f"addr add 169.254.{third}.11/16 dev {netdev} scope link" for third, netdev in
                                      zip((20, 201, 21, 202), ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1",
                                                               "enP2p1s0f1np1"))]


def test_the_simulated_switch_answers_on_its_wires_from_the_start():
    """Two nodes alone on a link-local switch: twin 0's probe ends about a second in (both unicast answers in),
    when a generated link-local address of the switch's bridge is still tentative, and the switch unheard there
    read as a cable (`sim up 2 --link-local`, then `topology`: mixed). The bridge's address skips that wait."""
    from sparkcluster.sim.netns import root_batch
    from sparkcluster.sim.topology import Subnets, build_topology
    lines = root_batch(build_topology("t", 2, Subnets(150), ["590.48.01"]))
    for bridge in ("sc150fa", "sc150fb"):
        assert lines.index(f"link set {bridge} addrgenmode none") < lines.index(f"link set {bridge} up")
        assert f"addr add fe80::1/64 dev {bridge} nodad" in lines
    assert not any("fe80" in line for line in root_batch(build_topology("t", 2, Subnets(150), ["590.48.01"],
                                                                        kind="pair")))


def test_the_simulated_twins_skip_duplicate_address_detection():
    """The nodes' own twins likewise: a tentative fe80 address right after `sim up` sends a multicast probe with no
    source, so that twin hears only the unicast answers (and no switch)."""
    from sparkcluster.sim.netns import settled_twins
    from sparkcluster.sim.topology import Subnets, build_topology
    host = build_topology("t", 3, Subnets(150), ["590.48.01"], kind="ring").hosts[0]
    assert settled_twins(host) == [f"net.ipv6.conf.{netdev}.accept_dad=0" for netdev in
                                   ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")]
    switch = build_topology("t", 2, Subnets(150), ["590.48.01"]).hosts[0]
    assert settled_twins(switch) == ["net.ipv6.conf.enp1s0f1np1.accept_dad=0",
                                     "net.ipv6.conf.enP2p1s0f1np1.accept_dad=0"]
