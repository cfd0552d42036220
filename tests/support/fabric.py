"""Fabrics as data for the node's tests: Sparks cabled as given (a 3-ring, a 4-ring, a switch), their facts and the
answers each twin's probe gets."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sparkcluster.engine.facts import HostFacts, Interface, RdmaDevice, parse_probe, split_sections
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.node.addressing import (
    AddressPlan,
    fabric_config,
    host_number,
    plan_addresses,
)
from sparkcluster.node.discovery import parse_probe as parse_answers
from sparkcluster.node.fabric import build_fabric
from sparkcluster.node.routed import node_address, plan_node_address

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TWINS = {0: ("enp1s0f0np0", "enP2p1s0f0np0"), 1: ("enp1s0f1np1", "enP2p1s0f1np1")}
HCAS = {"enp1s0f0np0": "rocep1s0f0", "enP2p1s0f0np0": "roceP2p1s0f0",
        "enp1s0f1np1": "rocep1s0f1", "enP2p1s0f1np1": "roceP2p1s0f1"}


def node(index: int, ports: set[int], ipv4: dict[str, str] | None = None) -> HostFacts:
    """A Spark whose `ports` are cabled: their twins Up, each with its link-local address (and IPv4 if given)."""
    base = parse_probe((FIXTURES / "probe-spark.txt").read_text())
    rdma = tuple(RdmaDevice(HCAS[n], 1, n, p in ports) for p in (0, 1) for n in TWINS[p])
    interfaces = [Interface("enP7s7", "UP", 1500, (f"192.168.1.{10 + index}/24",), 10000, f"02:00:00:00:{index:02x}:99")]
    for p in (0, 1):
        for t, n in enumerate(TWINS[p]):
            mac = f"02:00:00:{index:02x}:{p}{t}:01"
            addresses = ((ipv4[n],) if ipv4 and n in ipv4 else ())
            interfaces.append(Interface(n, "UP" if p in ports else "DOWN", 9000, addresses, 200000 if p in ports else None,
                                        mac, (f"fe80::{index:x}:{p}{t}",) if p in ports else ()))
    return replace(base, rdma=rdma, interfaces=tuple(interfaces))


def cabled(cables: list[tuple[str, int, str, int]], nodes: list[str], switch_ports: dict[str, int] | None = None,
           strangers: int = 0) -> tuple[dict[str, HostFacts], dict[str, dict[str, tuple[str, ...]]]]:
    """Facts and probe answers for direct `cables` (node, port, node, port) and nodes on a switch by one port."""
    ports: dict[str, set[int]] = {n: set() for n in nodes}
    wires: list[list[tuple[str, str]]] = []  # the switch's wires come last
    for a, pa, b, pb in cables:
        ports[a].add(pa)
        ports[b].add(pb)
        wires += [[(a, TWINS[pa][t]), (b, TWINS[pb][t])] for t in (0, 1)]
    for n, p in (switch_ports or {}).items():
        ports[n].add(p)
    for t in (0, 1):
        on_switch = [(n, TWINS[p][t]) for n, p in (switch_ports or {}).items()]
        if on_switch:
            wires.append(on_switch)
    facts = {n: node(i, ports[n]) for i, n in enumerate(nodes, start=1)}

    def ll(n: str, netdev: str) -> str:
        return facts[n].interface(netdev).ipv6_link_local[0]  # type: ignore[union-attr]

    answers: dict[str, dict[str, tuple[str, ...]]] = {n: {} for n in nodes}
    for w, wire in enumerate(wires):
        for n, netdev in wire:
            others = tuple(ll(o, d) for o, d in wire if (o, d) != (n, netdev))
            extra = tuple(f"fe80::ff:{i}" for i in range(strangers)) if w >= 2 * len(cables) else ()
            answers[n][netdev] = answers[n].get(netdev, ()) + others + extra
    return facts, answers


NODES3 = ["spark-1", "spark-2", "spark-3"]
NODES4 = [*NODES3, "spark-4"]
RING3 = [("spark-1", 1, "spark-2", 0), ("spark-2", 1, "spark-3", 0), ("spark-3", 1, "spark-1", 0)]
RING4 = [("spark-1", 1, "spark-2", 0), ("spark-2", 1, "spark-3", 0), ("spark-3", 1, "spark-4", 0),
         ("spark-4", 1, "spark-1", 0)]


def ring_plans(nodes: list[str], cables: list[tuple[str, int, str, int]], fabric: dict | None = None
               ) -> tuple[Inventory, dict[str, HostFacts], dict[str, AddressPlan]]:
    """Every node's address plan on a fresh ring, with its node address and routes, as fabric.addresses makes it."""
    facts, answers = cabled(cables, nodes)
    graph = build_fabric(nodes, facts, answers)
    hosts = tuple(Host(n, f"192.168.1.{10 + i}", "head" if i == 1 else "worker") for i, n in enumerate(nodes, 1))
    inv = Inventory(Path("inv.yml"), "t", hosts, {"fabric": fabric} if fabric else {})
    config = fabric_config(inv, hosts[0])
    plans = {h.name: plan_addresses(inv, h, facts[h.name], config, fabric=graph) for h in hosts}
    addresses = {h.name: node_address(config.node_subnet, host_number(inv, h.name)) for h in hosts}
    twins = {n: {t.netdev: t.address for t in p.twins} for n, p in plans.items()}
    return inv, facts, {n: AddressPlan(p.port, p.twins, p.mtu, p.notes, plan_node_address(n, graph, addresses, twins))
                        for n, p in plans.items()}


RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "discovery"


def recorded(case: str) -> tuple[list[str], dict[str, HostFacts], dict[str, dict[str, tuple[str, ...]]]]:
    """The nodes, their facts and what answered on each of their twins, as recorded on the simulator."""
    files = sorted((RECORDED / case).glob("spark-*.txt"))
    texts = {f.stem: f.read_text() for f in files}
    facts = {n: parse_probe(t) for n, t in texts.items()}
    answers = {n: parse_answers("\n".join(split_sections(t)["discovery"])) for n, t in texts.items()}
    return list(texts), facts, answers
