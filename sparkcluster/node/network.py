"""Which QSFP interface, RDMA devices and GID each node binds its comm traffic to, and the env that says so.

Pure functions over one node's own HostFacts. Each node is configured from its own interfaces, never from the
head's names, so nodes cabled on different ports still bind to their own link (docs/failure-modes.md F19, F22).
The detection follows eugr's autodiscover.sh so that the resulting env matches his setup.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Interface

from ..engine.errors import SparkclusterError
from ..engine.facts import Gid, HostFacts, RdmaDevice
from ..engine.inventory import Host

RECOMMENDED_MTU = 9000
FULL_SPEED_MBPS = 200000
ROCE_V2 = "RoCE v2"
# Where bootstrap writes each node's comm env (the inventory's comm_env_path overrides it); Ray, vLLM and the
# probe read it back there.
COMM_ENV_PATH = "~/.config/sparkcluster/comm.env"

# enp1s0f1np1 / enP2p1s0f1np1: the two twins (PCIe functions) of physical QSFP port 1.
_QSFP_NETDEV = re.compile(r"en(?:P\d+)?p\d+s\d+f(\d+)np\1")
# The env file is sourced by a shell and read literally by docker --env-file, so values must need no quoting;
# Linux allows '$', ';' and '(' in interface names.
_ENV_VALUE = re.compile(r"[A-Za-z0-9_.,:-]+")
NODE_NETDEV = "scnode"  # a ring node's routed control-plane address lives on this port-less bridge (routed.py)


@dataclass(frozen=True)
class QsfpChoice:
    netdev: str  # the QSFP interface every socket binds to
    ip: str  # its IPv4 address, without prefix
    prefix: int
    hcas: tuple[str, ...]  # NCCL_IB_HCA: the Up RDMA devices of the cabled port, in ibdev2netdev order
    twins: tuple[str, ...]  # the netdevs of those HCAs
    port: int | None  # the cabled physical QSFP port; None when the netdev names do not follow the Spark pattern
    gid_index: int | None  # NCCL_IB_GID_INDEX: the RoCE v2 IPv4-mapped GID of the netdev's HCA
    mtu: int
    speed_mbps: int | None
    source: str  # "detected" or "pinned"
    warnings: tuple[str, ...] = ()


class QsfpError(SparkclusterError):
    """A node whose QSFP link cannot carry the cluster's traffic: what was found, and the fix."""


def qsfp_port(netdev: str) -> int | None:
    """enp1s0f0np0 / enP2p1s0f0np0 -> 0; enp1s0f1np1 / enP2p1s0f1np1 -> 1; other names -> None."""
    m = _QSFP_NETDEV.fullmatch(netdev)
    return int(m[1]) if m else None


def choose_qsfp(facts: HostFacts, *, pin_interface: str | None = None, pin_ip: str | None = None,
                pin_hcas: Sequence[str] = ()) -> QsfpChoice:
    """This node's QSFP binding from its own facts (and the inventory's pins); QsfpError when the link is unusable."""
    if not facts.rdma:
        raise QsfpError("no RDMA devices found (ibdev2netdev / /sys/class/infiniband)",
                        "install the Mellanox/DOCA OFED driver (DGX OS ships it), then check that `ibdev2netdev` "
                        "lists the four ConnectX-7 devices")
    up = tuple(d for d in facts.rdma if d.up)
    if not up:
        raise QsfpError(f"no RDMA device is Up ({_listing(facts.rdma)}): the QSFP cable is not connected or the link "
                        "is down", "check that the QSFP cable is seated at both ends, on the same port of every node; "
                                   "`ibdev2netdev` must show the cabled port's two devices as (Up)")
    pinned = _pinned_hcas(facts.rdma, pin_hcas)
    netdev = _choose_netdev(facts, up, pinned, pin_interface, pin_ip)
    interface = facts.interface(netdev)
    assert interface is not None  # _choose_netdev only returns addressed interfaces
    address = _choose_address(netdev, interface.ipv4, pin_ip)
    port = qsfp_port(netdev)
    devices = pinned or tuple(d for d in up if qsfp_port(d.netdev) == port)
    twins = tuple(dict.fromkeys(d.netdev for d in devices))
    _check_subnets(facts, netdev, address, twins)
    hca = next(d for d in up if d.netdev == netdev)
    gid = _ipv4_gid(facts.gids, hca, address.ip)
    warnings = (
        *_address_warnings(facts, netdev, twins, interface.ipv4, pin_ip),
        *_link_warnings(facts, twins),
        *_port_warnings(up, devices, netdev, port, bool(pinned)),
        *_gid_warnings(facts, hca, gid, address.ip, devices),
        *health_warnings(facts, twins),
    )
    return QsfpChoice(
        netdev=netdev, ip=str(address.ip), prefix=address.network.prefixlen,
        hcas=tuple(d.hca for d in devices), twins=twins, port=port,
        gid_index=gid.index if gid and _every_twin_has(facts, devices, gid.index) else None, mtu=interface.mtu, speed_mbps=interface.speed_mbps,
        source="pinned" if pin_interface or pin_ip or pin_hcas else "detected", warnings=warnings,
    )


