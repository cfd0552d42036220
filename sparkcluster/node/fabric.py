"""The QSFP fabric as one typed value: a graph of links between (node, port, twin netdev) ends.

A pair, a switch, a 3-ring and a 4-ring are instances of the same value, told apart by `Fabric.kind`, never by
branches in the code that reads it. It is built from each node's facts (which QSFP twins are Up, their speeds
and addresses) and from discovery (which neighbour answers on each Up twin: node/discovery.py). What the cables
form is compared with what the inventory says (`vars: {fabric: {topology: auto|pair|switch|ring}}`) by
`cabling_problems`, which names each mistake with the re-cabling that fixes it, before anything changes.

Each QSFP port of a Spark is two "twin" netdevs (enp1s0fNnpN and enP2p1s0fNnpN), one per PCIe x4 function; a
cable joins twin 0 to twin 0 and twin 1 to twin 1 of the ports at its ends, so one cable is two links here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from ipaddress import IPv4Network, ip_address
from typing import Any

from ..engine.facts import HostFacts
from .network import qsfp_port

SWITCH = "switch"  # the node name of a link's far end when it runs through a switch
UNKNOWN = "?"  # the node name of a far end that answered but is no node of the inventory
TOPOLOGIES = ("auto", "pair", "switch", "ring")


class Kind(str, Enum):
    """What the cables form, read off the graph."""

    NONE = "none"  # no QSFP link at all
    PAIR = "pair"  # two nodes, cabled to each other (one cable, or both ports)
    RING = "ring"  # three or more nodes, each cabled to exactly two others, in one cycle
    SWITCH = "switch"  # every link runs to a switch
    MIXED = "mixed"  # some links direct, some through a switch
    OTHER = "other"  # direct links that form no pair or ring (an open ring, a node left out ...)


def twin_index(netdev: str) -> int:
    """enp1s0fNnpN is twin 0 of its port, enP2p1s0fNnpN twin 1 (eugr's preferred twin first, as addressing does)."""
    return 1 if netdev.startswith("enP") else 0


@dataclass(frozen=True, order=True)
class End:
    node: str
    port: int | None  # the QSFP port (0 or 1); None on a switch or an unknown device
    netdev: str  # the twin's netdev; "twin0"/"twin1" on a switch, "" on an unknown device

    @property
    def twin(self) -> int:
        return int(self.netdev[-1]) if self.netdev.startswith("twin") else twin_index(self.netdev)

    def label(self) -> str:
        if self.node in (SWITCH, UNKNOWN):
            return f"{self.node} ({self.netdev})" if self.netdev else self.node
        return f"{self.node} {self.netdev}" if self.port is None else f"{self.node} port {self.port} {self.netdev}"

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "port": self.port, "netdev": self.netdev}


@dataclass(frozen=True)
class Link:
    """One twin's link: `a` is always a node of the inventory; `b` another node, a switch or an unknown device."""

    a: End
    b: End
    speed_mbps: int | None = None  # as the slower end negotiated it
    subnet: IPv4Network | None = None  # the IPv4 network both ends share now; None until addressed

    @property
    def direct(self) -> bool:
        return self.b.node not in (SWITCH, UNKNOWN)

    @property
    def cable(self) -> tuple[tuple[str, int | None], tuple[str, int | None]]:
        """The physical cable this twin link rides on: its two (node, port) ends."""
        return (self.a.node, self.a.port), (self.b.node, self.b.port)

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a.to_json(), "b": self.b.to_json(), "twin": self.a.twin, "direct": self.direct,
                "speed_mbps": self.speed_mbps, "subnet": str(self.subnet) if self.subnet else None}


