"""The shape of a simulated cluster: host names, NICs, addresses and RDMA devices (pure data, no I/O).

A DGX Spark has a 10 GbE management port (enP7s7) and two QSFP ports; each QSFP port shows up as two
"twin" netdevs with an RDMA device each (tests/fixtures/probe-spark.txt). Only the cabled port's twins carry
traffic; the other port's twins exist but are down, as on a real Spark.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

MGMT_NETDEV = "enP7s7"
FABRIC_MTU = 9000
LAN_MTU = 1500
QSFP_SPEED_MBPS = 200_000
LAN_SPEED_MBPS = 10_000
FIRST_HOST_OCTET = 11  # spark-1 = .11, like eugr's canonical 192.168.177.11


RDMA_NAMES = ("roce", "mlx5")


def qsfp_twins(port: int, rdma_names: str = "roce") -> tuple[tuple[str, str], tuple[str, str]]:
    """(netdev, RDMA device) of the two twins of QSFP port 0 or 1, the eugr-preferred twin first. Some kernels
    name the devices mlx5_N in PCI order instead of by their slot (rocep1s0f0 = mlx5_0, rocep1s0f1 = mlx5_1,
    roceP2p1s0f0 = mlx5_2, roceP2p1s0f1 = mlx5_3)."""
    if rdma_names == "mlx5":
        return ((f"enp1s0f{port}np{port}", f"mlx5_{port}"), (f"enP2p1s0f{port}np{port}", f"mlx5_{2 + port}"))
    return ((f"enp1s0f{port}np{port}", f"rocep1s0f{port}"), (f"enP2p1s0f{port}np{port}", f"roceP2p1s0f{port}"))


def link_local_address(i: int, octet: int) -> ipaddress.IPv4Interface:
    """The address NVIDIA's "Connect two Sparks" netplan leaves on a node's i-th cabled twin: 169.254.0.0/16 (one
    /16 for every twin). IPv4 link-local picks one address per interface, so a ring node's four twins hold four."""
    return ipaddress.IPv4Interface(f"169.254.{(20, 201, 21, 202)[i]}.{octet}/16")


@dataclass(frozen=True)
class Subnets:
    """The three /24 networks of one simulated cluster, chosen by the block number `k`."""

    k: int

    @property
    def lan(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"192.168.{self.k}.0/24")

    @property
    def fabric(self) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
        # The two twins sit on different subnets, as NVIDIA's switch playbook and eugr's NETWORKING.md ask.
        return ipaddress.IPv4Network(f"10.{self.k}.0.0/24"), ipaddress.IPv4Network(f"10.{self.k}.1.0/24")

    def segment(self, j: int) -> ipaddress.IPv4Network:
        """The j-th fabric subnet: a switch's or a pair's twins use 0 and 1, a ring's cable c 2c and 2c+1."""
        return ipaddress.IPv4Network(f"10.{self.k}.{j}.0/24")

    def all(self) -> tuple[ipaddress.IPv4Network, ...]:
        return (self.lan, *self.fabric)


@dataclass(frozen=True)
class Nic:
    netdev: str  # name inside the simulated host
    root_end: str  # the other veth end, in the root namespace
    hca: str | None = None  # RDMA device; None for the management port
    address: ipaddress.IPv4Interface | None = None  # None: not cabled
    bridge: str | None = None  # None: the cable is unplugged (the root end is left down)
    mtu: int = FABRIC_MTU
    speed_mbps: int = QSFP_SPEED_MBPS
    mac: str = ""

    @property
    def cabled(self) -> bool:
        return self.bridge is not None


def _ip(nic: Nic) -> str:
    if nic.address is None:
        raise ValueError(f"{nic.netdev} has no address in the plan")  # a planning bug: only cabled NICs have none
    return str(nic.address.ip)


@dataclass(frozen=True)
class HostSpec:
    index: int
    name: str
    netns: str
    driver_version: str
    cabled_port: int  # the first cabled QSFP port (a ring node has both)
    nics: tuple[Nic, ...] = field(default_factory=tuple)

    @property
    def mgmt_ip(self) -> str:
        return _ip(self.nic(MGMT_NETDEV))

    @property
    def fabric_ips(self) -> tuple[str, str]:
        """The addresses of the first cabled port's two twins (on a ring: port 0's, one cable of two)."""
        a, b = [n for n in self.nics if n.hca and n.cabled][:2]
        return _ip(a), _ip(b)

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.mgmt_ip, *self.fabric_ips)

    def nic(self, netdev: str) -> Nic:
        return next(n for n in self.nics if n.netdev == netdev)