def choose_for(host: Host, facts: HostFacts) -> QsfpChoice:
    """choose_qsfp with the inventory's pins for this host; errors name the host."""
    try:
        return choose_qsfp(facts, pin_interface=host.qsfp_interface, pin_ip=host.fabric_ip, pin_hcas=host.hcas)
    except QsfpError as e:
        raise QsfpError(f"{host.name}: {e.message}", e.fix) from None


def comm_env(choice: QsfpChoice) -> dict[str, str]:
    """eugr's run-cluster-node.sh env (§1.5) plus NCCL_IGNORE_CPU_AFFINITY and the GID index, in that order."""
    ip, netdev = choice.ip, choice.netdev
    env = {
        "VLLM_HOST_IP": ip,
        "RAY_NODE_IP_ADDRESS": ip,
        "RAY_OVERRIDE_NODE_IP_ADDRESS": ip,
        "MN_IF_NAME": netdev,
        "UCX_NET_DEVICES": netdev,
        "NCCL_SOCKET_IFNAME": netdev,
        "NCCL_IB_HCA": ",".join(choice.hcas),
        "NCCL_IB_DISABLE": "0",
        "OMPI_MCA_btl_tcp_if_include": netdev,
        "GLOO_SOCKET_IFNAME": netdev,
        "TP_SOCKET_IFNAME": netdev,
        "RAY_memory_monitor_refresh_ms": "0",
        "NCCL_IGNORE_CPU_AFFINITY": "1",
    }
    if choice.gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(choice.gid_index)
    for key, value in env.items():
        if not _ENV_VALUE.fullmatch(value):
            raise QsfpError(f"{key}={value!r} cannot be written to an env file safely",
                            "rename the interface to letters, digits, '.', '_' and '-' (e.g. with a udev/netplan "
                            "`set-name`), or pin qsfp_interface and hcas to such names")
    return env


def cabling_report(choices: Mapping[str, QsfpChoice]) -> list[str]:
    """Lines for nodes bound to another port or netdev name than most nodes (F22); empty when all agree."""
    if not choices:
        return []
    layouts = {name: (c.port, c.netdev) for name, c in choices.items()}
    # Ties go to the first entry, the head, since Counter keeps insertion order among equal counts.
    common_port, common_netdev = Counter(layouts.values()).most_common(1)[0][0]
    agreeing = sum(1 for layout in layouts.values() if layout == (common_port, common_netdev))
    others = "the other" if agreeing == 1 else "the others"
    lines = []
    for name, (port, netdev) in layouts.items():
        if (port, netdev) == (common_port, common_netdev):
            continue
        if port != common_port:
            where = f"is cabled on {_port_name(port, netdev)}, {others} on {_port_name(common_port, common_netdev)}"
        else:
            where = f"binds to {netdev}, {others} to {common_netdev}"
        lines.append(f"{name} {where}: fine for sparkcluster, which configures each node from its own interfaces, "
                     "but eugr's scripts assume identical names (F22; NVIDIA recommends the same port on every node)")
    return lines