@dataclass(frozen=True)
class Fabric:
    nodes: tuple[str, ...]  # the inventory's nodes, in its order (the head first)
    links: tuple[Link, ...]
    silent: tuple[End, ...] = ()  # Up twins on which nobody answered
    unprobed: tuple[str, ...] = field(default=())  # nodes without facts or discovery (unreachable)

    # ---- reading the graph ----------------------------------------------------------------------------
    @property
    def kind(self) -> Kind:
        if not self.links:
            return Kind.NONE
        direct = [link for link in self.links if link.direct and link.a.node != link.b.node]
        via_switch = [link for link in self.links if link.b.node == SWITCH]
        if direct and via_switch:
            return Kind.MIXED
        if via_switch:
            return Kind.SWITCH
        adjacency = self.adjacency()
        linked = [n for n in self.nodes if adjacency.get(n)]
        if len(linked) == 2 and len(self.nodes) == 2 and all(len(adjacency[n]) == 1 for n in linked):
            return Kind.PAIR
        if (len(linked) >= 3 and len(linked) == len(self.nodes) and all(len(adjacency[n]) == 2 for n in linked)
                and len(self.ring_order()) == len(linked)):
            return Kind.RING
        return Kind.OTHER

    @property
    def silent_nodes(self) -> tuple[str, ...]:
        """Probed nodes on no link: none of their twins saw anyone, and nobody saw them (flushed addresses, links
        down, a node too loaded to answer). Nothing is known of their cables."""
        on_links = {e.node for link in self.links for e in (link.a, link.b)}
        return tuple(n for n in self.nodes if n not in on_links and n not in self.unprobed)

    @property
    def complete(self) -> bool:
        """Discovery saw every Up twin answered and every node on some link: only then does a graph that is no
        pair, ring or switch prove a miscabling; a silent twin or node may be the missing piece of one."""
        return not self.silent and not self.silent_nodes and not self.unprobed

    def adjacency(self) -> dict[str, tuple[str, ...]]:
        """Each node's directly cabled neighbours (other nodes only), in inventory order."""
        peers: dict[str, set[str]] = {n: set() for n in self.nodes}
        for link in self.links:
            if link.direct and link.a.node != link.b.node:
                peers.setdefault(link.a.node, set()).add(link.b.node)
                peers.setdefault(link.b.node, set()).add(link.a.node)
        order = {n: i for i, n in enumerate(self.nodes)}
        return {n: tuple(sorted(p, key=lambda x: order.get(x, len(order)))) for n, p in peers.items()}

    def ring_order(self) -> tuple[str, ...]:
        """The nodes walked along the cables from the head (towards its first neighbour in inventory order);
        on a ring, every node once. Data and ranks follow this order: each step is one cable."""
        adjacency = self.adjacency()
        if not self.nodes or not adjacency.get(self.nodes[0]):
            return ()
        walk = [self.nodes[0]]
        while True:
            nxt = [p for p in adjacency[walk[-1]] if p not in walk]
            if not nxt:
                return tuple(walk)
            walk.append(nxt[0])

    def cables(self) -> tuple[tuple[tuple[str, int | None], tuple[str, int | None]], ...]:
        """The physical cables between nodes, once each, in a stable order (the order of their subnets)."""
        order = {n: i for i, n in enumerate(self.nodes)}
        seen: dict[tuple[tuple[str, int | None], tuple[str, int | None]], None] = {}
        for link in self.links:
            if link.direct:
                seen.setdefault(link.cable)
        return tuple(sorted(seen, key=lambda c: (order.get(c[0][0], 99), c[0][1] or 0, order.get(c[1][0], 99))))

    def ends_of(self, node: str) -> tuple[tuple[End, Link], ...]:
        """This node's twin ends with the link each is on, port 0 first, twin 0 first."""
        found = []
        for link in self.links:
            for mine in (link.a, link.b):
                if mine.node == node:
                    found.append((mine, link))
        return tuple(sorted(found, key=lambda e: (e[0].port or 0, e[0].twin)))

    def segment(self, end: End) -> int:
        """Which subnet of the fabric's list this twin end sits on. A link's two ends share one; all the nodes'
        twin t on a switch share segment t; on direct cables, cable i carries segments 2i (twin 0) and 2i+1.
        A pair is cable 0, so it keeps the two subnets a pair has always had, as does a switch."""
        for link in self.links:
            if end in (link.a, link.b):
                if not link.direct:
                    return end.twin
                return 2 * self.cables().index(link.cable) + end.twin
        raise KeyError(f"{end.label()} is on no link")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "nodes": list(self.nodes), "ring_order": list(self.ring_order()),
                "links": [link.to_json() for link in self.links],
                "silent": [e.to_json() for e in self.silent], "silent_nodes": list(self.silent_nodes),
                "unprobed": list(self.unprobed)}


# ---- building it ------------------------------------------------------------------------------------------
Sightings = Mapping[str, Mapping[str, Sequence[str]]]  # node -> Up twin netdev -> addresses that answered on it


