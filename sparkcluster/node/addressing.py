"""The QSFP fabric's addresses, planned from facts: which port is cabled, which of its twins lack an IPv4
address, what each gets, and the netplan file that keeps it across reboots. Pure functions; the step in
steps/addresses.py carries the plan out.

The layout is the one eugr's networking guide and NVIDIA's playbook give real Sparks: each
twin of the cabled port on its own subnet, one address per node per subnet, MTU 9000. A direct cable and a
switch use the same scheme. Addresses a user already gave a twin are kept, never renumbered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface, IPv4Network

import yaml

from ..engine.facts import HostFacts
from ..engine.inventory import Host, Inventory
from .fabric import TOPOLOGIES, Fabric
from .network import QsfpError, qsfp_port
from .routed import CONTROL_PLANES, DEFAULT_NODE_SUBNET, NODE_NETDEV, NodeAddress

# eugr's pair (NETWORKING.md): twin 0 of the cabled port on the first, twin 1 on the second.
DEFAULT_SUBNETS = ("192.168.177.0/24", "192.168.178.0/24")
DEFAULT_MTU = 9000
# How long a node waits for the CLI to reach it again after its addresses change before it rolls back by itself.
DEFAULT_CONFIRM_S = 30
FIRST_HOST = 11  # the head is .11, the next node .12, as in eugr's setup
NETPLAN_FILE = "/etc/netplan/40-sparkcluster-fabric.yaml"
# NVIDIA's "Connect two Sparks" netplan leaves each twin on 169.254.0.0/16 (link-local, MTU 1500): both twins on one
# /16, which NCCL and gloo cannot tell apart, and a /16 that autodiscovery probes for minutes (F10). Replaced by the
# fabric subnets unless the inventory pins a link-local subnet or fabric_ip.
LINK_LOCAL = IPv4Network("169.254.0.0/16")
ANY_ADDRESS_FIX = "set vars: {fabric: {subnets: [A/24, B/24], mtu: 9000}} in the inventory"
NODE_SUBNET_FIX = ("set vars: {fabric: {control_plane: routed, node_subnet: A/24}} with a network that is neither "
                   "the management LAN nor a link's, or control_plane: lan to keep a ring's control plane on the LAN")


class FabricError(QsfpError):
    """The fabric cannot be addressed as planned: what was found, and the fix."""


@dataclass(frozen=True)
class FabricConfig:
    subnets: tuple[IPv4Network, IPv4Network]
    mtu: int
    confirm_s: float = DEFAULT_CONFIRM_S
    control_plane: str = "routed"  # on a ring: routed node addresses (routed.py), or the management LAN ("lan")
    node_subnet: IPv4Network = IPv4Network(DEFAULT_NODE_SUBNET)


@dataclass(frozen=True)
class Twin:
    netdev: str
    subnet: IPv4Network
    address: IPv4Interface  # this node's address on it: the one it has, or the one it gets
    mtu: int  # what it has now
    assign: bool  # the address is ours to add (the twin has no IPv4 yet)
    managed: bool  # the netplan file holds this twin (we addressed it, now or in an earlier run)
    replaces: tuple[IPv4Interface, ...] = ()  # link-local addresses it holds now, removed once it has its own


@dataclass(frozen=True)
class AddressPlan:
    port: int | None  # the cabled QSFP port; None where both are (a ring node: each cable on its own subnets)
    twins: tuple[Twin, ...]
    mtu: int
    notes: tuple[str, ...] = ()
    node: NodeAddress | None = None  # a ring node's routed control-plane address and routes (routed.py)

    @property
    def to_assign(self) -> tuple[Twin, ...]:
        return tuple(t for t in self.twins if t.assign)

    @property
    def to_retune(self) -> tuple[Twin, ...]:
        return tuple(t for t in self.twins if t.managed and t.mtu != self.mtu)


def fabric_config(inventory: Inventory, host: Host, fabric: Sequence[HostFacts] = ()) -> FabricConfig:
    """`fabric: {subnets: [A, B], mtu: 9000}` from the inventory's vars (host over group over all). Without
    subnets there, the ones the fabric already uses (`fabric`: the nodes' facts), so a node that lost an address
    rejoins its peers' subnet; on a fabric with no addresses yet, the defaults."""
    raw = host.vars.get("fabric", inventory.vars.get("fabric")) or {}
    if not isinstance(raw, Mapping):
        raise FabricError(f"fabric: must be a mapping, not {raw!r}", ANY_ADDRESS_FIX)
    unknown = sorted(set(raw) - {"subnets", "mtu", "confirm_timeout", "topology", "control_plane", "node_subnet"})
    if unknown:
        raise FabricError(f"fabric: unknown key {unknown[0]!r} (known: topology, subnets, mtu, confirm_timeout, "
                          "control_plane, node_subnet)", ANY_ADDRESS_FIX)
    if raw.get("topology", "auto") not in TOPOLOGIES:
        raise FabricError(f"fabric.topology must be one of {', '.join(TOPOLOGIES)}, not {raw['topology']!r}",
                          "set vars: {fabric: {topology: auto}} (auto: whatever the cables form)")
    subnets = raw.get("subnets") or in_use(fabric)
    if not isinstance(subnets, Sequence) or isinstance(subnets, str) or len(subnets) != 2:
        raise FabricError(f"fabric.subnets must list two IPv4 networks (one per twin), not {subnets!r}",
                          ANY_ADDRESS_FIX)
    try:
        nets = tuple(IPv4Network(str(s)) for s in subnets)
    except ValueError as e:
        raise FabricError(f"fabric.subnets: {e}", ANY_ADDRESS_FIX) from None
    if nets[0].overlaps(nets[1]):
        raise FabricError(f"fabric.subnets {nets[0]} and {nets[1]} overlap: each twin needs its own subnet",
                          ANY_ADDRESS_FIX)
    mtu = raw.get("mtu", DEFAULT_MTU)
    if not isinstance(mtu, int) or isinstance(mtu, bool) or not 1280 <= mtu <= 9216:
        raise FabricError(f"fabric.mtu must be a number from 1280 to 9216, not {mtu!r}", ANY_ADDRESS_FIX)
    confirm = raw.get("confirm_timeout", DEFAULT_CONFIRM_S)
    if not isinstance(confirm, (int, float)) or isinstance(confirm, bool) or not 5 <= confirm <= 600:
        raise FabricError(f"fabric.confirm_timeout must be 5 to 600 seconds, not {confirm!r}", ANY_ADDRESS_FIX)
    control_plane = raw.get("control_plane", "routed")
    if control_plane not in CONTROL_PLANES:
        raise FabricError(f"fabric.control_plane must be routed or lan, not {control_plane!r}", NODE_SUBNET_FIX)
    try:
        node_subnet = IPv4Network(str(raw.get("node_subnet", DEFAULT_NODE_SUBNET)))
    except ValueError as e:
        raise FabricError(f"fabric.node_subnet: {e}", NODE_SUBNET_FIX) from None
    return FabricConfig((nets[0], nets[1]), mtu, float(confirm), str(control_plane), node_subnet)


def check_node_subnet(inventory: Inventory, config: FabricConfig) -> None:
    """A ring's node addresses need room for every node and a network no link uses (checked where they are
    planned: a pair or a switch has none, so its links may use any subnet)."""
    node_subnet = config.node_subnet
    if FIRST_HOST + len(inventory.hosts) >= node_subnet.num_addresses:
        raise FabricError(f"fabric.node_subnet {node_subnet} holds no address .{FIRST_HOST + len(inventory.hosts)} "
                          f"for the last of {len(inventory.hosts)} nodes", NODE_SUBNET_FIX)
    # A ring of N nodes has N cables, each on two subnets: none of them may hold the node addresses.
    links = [segment_subnet(config, i) for i in range(2 * max(len(inventory.hosts), 2))]
    clash = next((n for n in links if n.overlaps(node_subnet)), None)
    if clash is not None:
        raise FabricError(f"fabric.node_subnet {node_subnet} overlaps the link subnet {clash}: the node "
                          "addresses need a network of their own", NODE_SUBNET_FIX)


def routed_control_plane(inventory: Inventory, host: Host) -> bool:
    """Whether a ring node's control plane is its routed node address (the default) or the management LAN."""
    raw = host.vars.get("fabric", inventory.vars.get("fabric")) or {}
    return not isinstance(raw, Mapping) or raw.get("control_plane", "routed") != "lan"


def in_use(fabric: Sequence[HostFacts]) -> tuple[str, str]:
    """Per twin (0, 1), the subnet most of the nodes' cabled twins already sit on; the default where none does."""
    seen: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    for facts in fabric:
        try:
            _, netdevs = cabled_port(facts)
        except FabricError:
            continue
        for index, netdev in enumerate(netdevs[:2]):
            interface = facts.interface(netdev)
            for cidr in interface.ipv4 if interface else ():
                if cidr.ip not in LINK_LOCAL:  # NVIDIA's playbook state, not a choice to follow
                    seen[index][str(cidr.network)] += 1
    return (seen[0].most_common(1)[0][0] if seen[0] else DEFAULT_SUBNETS[0],
            seen[1].most_common(1)[0][0] if seen[1] else DEFAULT_SUBNETS[1])


def segment_subnet(config: FabricConfig, index: int) -> IPv4Network:
    """The fabric's subnet number `index`: the two configured ones first (a pair's or switch's twins, a ring's
    first cable), then the networks of the same size that follow the second (a ring's further cables: with the
    defaults 192.168.179.0/24, 192.168.180.0/24 ...)."""
    if index < len(config.subnets):
        return config.subnets[index]
    last = config.subnets[-1]
    step = index - len(config.subnets) + 1
    return IPv4Network((int(last.network_address) + step * last.num_addresses, last.prefixlen))


def host_number(inventory: Inventory, name: str) -> int:
    """The last part of a node's fabric addresses: the head is FIRST_HOST, the others follow in inventory order.
    Counted over the whole inventory, so `--limit` never renumbers a node."""
    order = inventory.position(name)
    return FIRST_HOST + order


def cabled_port(facts: HostFacts) -> tuple[int, tuple[str, ...]]:
    """The QSFP port whose RDMA devices are Up (the cable is in it), and its twins' netdevs, twin 0 first."""
    up_ports = {d.netdev: port for d in facts.rdma if d.up and (port := qsfp_port(d.netdev)) is not None}
    if not up_ports:
        raise FabricError("no QSFP port has a link (no RDMA device is Up): the cable is not connected",
                          "seat the QSFP cable at both ends (either port works; the same port on every node is "
                          "simplest); `ibdev2netdev` must then show two devices (Up)")
    ports = sorted(set(up_ports.values()))
    if len(ports) > 1:
        raise FabricError(f"both QSFP ports have a link ({', '.join(up_ports)}): which carries the "
                          "cluster is ambiguous", "pin it with qsfp_interface: in the inventory, or unplug one")
    port = ports[0]
    # enpXs0fNnpN (the eugr-preferred twin) before enP2pXs0fNnpN: the same twin lands on the same subnet everywhere.
    twins = tuple(sorted(up_ports, key=lambda n: (n.startswith("enP"), n)))
    return port, twins


def assignments(host: Host, facts: HostFacts, config: FabricConfig,
                fabric: Fabric | None) -> tuple[int | None, list[tuple[str, IPv4Network]]]:
    """Which subnet each of the node's cabled twins belongs on. A node whose direct cables go to two or more
    neighbours (a ring) puts each cable's twins on that cable's own subnets, as the fabric numbers them; a pair
    and a switch keep one subnet per twin."""
    if fabric is not None:
        ends = [end for end, link in fabric.ends_of(host.name) if link.direct]
        if len({link.cable for _, link in fabric.ends_of(host.name) if link.direct}) > 1:
            return None, [(end.netdev, segment_subnet(config, fabric.segment(end))) for end in ends]
    port, netdevs = cabled_port(facts)
    return port, [(netdev, config.subnets[index]) for index, netdev in enumerate(netdevs[:2])]


def plan_addresses(inventory: Inventory, host: Host, facts: HostFacts, config: FabricConfig,
                   managed_now: Sequence[str] = (), fabric: Fabric | None = None) -> AddressPlan:
    """What this node's cabled twins need. `managed_now`: the twins the node's netplan file already holds;
    `fabric`: the graph discovery found (a ring's cables each get their own subnets)."""
    port, planned = assignments(host, facts, config, fabric)
    number = host_number(inventory, host.name)
    if host.fabric_ip:  # a pin: twin 0 gets exactly it, twin 1 the same host part on its own subnet
        pin = IPv4Address(host.fabric_ip)
        if pin not in config.subnets[0]:
            raise FabricError(f"{host.name}: fabric_ip {pin} is not in the first fabric subnet {config.subnets[0]}",
                              "pin an address inside it, or " + ANY_ADDRESS_FIX)
        number = int(pin) - int(config.subnets[0].network_address)
    twins, notes = [], []
    for netdev, subnet in planned:
        interface = facts.interface(netdev)
        if interface is None:
            raise FabricError(f"{host.name}: {netdev} has an Up RDMA device but no network interface",
                              "check the mlx5 driver (`ibdev2netdev` and `ip link` must agree)")
        pinned_link_local = subnet.subnet_of(LINK_LOCAL) or bool(host.fabric_ip and IPv4Address(host.fabric_ip) in LINK_LOCAL)
        replaced = tuple(a for a in interface.ipv4 if a.ip in LINK_LOCAL and not pinned_link_local)
        existing = [a for a in interface.ipv4 if a not in replaced]
        if existing:  # kept as it is, whoever set it
            twins.append(Twin(netdev, existing[0].network, existing[0], interface.mtu, False, netdev in managed_now))
            continue
        if number >= subnet.num_addresses - 1:
            raise FabricError(f"{subnet} has no address .{number} for {host.name}", ANY_ADDRESS_FIX)
        address = IPv4Interface(f"{subnet[number]}/{subnet.prefixlen}")
        twins.append(Twin(netdev, subnet, address, interface.mtu, True, True, replaced))
        if replaced:
            notes.append(f"{netdev}: {', '.join(map(str, replaced))} (link-local, as NVIDIA's playbook leaves it) "
                         f"is replaced by {address}; pin fabric.subnets to 169.254.0.0/16 to keep it")
    # Both twins on NVIDIA's one link-local /16 only where the inventory pinned it so: the user's choice.
    both_link_local = all(t.address.ip in LINK_LOCAL for t in twins)
    for i, first in enumerate(twins):
        for second in twins[i + 1:]:
            if first.address.network.overlaps(second.address.network) and not both_link_local:
                raise FabricError(f"{first.netdev} ({first.address}) and {second.netdev} ({second.address}) would "
                                  "share a subnet: each twin needs its own", ANY_ADDRESS_FIX)
    if len(twins) < 2:
        notes.append(f"only one twin of port {port} is Up ({planned[0][0]}): half the link's bandwidth")
    return AddressPlan(port, tuple(twins), config.mtu, tuple(notes))


def collisions(plan: AddressPlan, facts: HostFacts) -> list[str]:
    """A planned subnet that overlaps one of the node's other networks (the management LAN above all): the
    kernel would route between them and traffic could leave by the wrong port."""
    problems = []
    fabric_netdevs = {t.netdev for t in plan.twins} | {NODE_NETDEV}
    if plan.node is not None:
        for interface in facts.interfaces:
            for cidr in interface.ipv4 if interface.name not in fabric_netdevs else ():
                if cidr.network.overlaps(plan.node.address.network):
                    problems.append(f"the node address {plan.node.address} (fabric.node_subnet) is on {cidr.network} "
                                    f"of {interface.name}")
    for twin in plan.to_assign:
        for interface in facts.interfaces:
            if interface.name in fabric_netdevs:
                continue
            for cidr in interface.ipv4:
                network = cidr.network
                if network.overlaps(twin.subnet):
                    problems.append(f"the fabric subnet {twin.subnet} for {twin.netdev} overlaps {network} on "
                                    f"{interface.name}")
    return problems


def duplicates(plans: Mapping[str, AddressPlan]) -> list[str]:
    """The same address planned (or held) by two nodes of the inventory."""
    seen: dict[str, str] = {}
    problems = []
    for name, plan in plans.items():
        for twin in plan.twins:
            ip = str(twin.address.ip)
            if ip in seen and seen[ip] != name:
                problems.append(f"{ip} is {seen[ip]}'s and {name}'s")
            seen.setdefault(ip, name)
    return problems


def netplan_yaml(plan: AddressPlan) -> str:
    """The netplan file for the twins this tool addresses (mode 600, as netplan wants): link-local off, so
    NCCL and Ray never pick a 169.254 address."""
    ethernets: dict[str, dict[str, object]] = {
        t.netdev: {"dhcp4": False, "dhcp6": False, "link-local": [], "mtu": plan.mtu, "addresses": [str(t.address)]}
        for t in plan.twins if t.managed}
    network: dict[str, object] = {"version": 2, "ethernets": ethernets}
    if plan.node is not None:
        # A twin addressed by the user gets an entry with the routes alone: netplan merges it with the user's file.
        routes: dict[str, list[dict[str, str]]] = {}
        for route in plan.node.routes:
            routes.setdefault(route.netdev, []).append({"to": f"{route.to}/32", "via": str(route.via),
                                                        "from": str(route.src)})
        for netdev, listed in routes.items():
            ethernets.setdefault(netdev, {})["routes"] = listed
        network["bridges"] = {NODE_NETDEV: {"dhcp4": False, "dhcp6": False, "link-local": [],
                                            "addresses": [str(plan.node.address)]}}
    header = ("# Written by `sparkcluster bootstrap`: the QSFP fabric's addresses (each twin on its own subnet)"
              + (";\n# on a ring, the node's control-plane address and its routes to the others" if plan.node else "")
              + ".\n# Addresses you set yourself live in other files and are kept.\n")
    return header + yaml.safe_dump({"network": network}, sort_keys=False)


def managed_netdevs(netplan_text: str | None) -> tuple[str, ...]:
    """The twins an existing sparkcluster netplan file addresses (an entry with routes alone is the user's twin)."""
    if not netplan_text:
        return ()
    try:
        doc = yaml.safe_load(netplan_text)
        ethernets = (doc.get("network") or {}).get("ethernets") or {}
        return tuple(name for name, entry in ethernets.items() if not isinstance(entry, dict) or "addresses" in entry)
    except (yaml.YAMLError, AttributeError):
        return ()
