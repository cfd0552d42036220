"""Network plumbing of a simulated cluster: bridges, namespaces, veths, addresses, the LAN rate limit.

Commands are built as data (pure functions, unit-tested) and run through `ip -batch` / `tc -batch`.
Nothing here ever adds a default route: the simulated hosts can reach each other and this machine's
bridge addresses, and nothing else.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
from collections.abc import Iterable

from ..engine.errors import SparkclusterError
from .topology import FIRST_HOST_OCTET, MGMT_NETDEV, HostSpec, Topology, link_local_address

SWITCH_LINK_LOCAL = "fe80::1/64"  # the runner's on each switch bridge: unique on its own wire, as link-local needs

# tbf needs a bucket of at least rate/HZ; 256 KiB holds bursts at any rate we use without shaping jitter.
TBF_BURST = "256kb"
TBF_LATENCY = "50ms"


def root_batch(topo: Topology) -> list[str]:
    """`ip -batch` lines for the root namespace: bridges with the runner's address, namespaces, veths."""
    lines = []
    for bridge, address in topo.bridges.items():
        mtu = 1500 if bridge.endswith("lan") else 9000
        lines.append(f"link add {bridge} mtu {mtu} type bridge")
        # A cable's bridge is only the wire: no address of its own, not even IPv6 link-local, so that the two
        # nodes on it see each other alone (discovery would take a third voice for a switch).
        lines.append(f"addr add {address} dev {bridge}" if address else f"link set {bridge} addrgenmode none")
        if address and not bridge.endswith("lan"):
            # A switch's own voice, which discovery hears as its third: its IPv6 link-local address answers from
            # the start, as a real switch's long-configured one does. Generated, it would stay tentative (silent)
            # a second or two after `sim up` while its duplicate address detection runs, and two nodes alone on
            # the switch would then read as cabled to each other on the twin whose probe ended first.
            lines += [f"link set {bridge} addrgenmode none", f"addr add {SWITCH_LINK_LOCAL} dev {bridge} nodad"]
        lines.append(f"link set {bridge} up")
    for host in topo.hosts:
        lines.append(f"netns add {host.netns}")
        for nic in host.nics:
            # MTU on both ends: with only the inner end at 9000, jumbo frames fail with ENOBUFS.
            lines.append(
                f"link add {nic.root_end} mtu {nic.mtu} type veth peer name {nic.netdev} "
                f"mtu {nic.mtu} address {nic.mac} netns {host.netns}"
            )
            if nic.cabled:
                lines.append(f"link set {nic.root_end} master {nic.bridge} up")
            # An unplugged cable: the root end stays down, so the host sees no carrier.
    return lines


def host_batch(host: HostSpec, address_fabric: bool = True) -> list[str]:
    """`ip -n NS -batch` lines inside one host: loopback up, cabled ports addressed and up. Idempotent, so
    every boot re-applies it, as a real Spark applies its netplan (a test may have changed the addresses).
    Without `address_fabric` the cabled QSFP twins only come up: their addresses are whatever the host's own
    configuration gave them (none, fresh from the box), and they survive a reboot as netplan's would."""
    lines = ["link set lo up"]
    for nic in host.nics:
        if nic.cabled and (address_fabric or nic.hca is None):
            lines += [f"addr flush dev {nic.netdev}", f"addr add {nic.address} dev {nic.netdev}"]
        if nic.cabled:
            lines.append(f"link set {nic.netdev} up")
    return lines


def fresh_fabric_batch(host: HostSpec) -> list[str]:
    """The cabled twins as a new Spark has them: no address, the default MTU (the switch side keeps 9000)."""
    return [f"link set {nic.netdev} mtu 1500" for nic in host.nics if nic.cabled and nic.hca]


def lan_shaping(topo: Topology, rate: str) -> tuple[list[str], dict[str, list[str]]]:
    """tc lines limiting the management link in both directions: (root-namespace lines, per-netns lines)."""
    qdisc = f"root tbf rate {rate} burst {TBF_BURST} latency {TBF_LATENCY}"
    root_lines = [f"qdisc add dev {h.nic(MGMT_NETDEV).root_end} {qdisc}" for h in topo.hosts]
    host_lines = {h.netns: [f"qdisc add dev {MGMT_NETDEV} {qdisc}"] for h in topo.hosts}
    return root_lines, host_lines