def up_twins(facts: HostFacts) -> tuple[str, ...]:
    """The node's QSFP twins whose RDMA device is Up (a cable is in their port), port 0 first, twin 0 first."""
    netdevs = {d.netdev for d in facts.rdma if d.up and qsfp_port(d.netdev) is not None}
    return tuple(sorted(netdevs, key=lambda n: (qsfp_port(n) or 0, twin_index(n))))


def _owners(facts: Mapping[str, HostFacts]) -> dict[str, tuple[str, str]]:
    """Every address (IPv6 link-local or IPv4) and MAC of every node's interfaces -> (node, netdev)."""
    owners: dict[str, tuple[str, str]] = {}
    for node, f in facts.items():
        for interface in f.interfaces:
            for address in (*interface.ipv6_link_local, *(str(a.ip) for a in interface.ipv4)):
                owners[_canonical(address)] = (node, interface.name)
            if interface.mac:
                owners[interface.mac.lower()] = (node, interface.name)
    return owners


def _canonical(address: str) -> str:
    address = address.split("%")[0].strip()
    try:
        return str(ip_address(address))
    except ValueError:
        return address.lower()


def _speed(facts: Mapping[str, HostFacts], *ends: End) -> int | None:
    speeds = []
    for end in ends:
        f = facts.get(end.node)
        interface = f.interface(end.netdev) if f else None
        if interface and interface.speed_mbps:
            speeds.append(interface.speed_mbps)
    return min(speeds) if speeds else None


def _shared_subnet(facts: Mapping[str, HostFacts], a: End, b: End) -> IPv4Network | None:
    fa, fb = facts.get(a.node), facts.get(b.node)
    ia = fa.interface(a.netdev) if fa else None
    ib = fb.interface(b.netdev) if fb else None
    if ia is None:
        return None
    mine = [x.network for x in ia.ipv4]
    if ib is None:  # a switch: the subnet this twin has
        return mine[0] if mine else None
    theirs = {x.network for x in ib.ipv4}
    return next((n for n in mine if n in theirs), None)


def build_fabric(nodes: Sequence[str], facts: Mapping[str, HostFacts], sightings: Sightings) -> Fabric:
    """The graph from each node's facts and what answered on each of its Up twins. A twin on which two or more
    devices answer sits on a shared segment: a switch. One device answering (a node, from however many of its
    addresses: see _far_ends) is a direct cable to it."""
    owners = _owners(facts)
    links: list[Link] = []
    seen: set[tuple[End, End]] = set()
    silent: list[End] = []
    for node in nodes:
        f = facts.get(node)
        if f is None or node not in sightings:
            continue
        for netdev in up_twins(f):
            mine = End(node, qsfp_port(netdev), netdev)
            answered = {_canonical(a) for a in sightings[node].get(netdev, ())}
            peers = _far_ends(answered, owners, mine)
            strangers = {a for a in answered if a not in owners}
            if len(peers) + len(strangers) >= 2:
                links.append(Link(mine, End(SWITCH, None, f"twin{mine.twin}"), _speed(facts, mine),
                                  _shared_subnet(facts, mine, End(SWITCH, None, ""))))
            elif peers:
                (peer_node, peer_netdev), = peers
                far = End(peer_node, qsfp_port(peer_netdev), peer_netdev)
                key = (min(mine, far), max(mine, far))
                if key in seen:
                    continue
                seen.add(key)
                # `a` is the end nearer the head, so a link reads the same whichever end found it.
                a, b = sorted((mine, far), key=lambda e: (_position(nodes, e.node), e.port or 0))
                links.append(Link(a, b, _speed(facts, a, b), _shared_subnet(facts, a, b)))
            elif strangers:  # the twin's own subnet, as on a switch: a node not probed may be the stranger
                links.append(Link(mine, End(UNKNOWN, None, ""), _speed(facts, mine),
                                  _shared_subnet(facts, mine, End(UNKNOWN, None, ""))))
            else:
                silent.append(mine)
    unprobed = tuple(n for n in nodes if n not in facts or n not in sightings)
    return Fabric(tuple(nodes), tuple(links), tuple(silent), unprobed)