@dataclass(frozen=True)
class Wire:
    """One L2 segment of the fabric: a root-namespace bridge. A direct cable's twin is a wire with two ends; a
    switch is one wire per twin with every node on it."""

    bridge: str
    ends: tuple[tuple[int, int, int], ...]  # (host index, QSFP port, twin)
    segment: int  # which subnet of the fabric's list it carries (Subnets.segment)
    runner: bool  # the runner has an address on it (a switch's bridges; a cable has nobody else on it)


@dataclass(frozen=True)
class Topology:
    name: str
    subnets: Subnets
    hosts: tuple[HostSpec, ...]
    wires: tuple[Wire, ...] = ()
    kind: str = "switch"
    miscable: str = ""
    pins: tuple[tuple[str, str], ...] = ()  # (host, qsfp_interface) the inventory pins (--miscable pinned-away)

    @property
    def prefix(self) -> str:
        """Short, per-cluster prefix for root-namespace interface names (15 characters at most in all)."""
        return f"sc{self.subnets.k}"

    @property
    def bridges(self) -> dict[str, ipaddress.IPv4Interface | None]:
        """Bridge name -> the runner's address on it (.1), or None on a cable's bridge (nobody else is on a
        cable). A switch's bridges get one: without it, traffic to a fabric address from the root namespace
        would follow the machine's default route."""
        out: dict[str, ipaddress.IPv4Interface | None] = {
            f"{self.prefix}lan": ipaddress.IPv4Interface(f"{self.subnets.lan[1]}/24")}
        for wire in self.wires:
            net = self.subnets.segment(wire.segment)
            out[wire.bridge] = ipaddress.IPv4Interface(f"{net[1]}/24") if wire.runner else None
        return out


def _mac(k: int, host: int, nic: int) -> str:
    # Locally administered, unique per cluster/host/NIC, so RoCE link-local GIDs are stable across boots.
    return f"02:5c:{k:02x}:{host:02x}:{nic:02x}:01"


TOPOLOGIES = ("switch", "pair", "ring")
MISCABLES = ("port0-port0", "self", "missing-link", "mixed", "pinned-away")
Cable = tuple[int, int, int, int]  # (host index, port, host index, port)


def cabling(kind: str, count: int, port0: set[int], miscable: str = "") -> tuple[list[Cable], dict[int, int]]:
    """The direct cables and the switch's members (host index -> port) of a topology, with one mistake made
    if `miscable` names one. A ring runs crosswise: port 1 of each node to port 0 of the next."""
    if kind not in TOPOLOGIES:
        raise ValueError(f"--topology {kind!r}: choose from {', '.join(TOPOLOGIES)}")
    if miscable and miscable not in MISCABLES:
        raise ValueError(f"--miscable {miscable!r}: choose from {', '.join(MISCABLES)}")
    cables: list[Cable] = []
    switch: dict[int, int] = {}
    if kind == "switch":
        switch = {i: 0 if i in port0 else 1 for i in range(1, count + 1)}
    elif kind == "pair":
        if count != 2:
            raise ValueError(f"a pair is 2 nodes, not {count}")
        cables = [(1, 0 if 1 in port0 else 1, 2, 0 if 2 in port0 else 1)]
    else:
        if not 3 <= count <= 8:
            raise ValueError(f"a ring is 3 to 8 nodes, not {count}")
        cables = [(i, 1, i + 1, 0) for i in range(1, count)] + [(count, 1, 1, 0)]
    ring_only = {"port0-port0", "missing-link", "mixed"}
    if miscable in ring_only and kind != "ring":
        raise ValueError(f"--miscable {miscable} needs --topology ring")
    if miscable == "pinned-away" and kind == "ring":
        raise ValueError("--miscable pinned-away needs --topology pair or switch")
    if miscable == "port0-port0":
        cables[0], cables[-1] = (1, 0, 2, 0), (count, 1, 1, 1)
    elif miscable == "missing-link":
        cables.pop()
    elif miscable == "mixed":
        cables = [(1, 1, 2, 0)]
        switch = {1: 0, 2: 1, **{i: 1 for i in range(3, count + 1)}}
    elif miscable == "self":
        last = count
        cables = [c for c in cables if last not in (c[0], c[2])] + [(last, 0, last, 1)]
        switch.pop(last, None)
    elif miscable == "pinned-away":
        if kind == "switch":
            switch[2] = 0
        else:
            cables = [(1, cables[0][1], 2, 0)]
    return cables, switch


