"""Round 5's M3 and M4 (topology): an address that two nodes hold is named as a duplicate address with the fix,
not read as a switch; the twins of reachable nodes toward one that was not probed show their addresses. The
answers are derived from the wires as the unicast probe sees them: a node answers for any of its addresses on
any of its wires (Linux's weak host model), and a node's own address answers from itself."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from sparkcluster.engine.facts import HostFacts
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.node.cli import render
from sparkcluster.node.discovery import Checked, check_cabling, fabric_from, ipv4_candidates
from sparkcluster.node.fabric import SWITCH, Kind, build_fabric
from tests.support.fabric import NODES3, RING3, TWINS, node

WIRES = [((a, TWINS[pa][t]), (b, TWINS[pb][t])) for a, pa, b, pb in RING3 for t in (0, 1)]


def bootstrapped_ring3() -> dict[str, HostFacts]:
    """A 3-ring as bootstrap addresses it: wire w on 10.103.w.0/24, node i at .1i; IPv6 link-local off."""
    ipv4: dict[str, dict[str, str]] = {n: {} for n in NODES3}
    for w, ends in enumerate(WIRES):
        for n, netdev in ends:
            ipv4[n][netdev] = f"10.103.{w}.1{NODES3.index(n) + 1}/24"
    facts = {n: node(i, {0, 1}, ipv4[n]) for i, n in enumerate(NODES3, start=1)}
    return {n: replace(f, interfaces=tuple(replace(i, ipv6_link_local=()) for i in f.interfaces))
            for n, f in facts.items()}


def add_address(facts: dict[str, HostFacts], name: str, netdev: str, address: str) -> None:
    f = facts[name]
    facts[name] = replace(f, interfaces=tuple(replace(i, ipv4=(*i.ipv4, address)) if i.name == netdev else i
                                              for i in f.interfaces))


def answers(facts: dict[str, HostFacts]) -> dict[str, dict[str, tuple[str, ...]]]:
    peer = {end: other for a, b in WIRES for end, other in ((a, b), (b, a))}
    out: dict[str, dict[str, tuple[str, ...]]] = {n: {} for n in facts}
    for n in facts:
        for netdev, candidates in ipv4_candidates(n, facts).items():
            holders = {n, peer[(n, netdev)][0]}
            out[n][netdev] = tuple(a for a in candidates
                                   if any(facts[h].interface(i.name) and i.has_ip(a) for h in holders
                                          for i in facts[h].interfaces))
    return out


def checked(facts: dict[str, HostFacts], sightings: dict[str, dict[str, tuple[str, ...]]]) -> Checked:
    hosts = tuple(Host(n, f"192.168.103.1{i}", "head" if i == 1 else "worker") for i, n in enumerate(NODES3, 1))
    return check_cabling(Inventory(Path("inv.yml"), "t", hosts, {}), fabric_from(NODES3, facts, sightings), facts)


def shown(result: Checked) -> str:
    out = io.StringIO()
    render(Console(file=out, width=200, color_system=None), result)
    return out.getvalue()


def test_the_clean_ring_is_a_ring():
    facts = bootstrapped_ring3()
    result = checked(facts, answers(facts))
    assert result.fabric.kind is Kind.RING and result.problems == () and result.fabric.complete


def test_an_address_two_nodes_hold_is_a_duplicate_address_not_a_switch():
    facts = bootstrapped_ring3()
    # spark-2's address on the spark-1<->spark-2 cable, also on spark-3's port toward spark-1
    add_address(facts, "spark-3", "enp1s0f1np1", "10.103.0.12/24")
    result = checked(facts, answers(facts))
    assert [(p.what, p.fix) for p in result.problems] == [(
        "duplicate address 10.103.0.12: spark-3 (enp1s0f1np1) and spark-2 (enp1s0f0np0) both hold it, so discovery "
        "cannot tell which of them answers from it",
        "remove it from the node that should not hold it (on spark-3: `sudo ip addr del 10.103.0.12/24 dev "
        "enp1s0f1np1`, or on spark-2: `sudo ip addr del 10.103.0.12/24 dev enp1s0f0np0`); then run topology again")]
    assert result.fabric.kind is Kind.RING and not [l for l in result.fabric.links if l.b.node == SWITCH]
    text = shown(result)
    assert "switch" not in text and "fabric: ring of 3 node(s)" in text
    assert "! spark-1 port 1 enp1s0f1np1 is Up but what answered on it is a duplicate address (below)" in text


def test_twins_toward_a_node_not_probed_show_their_addresses():
    facts = bootstrapped_ring3()
    sightings = answers(facts)
    del facts["spark-2"], sightings["spark-2"]
    for n, netdev in [("spark-1", "enp1s0f1np1"), ("spark-3", "enp1s0f0np0")]:  # spark-2's kernel still answers
        sightings[n][netdev] = ("fe80::2:1",)
    fabric = build_fabric(NODES3, facts, sightings)
    text = shown(Checked(fabric, "auto", ()))
    assert "(no address yet)" not in text
    assert re.search(r"spark-1 port 1 enp1s0f1np1 +\? +0 +200 Gb/s +10\.103\.0\.0/24", text)
    assert re.search(r"spark-3 port 0 enp1s0f0np0 +\? +0 +200 Gb/s +10\.103\.2\.0/24", text)