def fabric_subnet_mismatch(choices: Mapping[str, QsfpChoice]) -> list[str]:
    """Lines for nodes whose QSFP address and the head's (the first entry) are not on one subnet."""
    if not choices:
        return []
    head_name, head = next(iter(choices.items()))
    head_address = _interface_address(head)
    lines = []
    for name, choice in list(choices.items())[1:]:
        address = _interface_address(choice)
        # Both ends need the other on-link; a worker with a wider prefix still fails in the head's direction.
        if address.ip not in head_address.network or head_address.ip not in address.network:
            lines.append(f"{name}'s QSFP address {address} ({choice.netdev}) is not on the head {head_name}'s subnet "
                         f"{head_address.network} ({head.netdev} {head_address}): they cannot reach each other directly "
                         f"over the QSFP link; give {choice.netdev} an address in {head_address.network}")
    return lines


# ---- choosing --------------------------------------------------------------------------------------------
def _pinned_hcas(rdma: Sequence[RdmaDevice], names: Sequence[str]) -> tuple[RdmaDevice, ...]:
    by_name = {d.hca: d for d in rdma}
    for name in names:
        device = by_name.get(name)
        if device is None:
            raise QsfpError(f"hcas: there is no RDMA device {name} (here: {_listing(rdma)})",
                            "set hcas to the (Up) devices `ibdev2netdev` shows, or leave it out to detect them")
        if not device.up:
            raise QsfpError(f"hcas: {name} ({device.netdev}) is Down (Up: {_listing(d for d in rdma if d.up)})",
                            "cable its port, or pin only Up devices, or leave hcas out to detect them")
    return tuple(by_name[name] for name in names)


def _choose_netdev(facts: HostFacts, up: Sequence[RdmaDevice], pinned: Sequence[RdmaDevice],
                   pin_interface: str | None, pin_ip: str | None) -> str:
    if pin_interface:
        return _check_pinned_interface(facts, up, pin_interface)
    # Sockets must run on the same link as the RDMA devices, so pinned HCAs narrow the candidates.
    candidates = [d.netdev for d in pinned or up if _ipv4(facts, d.netdev)]
    if pin_ip:
        return _interface_with(facts, candidates, up, pin_ip)
    if not candidates:
        netdevs = [d.netdev for d in pinned or up if d.netdev]
        raise QsfpError(f"the Up QSFP interfaces ({', '.join(netdevs) or 'netdev unknown'}) have no IPv4 address",
                        _address_fix(_eugr_preference(netdevs) if netdevs else "<QSFP netdev>"))
    return _eugr_preference(candidates)


def _eugr_preference(netdevs: Sequence[str]) -> str:
    """autodiscover.sh: the first netdev without a capital P (enp1s0f1np1 over enP2p1s0f1np1), else the first."""
    return next((n for n in netdevs if "P" not in n), netdevs[0])


def _check_pinned_interface(facts: HostFacts, up: Sequence[RdmaDevice], name: str) -> str:
    mapped = [d for d in facts.rdma if d.netdev == name]
    if facts.interface(name) is None and not mapped:
        raise QsfpError(f"qsfp_interface {name}: no such interface (here: {', '.join(i.name for i in facts.interfaces)})",
                        f"set qsfp_interface to an Up netdev from `ibdev2netdev` ({_up_netdevs(up)}), "
                        "or leave it out to detect it")
    if not mapped:
        raise QsfpError(f"qsfp_interface {name} is not a QSFP interface: no RDMA device maps to it "
                        f"(Up RDMA netdevs: {_up_netdevs(up)})",
                        "pin the ConnectX-7 netdev the cable is in, not the management or Wi-Fi NIC, "
                        "or leave qsfp_interface out to detect it")
    if not any(d.up for d in mapped):
        raise QsfpError(f"qsfp_interface {name} is Down ({_listing(mapped)}; Up: {_up_netdevs(up)})",
                        "cable that port, or pin an Up interface, or leave qsfp_interface out to detect it")
    if not _ipv4(facts, name):
        raise QsfpError(f"qsfp_interface {name} has no IPv4 address", _address_fix(name))
    return name