def build_topology(
    name: str,
    count: int,
    subnets: Subnets,
    drivers: list[str],
    port0_hosts: frozenset[str] = frozenset(),
    rdma_names: str = "roce",
    kind: str = "switch",
    miscable: str = "",
) -> Topology:
    """The full plan for `count` hosts. `drivers` has one version for all hosts or one per host."""
    if count < 1:
        raise ValueError("a cluster needs at least one host")
    if count > 200:
        raise ValueError("at most 200 hosts fit in one /24 per network")
    if rdma_names not in RDMA_NAMES:
        raise ValueError(f"--rdma-names {rdma_names!r}: choose from {', '.join(RDMA_NAMES)}")
    if len(drivers) not in (1, count):
        raise ValueError(f"give one --driver for all hosts or exactly {count} (one per host), not {len(drivers)}")
    names = [f"spark-{i}" for i in range(1, count + 1)]
    unknown = sorted(port0_hosts - set(names))
    if unknown:
        raise ValueError(f"--port0 names unknown host(s) {', '.join(unknown)}; hosts are {names[0]}..{names[-1]}")
    prefix = f"sc{subnets.k}"
    cables, switch = cabling(kind, count, {names.index(h) + 1 for h in port0_hosts}, miscable)
    wires: list[Wire] = []
    for twin in (0, 1):
        if switch:
            wires.append(Wire(f"{prefix}f{'ab'[twin]}", tuple((i, p, twin) for i, p in sorted(switch.items())),
                              twin, True))
    # Cables in the order the fabric graph numbers them (node nearer the head first), so the subnets they carry
    # are the ones bootstrap plans: cable c carries segments 2c and 2c+1 (after the switch's two, if any).
    ordered = sorted(((a, pa, b, pb) if (a, pa) <= (b, pb) else (b, pb, a, pa)) for a, pa, b, pb in cables)
    offset = 2 if switch else 0
    for c, (a, pa, b, pb) in enumerate(ordered):
        for twin in (0, 1):
            wires.append(Wire(f"{prefix}c{c}{'ab'[twin]}", ((a, pa, twin), (b, pb, twin)), offset + 2 * c + twin,
                              False))
    hosts = []
    for i, host_name in enumerate(names, start=1):
        octet = FIRST_HOST_OCTET + i - 1
        lan = subnets.lan
        nics = [
            Nic(MGMT_NETDEV, f"{prefix}h{i}m", None, ipaddress.IPv4Interface(f"{lan[octet]}/24"), f"{prefix}lan",
                LAN_MTU, LAN_SPEED_MBPS, _mac(subnets.k, i, 0)),
        ]
        ports = []
        for port in (0, 1):
            for twin, (netdev, hca) in enumerate(qsfp_twins(port, rdma_names)):
                wire = next((w for w in wires if (i, port, twin) in w.ends), None)
                net = subnets.segment(wire.segment) if wire else None
                if wire:
                    ports.append(port)
                nics.append(Nic(
                    netdev,
                    f"{prefix}h{i}{'uvab'[2 * port + twin]}",
                    hca,
                    ipaddress.IPv4Interface(f"{net[octet]}/24") if net else None,
                    wire.bridge if wire else None,
                    FABRIC_MTU,
                    QSFP_SPEED_MBPS,
                    _mac(subnets.k, i, 1 + 2 * port + twin),
                ))
        driver = drivers[0] if len(drivers) == 1 else drivers[i - 1]
        hosts.append(HostSpec(i, host_name, f"sc-{name}-{host_name}", driver, min(ports, default=1), tuple(nics)))
    pins = (("spark-2", qsfp_twins(1, rdma_names)[0][0]),) if miscable == "pinned-away" else ()
    return Topology(name, subnets, tuple(hosts), tuple(wires), kind, miscable, pins)