def _far_ends(answered: Iterable[str], owners: Mapping[str, tuple[str, str]], mine: End) -> set[tuple[str, str]]:
    """The (node, netdev) of each device of the inventory that answered on `mine`'s wire, once each. An IPv6
    link-local answer names its interface: a reply to the all-nodes group leaves the interface on the wire, from
    that interface's own fe80 address. An IPv4 answer names only its node: Linux answers an ARP for any of its
    addresses on any of its wires, so where a peer's twins share one subnet (169.254/16 on every twin, as NVIDIA's
    link-local playbook leaves them) its other twin's address answers on this cable too. Such a node is one device
    here: heard by IPv6 already, or else taken on the twin of `mine`'s index (a cable joins twin t to twin t)."""
    by_interface: set[tuple[str, str]] = set()
    by_node: dict[str, set[str]] = {}
    for address in answered:
        owner = owners.get(address)
        if owner is None or owner == (mine.node, mine.netdev):
            continue
        if ":" in address:  # IPv6: an IPv4 address has no colon
            by_interface.add(owner)
        else:
            by_node.setdefault(owner[0], set()).add(owner[1])
    heard = {node for node, _ in by_interface}
    for node, netdevs in by_node.items():
        if node not in heard:
            by_interface.add((node, min(netdevs, key=lambda n: (twin_index(n) != mine.twin, n))))
    return by_interface


def _position(nodes: Sequence[str], node: str) -> int:
    return nodes.index(node) if node in nodes else len(nodes)


# ---- what the inventory expects, and what is wrong ----------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    what: str
    fix: str


def cabling_problems(fabric: Fabric, expected: str = "auto",
                     pinned: Mapping[str, Iterable[str]] | None = None) -> list[Problem]:
    """Every cabling mistake the graph shows, each with the fix. `expected`: the inventory's fabric.topology;
    `pinned`: per node, the netdevs its inventory pins (qsfp_interface, hcas' netdevs)."""
    problems: list[Problem] = []
    for link in fabric.links:
        if link.a.node == link.b.node:
            problems.append(Problem(
                f"{link.a.node} is cabled to itself: port {link.a.port} ({link.a.netdev}) reaches its own port "
                f"{link.b.port} ({link.b.netdev})",
                f"move one end of that cable from {link.a.node} to the next node's free port"))
    problems += _silent_on_both_ports(fabric)
    kind = fabric.kind
    # An incomplete picture (a twin Up but silent, a node that saw and showed nothing) is no evidence of a mixed,
    # open or partial cabling: such a node is left to the preflight (which names what it cannot reach) and to
    # addressing (which puts a twin on the subnet its peers use). What the answers do show is still refused.
    if kind in (Kind.MIXED, Kind.OTHER) and not fabric.complete:
        return problems + _pins_away(fabric, pinned or {})
    if kind is Kind.MIXED:
        direct = sorted({f"{l.a.node}-{l.b.node}" for l in fabric.links if l.direct and l.a.node != l.b.node})
        switched = sorted({l.a.node for l in fabric.links if l.b.node == SWITCH})
        problems.append(Problem(
            f"some nodes are cabled directly ({', '.join(direct)}) and others through a switch "
            f"({', '.join(switched)}): NCCL needs one fabric",
            "cable every node to the switch (one QSFP port each), or form a ring of direct cables without it"))
    if kind is Kind.OTHER and not any(l.a.node == l.b.node for l in fabric.links):
        problems += _open_ring(fabric)
    if kind is Kind.RING:
        problems += _same_port_links(fabric)
    problems += _pins_away(fabric, pinned or {})
    if expected not in ("auto", kind.value) and kind not in (Kind.NONE, Kind.MIXED, Kind.OTHER) and not problems:
        problems.append(Problem(
            f"the inventory says fabric.topology: {expected}, but the cables form a {kind.value}",
            f"set vars: {{fabric: {{topology: {kind.value}}}}} (or auto) in the inventory, or re-cable as a "
            f"{expected}"))
    return problems


def _silent_on_both_ports(fabric: Fabric) -> list[Problem]:
    """A node cabled to itself whose twins have no IPv6 link-local address (our netplan turns it off; so does the
    simulator's addressed start) is heard by nobody: its own addresses are local to it, so no echo of its can cross
    the cable, and it reads as silent rather than as a link from itself to itself. It is still told apart: both its
    ports have a link (a carrier: something powered at each far end), no node answered on either and none saw it,
    while every other twin of every node answered. A peer that did not answer (loaded, unaddressed) would leave the
    twins facing it silent too, and two such nodes may be cabled to each other: then nothing is claimed."""
    if fabric.unprobed:
        return []
    silent_nodes = {end.node for end in fabric.silent}
    if len(silent_nodes) != 1 or next(iter(silent_nodes)) not in fabric.silent_nodes:
        return []
    node = next(iter(silent_nodes))
    ports = {port: [e.netdev for e in fabric.silent if e.port == port] for port in (0, 1)}
    if not all(ports.values()):
        return []
    listed = "; ".join(f"port {port}: {', '.join(netdevs)}" for port, netdevs in ports.items())
    return [Problem(
        f"{node} looks cabled to itself: both its QSFP ports have a link ({listed}), yet nobody answered on either "
        "and no node saw it, while every other node's twins answered",
        f"if a cable runs from {node}'s port 0 to its own port 1, move one end to the next node's free port (on a "
        f"switch, to the switch); if the cables go to a machine outside the inventory, add it or unplug them")]