def _interface_with(facts: HostFacts, candidates: Sequence[str], up: Sequence[RdmaDevice], ip: str) -> str:
    """The Up QSFP netdev that carries the pinned fabric_ip."""
    carriers = [i.name for i in facts.interfaces if i.has_ip(ip)]
    usable = [n for n in candidates if n in carriers]
    if usable:
        return usable[0]
    where = f"it is on {carriers[0]}, which is not an Up QSFP interface" if carriers else "no interface here has it"
    addresses = ", ".join(f"{d.netdev} {a}" for d in up for a in _ipv4(facts, d.netdev)) or "none"
    raise QsfpError(f"fabric_ip {ip}: {where} (QSFP addresses here: {addresses})",
                    "set fabric_ip to one of the QSFP addresses, or leave it out to detect it")


def _choose_address(netdev: str, ipv4: Sequence[IPv4Interface], pin_ip: str | None) -> IPv4Interface:
    addresses = list(ipv4)
    if pin_ip is None:
        return addresses[0]  # autodiscover.sh takes the first too (`head -n 1`)
    match = [a for a in addresses if str(a.ip) == pin_ip]
    if not match:
        raise QsfpError(f"fabric_ip {pin_ip} is not an address of {netdev} (it has {', '.join(map(str, ipv4))})",
                        f"set fabric_ip to {addresses[0].ip}, or add it: `sudo ip addr add {pin_ip}/24 dev {netdev}`")
    return match[0]


def _check_subnets(facts: HostFacts, netdev: str, address: IPv4Interface, twins: Sequence[str]) -> None:
    """F9: another interface on the QSFP subnet makes routing to the peers ambiguous and confuses autodetection."""
    for interface in facts.interfaces:
        if interface.name == netdev:
            continue
        for other in interface.ipv4:
            if other.network.overlaps(address.network):
                what = f"its twin {interface.name}" if interface.name in twins else interface.name
                moved = IPv4Interface((int(other.ip) + other.network.num_addresses, other.network.prefixlen))
                raise QsfpError(f"{netdev} ({address}) and {what} ({other}) are on the same subnet: routing to the "
                                "peers is ambiguous and eugr's autodetection picks the wrong interface (F9)",
                                f"put {interface.name} on a subnet of its own, e.g. `sudo ip addr del {other} dev "
                                f"{interface.name} && sudo ip addr add {moved} dev {interface.name}` (or in netplan); "
                                "NVIDIA and eugr give each twin its own /24")


def _ipv4_gid(gids: Iterable[Gid], device: RdmaDevice, ip: IPv4Address) -> Gid | None:
    """The RoCE v2 IPv4-mapped GID of `device`, preferring the one of `ip` when the netdev has several addresses."""
    candidates = [g for g in gids if g.hca == device.hca and g.port == device.port and g.type == ROCE_V2 and g.ipv4_mapped]
    return next((g for g in candidates if _mapped_ip(g) == ip), candidates[0] if candidates else None)


def _mapped_ip(gid: Gid) -> IPv4Address:
    """0000:...:ffff:c0a8:b10b -> 192.168.177.11."""
    return IPv4Address(int("".join(gid.gid.split(":")[-2:]), 16))


# ---- warnings --------------------------------------------------------------------------------------------
def _address_warnings(facts: HostFacts, netdev: str, twins: Sequence[str], ipv4: Sequence[IPv4Interface],
                      pin_ip: str | None) -> list[str]:
    warnings = []
    if len(ipv4) > 1 and pin_ip is None:
        warnings.append(f"{netdev} has {len(ipv4)} IPv4 addresses ({', '.join(map(str, ipv4))}); using the first "
                        "(set fabric_ip to choose another)")
    for twin in twins:
        if twin != netdev and not _ipv4(facts, twin):
            warnings.append(f"{twin}, the twin of {netdev}, has no IPv4 address, so its RDMA device has no RoCE v2 "
                            "IPv4 GID: NCCL may fail on it or get about half the bandwidth (F2); NVIDIA addresses both "
                            "twins, each on a /24 of its own")
    return warnings


