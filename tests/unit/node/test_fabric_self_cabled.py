"""A node cabled to itself is named (README audit round 3, item 3). With IPv6 link-local addresses on its twins (a
fresh Spark's), the multicast out of one port is answered by its own other port, a link from the node to itself.
Without them (our netplan turns them off, and so does the simulator's addressed start) nobody answers on its twins
at all: its own addresses are local, so no echo of its crosses the cable. It is then told apart from a silent peer
by the rest of the picture: both its ports have a link, nobody saw it, and every other twin answered."""

from __future__ import annotations

from pathlib import Path

from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.node.discovery import check_cabling, fabric_from
from sparkcluster.node.fabric import build_fabric, cabling_problems
from tests.support.fabric import NODES3, RING3, TWINS, cabled, recorded

SELF = ("spark-3", 0, "spark-3", 1)


def silenced(answers: dict[str, dict[str, tuple[str, ...]]], node: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """What discovery reads where `node`'s twins have no link-local address: nothing answers on them."""
    return {**answers, node: {netdev: () for netdev in answers[node]}}


def problems_of(cables: list[tuple[str, int, str, int]], silent: str | None = None,
                **kw: object) -> list[str]:
    facts, answers = cabled(cables, NODES3, **kw)  # type: ignore[arg-type]
    fabric = build_fabric(NODES3, facts, silenced(answers, silent) if silent else answers)
    return [f"{p.what} / fix: {p.fix}" for p in cabling_problems(fabric)]


def test_with_link_local_addresses_its_own_port_answers_and_names_it():
    problems = problems_of([("spark-1", 1, "spark-2", 0), SELF])  # one per twin of the cable
    assert problems[0].startswith("spark-3 is cabled to itself: port 0 (enp1s0f0np0) reaches its own port 1")
    assert all(p.startswith("spark-3 is cabled to itself") for p in problems)


def test_on_a_three_ring_without_link_local_addresses_the_silent_node_is_named_with_the_fix():
    (problem,) = problems_of([("spark-1", 1, "spark-2", 0), SELF], silent="spark-3")
    assert problem == (
        "spark-3 looks cabled to itself: both its QSFP ports have a link (port 0: enp1s0f0np0, enP2p1s0f0np0; "
        "port 1: enp1s0f1np1, enP2p1s0f1np1), yet nobody answered on either and no node saw it, while every other "
        "node's twins answered / fix: if a cable runs from spark-3's port 0 to its own port 1, move one end to the "
        "next node's free port (on a switch, to the switch); if the cables go to a machine outside the inventory, "
        "add it or unplug them")


def test_on_a_switch_without_link_local_addresses_the_silent_node_is_named():
    problems = problems_of([SELF], silent="spark-3", switch_ports={"spark-1": 1, "spark-2": 1}, strangers=1)
    assert [p.split(":")[0] for p in problems] == ["spark-3 looks cabled to itself"]


def test_a_silent_ring_member_is_no_self_cable():
    """spark-3 too loaded to answer: the twins of its neighbours facing it heard nobody either."""
    facts, answers = cabled(RING3, NODES3)
    quiet = silenced(answers, "spark-3")
    for node, port in (("spark-2", 1), ("spark-1", 0)):
        quiet[node] = {**quiet[node], **{netdev: () for netdev in TWINS[port]}}
    assert not any("itself" in p.what for p in cabling_problems(build_fabric(NODES3, facts, quiet)))


def test_one_silent_port_or_two_silent_nodes_claim_nothing():
    one_port = problems_of([("spark-1", 1, "spark-2", 0), ("spark-3", 0, "spark-3", 0)], silent="spark-3")
    assert not any("itself" in p for p in one_port)  # (a cable from port 0 to nowhere known: a peer not answering)
    facts, answers = cabled([("spark-2", 0, "spark-3", 1), ("spark-2", 1, "spark-3", 0)], NODES3)
    both = silenced(silenced(answers, "spark-2"), "spark-3")  # two nodes heard by nobody may be cabled to each other
    assert not any("itself" in p.what for p in cabling_problems(build_fabric(NODES3, facts, both)))


# ---- as recorded on the simulator (tests/fixtures/discovery/README.md) ---------------------------------------------

def inventory(nodes: list[str]) -> Inventory:
    return Inventory(Path("inv.yml"), "t", tuple(Host(n, f"192.168.43.1{i}", "head" if i == 1 else "worker")
                                                 for i, n in enumerate(nodes, 1)), {})


def test_recorded_fresh_ring_its_own_port_answers_on_each_twin():
    nodes, facts, answers = recorded("ring3-self-fresh")
    own = {str(a).split("/")[0] for i in facts["spark-3"].interfaces for a in i.ipv6_link_local}
    assert all(set(answered) <= own and len(answered) == 2 for answered in answers["spark-3"].values())
    problems = check_cabling(inventory(nodes), fabric_from(nodes, facts, answers), facts).problems
    assert [p.what.split(":")[0] for p in problems] == ["spark-3 is cabled to itself"] * 2


def test_recorded_addressed_switch_the_silent_node_is_named():
    nodes, facts, answers = recorded("switch3-self-addressed")
    assert answers["spark-3"] and not any(answers["spark-3"].values())  # four twins Up, nobody answering
    problems = check_cabling(inventory(nodes), fabric_from(nodes, facts, answers), facts).problems
    assert [p.what.split(":")[0] for p in problems] == ["spark-3 looks cabled to itself"]