def degrade_lines(host: HostSpec, netdev: str, rate: str | None, delay: str | None = None
                  ) -> tuple[list[str], list[str]]:
    """tc lines (root namespace, inside the host) that hold one QSFP twin to `rate` both ways, delay it by `delay`
    each way, or lift both (None, None): a real limit on the link, as a degraded twin (re-plug, PCIe power, FEC) or
    a slow one (pause frames, a congested switch port) shows it to every tool. A delay takes netem, which also
    carries the rate then; a rate alone keeps tbf's shaping."""
    nic = host.nic(netdev)
    if rate is None and delay is None:
        return [f"qdisc del dev {nic.root_end} root"], [f"qdisc del dev {netdev} root"]
    if delay is None:
        qdisc = f"root tbf rate {rate} burst {TBF_BURST} latency {TBF_LATENCY}"
    else:
        qdisc = f"root netem delay {delay}" + (f" rate {rate}" if rate else "")
    return [f"qdisc replace dev {nic.root_end} {qdisc}"], [f"qdisc replace dev {netdev} {qdisc}"]


def run_batch(tool: str, lines: Iterable[str], netns: str | None = None) -> None:
    argv = [tool] + (["-n", netns] if netns else []) + ["-batch", "-"]
    text = "\n".join(lines) + "\n"
    result = subprocess.run(argv, input=text, capture_output=True, text=True)
    if result.returncode != 0:
        where = f" in {netns}" if netns else ""
        raise SparkclusterError(f"`{' '.join(argv)}`{where} failed: {result.stderr.strip()}",
                                "remove leftovers of an earlier run with `sparkcluster sim down --all`")


def link_local_batch(host: HostSpec) -> list[str]:
    """NVIDIA's link-local netplan state on the cabled twins (given once, at creation: it then persists across
    boots as netplan's would, until bootstrap replaces it)."""
    twins = [nic for nic in host.nics if nic.cabled and nic.hca]
    return [f"addr add {link_local_address(i, FIRST_HOST_OCTET + host.index - 1)} dev {nic.netdev} scope link"
            for i, nic in enumerate(twins)]


def settled_twins(host: HostSpec) -> list[str]:
    """sysctl settings that let the cabled twins' IPv6 link-local addresses answer as soon as the twins are up, as
    a real Spark's long-up twins do. With duplicate address detection they stay tentative a second or two after
    `sim up`: a multicast probe sent then leaves without a source and hears nothing, and discovery, reading the
    unicast answers alone, misses the switch's voice on that twin. Set before the twins come up (host_batch)."""
    return [f"net.ipv6.conf.{nic.netdev}.accept_dad=0" for nic in host.nics if nic.cabled and nic.hca]


def run_sysctl(settings: list[str], netns: str) -> None:
    argv = ["ip", "netns", "exec", netns, "sysctl", "-q", "-w", *settings]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise SparkclusterError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}",
                                "remove leftovers of an earlier run with `sparkcluster sim down --all`")


def create(topo: Topology, lan_rate: str, address_fabric: bool = True, link_local: bool = False) -> None:
    run_batch("ip", root_batch(topo))
    for host in topo.hosts:
        if settings := settled_twins(host):
            run_sysctl(settings, host.netns)
        run_batch("ip", host_batch(host, address_fabric) + ([] if address_fabric else fresh_fabric_batch(host))
                  + (link_local_batch(host) if link_local else []), host.netns)
    root_lines, host_lines = lan_shaping(topo, lan_rate)
    run_batch("tc", root_lines)
    for netns, lines in host_lines.items():
        run_batch("tc", lines, netns)


def destroy(topo: Topology, timeout: float = 10.0) -> list[str]:
    """Delete namespaces (their veth ends go with them) and bridges. Returns what could not be removed."""
    for host in topo.hosts:
        if host.netns in list_netns():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
    # The kernel tears a namespace's veths down asynchronously: wait for the root ends to vanish.
    ends = {nic.root_end for h in topo.hosts for nic in h.nics}
    deadline = time.monotonic() + timeout
    while ends & set(list_links()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for link in [*topo.bridges, *sorted(ends)]:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    ours = {h.netns for h in topo.hosts} | set(topo.bridges) | ends
    return sorted(f"netns {n}" for n in ours & set(list_netns())) + sorted(
        f"link {n}" for n in ours & set(list_links())
    )


def list_netns() -> list[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout.strip()
    return [entry["name"] for entry in json.loads(out)] if out else []


def list_links() -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [link["ifname"] for link in json.loads(out)]


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine already has an address in or a route to (the default route excluded)."""
    addrs = json.loads(subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout)
    routes = json.loads(subprocess.run(["ip", "-j", "-4", "route"], capture_output=True, text=True, check=True).stdout)
    nets = [
        ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
        for link in addrs
        for info in link.get("addr_info", [])
    ]
    nets += [ipaddress.IPv4Network(r["dst"], strict=False) for r in routes if r.get("dst") not in (None, "default")]
    return nets