def _link_warnings(facts: HostFacts, netdevs: Sequence[str]) -> list[str]:
    warnings = []
    for netdev in netdevs:
        interface = facts.interface(netdev)
        if interface is None:
            continue
        if interface.mtu < RECOMMENDED_MTU:
            warnings.append(f"{netdev} has MTU {interface.mtu} (RoCE path MTU {roce_path_mtu(interface.mtu)}, under "
                            f"4096): {RECOMMENDED_MTU} is recommended on both ends (F3: "
                            f"about 3 GB/s with 1500); e.g. `sudo ip link set {netdev} mtu {RECOMMENDED_MTU}` or "
                            "`mtu: 9000` in netplan")
        if interface.speed_mbps is not None and interface.speed_mbps < FULL_SPEED_MBPS:
            warnings.append(f"{netdev} negotiated {interface.speed_mbps} Mb/s, not {FULL_SPEED_MBPS} (F21): use a "
                            "200G-rated cable, or force 200G on the switch port")
    return warnings


def _port_warnings(up: Sequence[RdmaDevice], devices: Sequence[RdmaDevice], netdev: str, port: int | None,
                   pinned: bool) -> list[str]:
    warnings = []
    on_port = [d for d in devices if qsfp_port(d.netdev) == port]
    if port is not None and len(on_port) == 1:
        why = "hcas pins only one of them" if pinned else "the other twin is not Up"
        warnings.append(f"NCCL_IB_HCA has one twin of QSFP port {port} only ({on_port[0].hca}) because {why}: "
                        "about half the bandwidth (F2)")
    other_ports = [p for p in dict.fromkeys(qsfp_port(d.netdev) for d in up) if p != port]
    if other_ports:
        named = " and ".join(f"QSFP port {p}" if p is not None else "netdevs outside the QSFP naming" for p in other_ports)
        warnings.append(f"RDMA devices are Up on {named} too; only {_port_name(port, netdev)} is used, since "
                        "NCCL_IB_HCA must list only HCAs cabled to the peer (F6)")
    for device in devices:
        if qsfp_port(device.netdev) != port:
            warnings.append(f"hcas: {device.hca} ({device.netdev}) is not on the QSFP port of {netdev}: NCCL may pair "
                            "it with a port the peer is not cabled to (F6)")
    return warnings


def roce_path_mtu(netdev_mtu: int) -> int:
    """The RoCE MTU the HCA runs at on a netdev of this MTU: the largest IB MTU that fits with RoCE v2's headers
    (ib_write_bw prints it as `Mtu : 1024[B]` on a 1500-byte netdev, 4096 on 9000)."""
    return max((m for m in (256, 512, 1024, 2048, 4096) if m + 58 <= netdev_mtu), default=256)


def health_warnings(facts: HostFacts, twins: Sequence[str]) -> list[str]:
    """What the kernel says about the cabled twins' hardware: a PCIe link below what the ConnectX-7 can do, and
    its power / bandwidth messages (docs/failure-modes.md F24). Every channel still runs NET/IB at a few GB/s."""
    warnings = [f"{link.netdev}: PCIe link at {link.speed.replace('_', ' ')} x{link.width}, below its "
                f"{link.max_speed.replace('_', ' ')} x{link.max_width}: the twin runs degraded; reboot (a ConnectX-7 "
                "re-plugged without one stays so), then reseat the cable"
                for link in facts.pcie_links if link.netdev in twins and link.degraded]
    for message in facts.kernel_link_messages[-3:]:
        fix = ("reboot both nodes: after a hot re-plug only a reboot restores the slot's power" if "power" in message
               else "reboot, then check `sudo lspci -vv` LnkSta of the ConnectX-7")
        warnings.append(f"kernel: {message.strip()}: {fix} (F24)")
    return warnings