def _open_ring(fabric: Fabric) -> list[Problem]:
    """Direct links that form a chain: the two ends of the chain have one neighbour and a free port each."""
    adjacency = fabric.adjacency()
    linked = [n for n in fabric.nodes if adjacency.get(n)]
    loose = [n for n in fabric.nodes if len(adjacency.get(n, ())) < 2]
    if len(fabric.nodes) < 3 or not linked:
        return []
    free = {n: sorted({0, 1} - {e.port for e, _ in fabric.ends_of(n)}) for n in loose}
    if len(loose) == 2 and all(free[n] for n in loose):
        x, y = loose
        return [Problem(
            f"the ring is open: {x} and {y} have one cabled neighbour each "
            f"({len(fabric.cables())} cables for {len(fabric.nodes)} nodes)",
            f"cable {x} port {free[x][0]} to {y} port {free[y][0]}; then every node has both ports cabled")]
    listing = ", ".join(f"{n} ({len(adjacency.get(n, ()))} neighbours)" for n in loose)
    return [Problem(f"the cables form no ring: {listing}",
                    "cable each node's port 1 to the next node's port 0, and the last node's port 1 back to the "
                    "first node's port 0")]


def _same_port_links(fabric: Fabric) -> list[Problem]:
    """A ring needs every cable crosswise (port 1 of one node to port 0 of the next): a cable from port 0 to
    port 0 makes NCCL fail with `ibv_modify_qp ... 110`. Say on which nodes to swap the two cables."""
    walk = fabric.ring_order()
    toward_next: dict[str, int | None] = {}
    for i, node in enumerate(walk):
        nxt = walk[(i + 1) % len(walk)]
        toward_next[node] = next((l.a.port if l.a.node == node else l.b.port)
                                 for l in fabric.links if {l.a.node, l.b.node} == {node, nxt})
    same = sorted({(l.a.node, l.b.node, l.a.port) for l in fabric.links if l.direct and l.a.port == l.b.port})
    if not same:
        return []
    # Orientation d: every node uses port d towards the next one. Swap on the nodes that do not; fewest swaps.
    swaps = min(([n for n in walk if toward_next[n] != d] for d in (1, 0)), key=len)
    cables = ", ".join(f"{a} port {p} to {b} port {p}" for a, b, p in same)
    return [Problem(
        f"the ring is cabled port to same port ({cables}): a ring must run crosswise, port 1 of one node to "
        "port 0 of the next, or NCCL fails with `ibv_modify_qp ... 110`",
        f"on {', '.join(swaps)}, swap the two QSFP cables (port 0 <-> port 1); every cable then runs from port 1 "
        "of one node to port 0 of the next")]


def _pins_away(fabric: Fabric, pinned: Mapping[str, Iterable[str]]) -> list[Problem]:
    problems = []
    for node, netdevs in pinned.items():
        pins = [n for n in netdevs if qsfp_port(n) is not None]
        cabled = {e.port for e, _ in fabric.ends_of(node)}
        away = [n for n in pins if qsfp_port(n) not in cabled]
        if away and cabled:
            ports = ", ".join(str(p) for p in sorted(p for p in cabled if p is not None))
            problems.append(Problem(
                f"{node}: the inventory pins {', '.join(away)} (port {qsfp_port(away[0])}), but the cable is in "
                f"port {ports}",
                f"move the cable to port {qsfp_port(away[0])}, or change or remove the pin (qsfp_interface / hcas) "
                f"for {node}"))
    return problems


def expected_topology(inventory_vars: Mapping[str, Any]) -> str:
    """vars.fabric.topology, default auto (the inventory's validation has already checked the value)."""
    raw = inventory_vars.get("fabric") or {}
    value = raw.get("topology", "auto") if isinstance(raw, Mapping) else "auto"
    return str(value) if value in TOPOLOGIES else "auto"
