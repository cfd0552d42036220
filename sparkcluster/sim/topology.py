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


def link_local_address(twin: int, octet: int) -> ipaddress.IPv4Interface:
    """The address NVIDIA's "Connect two Sparks" netplan leaves on a twin: 169.254.0.0/16 (one /16 for both)."""
    return ipaddress.IPv4Interface(f"169.254.{(20, 201)[twin]}.{octet}/16")


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
    cabled_port: int
    nics: tuple[Nic, ...] = field(default_factory=tuple)

    @property
    def mgmt_ip(self) -> str:
        return _ip(self.nic(MGMT_NETDEV))

    @property
    def fabric_ips(self) -> tuple[str, str]:
        a, b = (n for n in self.nics if n.hca and n.cabled)
        return _ip(a), _ip(b)

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.mgmt_ip, *self.fabric_ips)

    def nic(self, netdev: str) -> Nic:
        return next(n for n in self.nics if n.netdev == netdev)


@dataclass(frozen=True)
class Topology:
    name: str
    subnets: Subnets
    hosts: tuple[HostSpec, ...]

    @property
    def prefix(self) -> str:
        """Short, per-cluster prefix for root-namespace interface names (15 characters at most in all)."""
        return f"sc{self.subnets.k}"

    @property
    def bridges(self) -> dict[str, ipaddress.IPv4Interface]:
        """Bridge name -> the runner's address on it (.1). Both fabric bridges get one too: without it,
        traffic to a fabric address from the root namespace would follow the machine's default route."""
        lan, fab_a, fab_b = self.subnets.all()
        return {
            f"{self.prefix}lan": ipaddress.IPv4Interface(f"{lan[1]}/24"),
            f"{self.prefix}fa": ipaddress.IPv4Interface(f"{fab_a[1]}/24"),
            f"{self.prefix}fb": ipaddress.IPv4Interface(f"{fab_b[1]}/24"),
        }


def _mac(k: int, host: int, nic: int) -> str:
    # Locally administered, unique per cluster/host/NIC, so RoCE link-local GIDs are stable across boots.
    return f"02:5c:{k:02x}:{host:02x}:{nic:02x}:01"


def build_topology(
    name: str,
    count: int,
    subnets: Subnets,
    drivers: list[str],
    port0_hosts: frozenset[str] = frozenset(),
    rdma_names: str = "roce",
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
    lan_bridge, fab_a_bridge, fab_b_bridge = (f"{prefix}lan", f"{prefix}fa", f"{prefix}fb")
    hosts = []
    for i, host_name in enumerate(names, start=1):
        octet = FIRST_HOST_OCTET + i - 1
        cabled_port = 0 if host_name in port0_hosts else 1
        lan, (fab_a, fab_b) = subnets.lan, subnets.fabric
        nics = [
            Nic(MGMT_NETDEV, f"{prefix}h{i}m", None, ipaddress.IPv4Interface(f"{lan[octet]}/24"), lan_bridge,
                LAN_MTU, LAN_SPEED_MBPS, _mac(subnets.k, i, 0)),
        ]
        for port in (0, 1):
            twins = qsfp_twins(port, rdma_names)
            for twin, ((netdev, hca), net, bridge) in enumerate(zip(twins, (fab_a, fab_b), (fab_a_bridge, fab_b_bridge))):
                cabled = port == cabled_port
                nics.append(Nic(
                    netdev,
                    f"{prefix}h{i}{'ab'[twin] if cabled else 'uv'[twin]}",
                    hca,
                    ipaddress.IPv4Interface(f"{net[octet]}/24") if cabled else None,
                    bridge if cabled else None,
                    FABRIC_MTU,
                    QSFP_SPEED_MBPS,
                    _mac(subnets.k, i, 1 + 2 * port + twin),
                ))
        driver = drivers[0] if len(drivers) == 1 else drivers[i - 1]
        hosts.append(HostSpec(i, host_name, f"sc-{name}-{host_name}", driver, cabled_port, tuple(nics)))
    return Topology(name, subnets, tuple(hosts))