def _ipv4_indexes(facts: HostFacts, device: RdmaDevice) -> list[int]:
    return [g.index for g in facts.gids if g.hca == device.hca and g.port == device.port
            and g.type == ROCE_V2 and g.ipv4_mapped]


def _every_twin_has(facts: HostFacts, devices: Sequence[RdmaDevice], index: int) -> bool:
    """NCCL_IB_GID_INDEX applies to every HCA in NCCL_IB_HCA: it may only name an index each of them has as its
    RoCE v2 IPv4 GID. Otherwise it is left unset, and NCCL (>= 2.21) picks each HCA's RoCE v2 GID itself."""
    return all(index in _ipv4_indexes(facts, d) for d in devices)


def _gid_warnings(facts: HostFacts, hca: RdmaDevice, gid: Gid | None, ip: IPv4Address,
                  devices: Sequence[RdmaDevice]) -> list[str]:
    if gid is None:
        return [f"{hca.hca} has no RoCE v2 GID for an IPv4 address: NCCL_IB_GID_INDEX is left unset and NCCL picks a "
                f"GID itself; check /sys/class/infiniband/{hca.hca}/ports/{hca.port}/gid_attrs/types"]
    warnings = []
    for device in devices:
        indexes = _ipv4_indexes(facts, device)
        if not indexes:
            warnings.append(f"{device.hca} ({device.netdev}) has no RoCE v2 IPv4 GID (its RoCE GIDs are the IPv6 "
                            "link-local ones): NCCL_IB_GID_INDEX is left unset so that NCCL picks each HCA's GID "
                            f"itself; give {device.netdev} its IPv4 address (`sparkcluster bootstrap`)")
        elif gid.index not in indexes:
            warnings.append(f"{device.hca} has its RoCE v2 IPv4 GID at index {indexes[0]}, not {gid.index} (that of "
                            f"{ip} on {hca.hca}): NCCL_IB_GID_INDEX, which applies to every HCA, is left unset")
    return warnings


# ---- small helpers ---------------------------------------------------------------------------------------
def _ipv4(facts: HostFacts, netdev: str) -> tuple[IPv4Interface, ...]:
    interface = facts.interface(netdev) if netdev else None
    return interface.ipv4 if interface else ()


def _listing(devices: Iterable[RdmaDevice]) -> str:
    return ", ".join(f"{d.hca} -> {d.netdev or '?'} ({'Up' if d.up else 'Down'})" for d in devices) or "none"


def _up_netdevs(up: Sequence[RdmaDevice]) -> str:
    return ", ".join(d.netdev for d in up if d.netdev) or "none"


def _port_name(port: int | None, netdev: str) -> str:
    return netdev if port is None else f"QSFP port {port} ({netdev})"


def _address_fix(netdev: str) -> str:
    return (f"give {netdev} a static address, e.g. `sudo ip addr add 192.168.177.11/24 dev {netdev}` (lost at reboot) "
            "or in /etc/netplan/40-cx7.yaml; the other nodes get .12, .13 ... on the same /24, and the twin an "
            "address on another /24")


def _interface_address(choice: QsfpChoice) -> IPv4Interface:
    return IPv4Interface((choice.ip, choice.prefix))


def comm_env_path(host: Host) -> str:
    """Where this node's comm env is (remote, `~/` allowed)."""
    return str(host.vars.get("comm_env_path", COMM_ENV_PATH))


