"""A ring's routed control plane: one node address per node that every node reaches over the cables.

On a ring a link's address reaches one neighbour only, and on a 4-ring the node across the ring is cabled to
nobody's link of ours. Ray, gloo, vLLM's ZMQ and the rendezvous each advertise one address that every node must
reach; so each node gets a node address (a /32 on a port-less bridge, `scnode`: a bridge because it exists on
every kernel, also where the `dummy` module is missing, and netplan writes it as `bridges:`), from
`fabric.node_subnet`, numbered like the link addresses (the head .11). Every node holds a static route to each
other node's address through the cabled neighbour on the shortest walk along the ring, with the node address as the
source so that the far end's answer needs no route to our link subnets. Where a walk crosses a node (a 4-ring's
diagonal, through a neighbour) that node forwards it: the plan names each such flow (`Forward`), and forwarding.py
turns on exactly that, per twin; a 3-ring's walks are all direct, so none of its nodes forwards.

The other choice, `fabric.control_plane: lan`, keeps the control plane on the management LAN (the inventory
address): no routes, no forwarding, but the control plane then shares the LAN with SSH and the user's traffic.
Pure functions; fabric.addresses (steps/addresses.py) applies them with its netplan file, watchdog and rollback.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network

from .fabric import Fabric
from .network import NODE_NETDEV as NODE_NETDEV  # re-exported: the node address's interface

DEFAULT_NODE_SUBNET = "10.177.0.0/24"
CONTROL_PLANES = ("routed", "lan")
SYSCTL_FILE = "/etc/sysctl.d/60-sparkcluster-fabric.conf"


@dataclass(frozen=True)
class Route:
    to: IPv4Address  # another node's node address
    via: IPv4Address  # the neighbour's address on the cable between us
    netdev: str  # our twin on that cable
    src: IPv4Address  # our node address: the far end answers it, not our link address

    def ip_args(self) -> str:
        """What `ip route replace` takes, and what `ip -4 route show` prints back for it."""
        return f"{self.to} via {self.via} dev {self.netdev} src {self.src}"


@dataclass(frozen=True)
class Forward:
    """One flow this node forwards for two others whose walk crosses it: from `src`'s node address to `dst`'s,
    arriving on one twin and leaving by another."""

    src: IPv4Address
    dst: IPv4Address
    inbound: str  # our twin toward src
    outbound: str  # our twin toward dst


@dataclass(frozen=True)
class NodeAddress:
    address: IPv4Interface  # this node's, a /32
    routes: tuple[Route, ...]
    forwards: tuple[Forward, ...] = ()  # none on a 3-ring: every walk there is one cable


def node_address(subnet: IPv4Network, number: int) -> IPv4Interface:
    return IPv4Interface(f"{subnet[number]}/32")


def paths(nodes: Sequence[str], adjacency: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """For each ordered pair of nodes, the walk along the cables between them: the shortest, and for an unordered
    pair the same one both ways (found from the one earlier in inventory order, neighbours in inventory order), so
    that a request and its answer cross the same neighbour."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    for i, start in enumerate(nodes):
        parent: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:
            here = queue.popleft()
            for peer in adjacency.get(here, ()):
                if peer not in parent:
                    parent[peer] = here
                    queue.append(peer)
        for goal in nodes[i + 1:]:
            if goal not in parent:
                continue
            walk = [goal]
            while (step := parent[walk[-1]]) is not None:
                walk.append(step)
            found[(start, goal)] = tuple(reversed(walk))
            found[(goal, start)] = tuple(walk)
    return found


def plan_node_address(node: str, fabric: Fabric, addresses: Mapping[str, IPv4Interface],
                      twins: Mapping[str, Mapping[str, IPv4Interface]]) -> NodeAddress:
    """This node's address, its routes to every other node's, and the flows it forwards for walks that cross it.
    `addresses`: every node's node address; `twins`: per node, its twins' link addresses (as fabric.addresses plans
    or keeps them)."""
    walks = paths(fabric.nodes, fabric.adjacency())
    mine = addresses[node]
    routes = []
    for other in fabric.nodes:
        walk = walks.get((node, other))
        if other == node or walk is None or other not in addresses:
            continue
        hop = _toward(node, walk[1], fabric, twins)
        if hop is not None:
            routes.append(Route(addresses[other].ip, hop[1], hop[0], mine.ip))
    forwards = []
    for (src, dst), walk in walks.items():
        if node not in walk[1:-1] or src not in addresses or dst not in addresses:
            continue
        at = walk.index(node)
        back, ahead = _toward(node, walk[at - 1], fabric, twins), _toward(node, walk[at + 1], fabric, twins)
        if back is not None and ahead is not None:
            forwards.append(Forward(addresses[src].ip, addresses[dst].ip, back[0], ahead[0]))
    return NodeAddress(mine, tuple(routes), tuple(forwards))


def _toward(node: str, neighbour: str, fabric: Fabric, twins: Mapping[str, Mapping[str, IPv4Interface]]
            ) -> tuple[str, IPv4Address] | None:
    """Our twin on the cable to a neighbour, and the neighbour's address on it: twin 0 of that cable carries the
    control plane (twin 1 stays the data path's alone). None while the neighbour's end has no address."""
    for end, link in fabric.ends_of(node):
        far = link.b if link.a == end else link.a
        if far.node == neighbour and end.twin == 0 and far.netdev in twins.get(neighbour, {}):
            return end.netdev, twins[neighbour][far.netdev].ip
    return None


def parse_routes(text: str) -> dict[str, str]:
    """`ip -4 route show` -> destination -> the rest of its line, for the /32 routes (printed without a prefix)."""
    out = {}
    for line in text.splitlines():
        words = line.split()
        if words and "/" not in words[0] and words[0] not in ("default", "local", "broadcast"):
            out[words[0]] = " ".join(words[1:])
    return out


def missing_routes(plan: NodeAddress, routes_now: Mapping[str, str]) -> tuple[Route, ...]:
    """The planned routes the kernel does not hold as planned (absent, or through another neighbour)."""
    return tuple(r for r in plan.routes if not _same(r, routes_now.get(str(r.to), "")))


def route_fields(line: str) -> dict[str, str]:
    """The `via`, `dev` and `src` of a route as `parse_routes` keeps it (the line after its destination)."""
    words = line.split()
    return {key: words[i + 1] for i, key in enumerate(words[:-1]) if key in ("via", "dev", "src")}


def _same(route: Route, line: str) -> bool:
    pairs = route_fields(line)
    return (pairs.get("via"), pairs.get("dev"), pairs.get("src")) == (str(route.via), route.netdev, str(route.src))