def ring_env(env: Mapping[str, str], nodes: int, hcas: Sequence[str], control_ip: str, control_netdev: str,
             link_prefix: int) -> dict[str, str]:
    """The comm env of a ring node, from the pair's: every cabled HCA in NCCL_IB_HCA, subnet-aware routing (each
    cable is its own subnets, so NCCL must pair HCAs by subnet), no GID index (it differs per twin), GDR off
    (GB10 has none); a 4-ring has no diagonal, so NCCL's tree cannot connect: the ring algorithm is forced. The
    control plane (Ray, gloo, vLLM's ZMQ, the rendezvous) runs on `control_ip`, an address every node reaches
    (a link's address reaches one neighbour only)."""
    out = {k: v for k, v in env.items() if k != "NCCL_IB_GID_INDEX"}
    for key in ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS"):
        out[key] = control_ip
    for key in ("MN_IF_NAME", "UCX_NET_DEVICES", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include",
                "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        out[key] = control_netdev
    out["NCCL_IB_HCA"] = ",".join(hcas)
    out["NCCL_IB_SUBNET_AWARE_ROUTING"] = "1"
    out["NCCL_NET_GDR_LEVEL"] = "0"
    if nodes >= 4:
        out.update({"NCCL_ALGO": "Ring", "NCCL_SKIP_TREE_CONNECT": "1", "NCCL_IB_SUBNET_PREFIX_LEN": str(link_prefix),
                    "NCCL_MIN_NCHANNELS": str(2 * len(hcas)), "NCCL_P2P_LEVEL": "SYS"})
    return out


def qsfp_addresses(facts: HostFacts) -> tuple[IPv4Interface, ...]:
    """Every IPv4 address on the node's QSFP twins (a ring node has four, one per cable per twin)."""
    return tuple(a for i in facts.interfaces if qsfp_port(i.name) is not None for a in i.ipv4)


def facing(facts_from: HostFacts, facts_to: HostFacts) -> tuple[str, str] | None:
    """(from's address, to's address) on a QSFP subnet both have: the two ends of the cable (or switch) between
    them. None where no QSFP subnet joins them (on a 4-ring, the diagonal)."""
    mine = qsfp_addresses(facts_from)
    for theirs in qsfp_addresses(facts_to):
        for own in mine:
            if theirs.ip in own.network and own.ip in theirs.network:
                return str(own.ip), str(theirs.ip)
    return None


def cable_order(names: Sequence[str], facts: Mapping[str, HostFacts]) -> list[str]:
    """`names` reordered so that each node after the first has a QSFP subnet in common with the one before it,
    where such a walk exists (a ring's chain through neighbours); otherwise as given (a switch, a pair)."""
    if len(names) < 3:
        return list(names)
    walk = [names[0]]
    rest = list(names[1:])
    while rest:
        nxt = next((n for n in rest if n in facts and walk[-1] in facts and facing(facts[walk[-1]], facts[n])), None)
        if nxt is None:
            return list(names)
        walk.append(nxt)
        rest.remove(nxt)
    return walk


def control_address(host: Host, facts: HostFacts, routed: bool = True) -> str:
    """Where a node's control plane binds (Ray, gloo, torch's rendezvous, vLLM's VLLM_HOST_IP): its QSFP address,
    except on a node with both ports cabled (a ring), where a link's address reaches one neighbour only: there,
    its routed node address (node/routed.py), or with `routed` off (fabric.control_plane: lan) or none given yet,
    its inventory address (the management LAN); either reaches every node, as its comm env says."""
    ring = len({qsfp_port(d.netdev) for d in facts.rdma if d.up} - {None}) > 1
    node = facts.interface(NODE_NETDEV)
    if ring and routed and node is not None and node.ipv4:
        return str(node.ipv4[0].ip)
    if ring and any(i.has_ip(host.address) for i in facts.interfaces):
        return host.address
    return choose_for(host, facts).ip


def rank_order(walk: Sequence[str], tp: int) -> list[str]:
    """Nodes in rank order for TP x PP along a ring walked from the head: each pipeline stage takes the next `tp`
    nodes of the walk, every other stage reversed, so that rank i of one stage is cabled to rank i of the next
    (a 4-ring walked A-B-C-D as TP 2 x PP 2: A, B | D, C; never the missing diagonal A-C). PP alone is the walk."""
    if tp <= 1 or tp >= len(walk) or len(walk) % tp:
        return list(walk)
    stages = [list(walk[i:i + tp]) for i in range(0, len(walk), tp)]
    return [n for s, stage in enumerate(stages) for n in (reversed(stage) if s % 2 else stage)]
