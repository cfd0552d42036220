"""The control plane every node advertises: the addresses Ray, gloo, vLLM (VLLM_HOST_IP, its ZMQ sockets) and the
rendezvous (MASTER_ADDR, verify's own) hand to the other nodes. NCCL can be up on RDMA while the serve hangs,
because one node advertised an address another cannot reach: a Wi-Fi address, the LAN of one node only, the
subnet of one ring link (which reaches one neighbour, never the node across the ring).

The rule, from the nodes' facts: an advertised address must be held by the node that advertises it (the
rendezvous: by the head), not on a wireless interface, and reached by every other node: on a subnet it has an
interface on, or (a ring's routed node address, a /32 no other node is on) over its routes, which verify proves
by pinging the address from that node (`reached`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.command import Command
from ..engine.facts import HostFacts

ADDRESS_VARS = ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS")
INTERFACE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
WIRELESS_PREFIXES = ("wl", "ww")  # wlan0, wlp2s0, wwan0: the kernel's names for Wi-Fi and mobile links


@dataclass(frozen=True)
class ControlAddress:
    node: str  # who advertises it
    source: str  # "VLLM_HOST_IP", "GLOO_SOCKET_IFNAME=enP7s7", "rendezvous (MASTER_ADDR)"
    address: str
    owner: str  # the node that must hold it: itself, or the head for a rendezvous
    interface: str | None = None  # where the owner holds it
    problem: str = ""  # empty: every node reaches it

    def __str__(self) -> str:
        where = f" on {self.interface}" if self.interface else ""
        said = f": {self.problem}" if self.problem else ""
        return f"{self.node} {self.source} {self.address}{where}{said}"

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "source": self.source, "address": self.address, "owner": self.owner,
                "interface": self.interface, "problem": self.problem}


def advertised(node: str, env: Mapping[str, str], facts: HostFacts, head: str) -> list[ControlAddress]:
    """What this node's env hands to the others (not yet judged)."""
    found = []
    for variable in ADDRESS_VARS:
        if value := env.get(variable, "").strip():
            found.append(ControlAddress(node, variable, value, node))
    for variable in INTERFACE_VARS:
        value = env.get(variable, "").strip()
        if not value or value.startswith("^"):  # an exclusion list names what not to use
            continue
        for name in (n.split(":")[0] for n in value.lstrip("=").split(",") if n):
            interface = facts.interface(name)
            address = str(interface.ipv4[0].ip) if interface and interface.ipv4 else ""
            found.append(ControlAddress(node, f"{variable}={value}", address, node, name))
    if value := env.get("MASTER_ADDR", "").strip():
        found.append(ControlAddress(node, "rendezvous (MASTER_ADDR)", value, head))
    return found


def judge(addresses: Sequence[ControlAddress], facts: Mapping[str, HostFacts],
          reached: Mapping[str, Collection[str]] | None = None) -> list[ControlAddress]:
    """Each address with where its owner holds it and, if some node cannot use it, why. `reached`: per node, the
    addresses off its subnets that it reached over its routes (to_reach's, pinged)."""
    return [_judged(a, facts, reached or {}) for a in addresses]


def to_reach(addresses: Sequence[ControlAddress], facts: Mapping[str, HostFacts]) -> dict[str, list[str]]:
    """Per node, the advertised addresses that are on none of its subnets: only its routes can reach them."""
    out: dict[str, list[str]] = {}
    for a in addresses:
        try:
            address = ipaddress.ip_address(a.address)
        except ValueError:
            continue
        for node, f in facts.items():
            if node != a.owner and not _on_link(address, f) and a.address not in out.get(node, []):
                out.setdefault(node, []).append(a.address)
    return out


def reach_command(addresses: Sequence[str]) -> Command:
    """Pings each address once, all at once; prints the ones that answered. (Addresses only: to_reach parsed them.)"""
    probes = " ".join(f"(ping -c 1 -W 2 -q {ipaddress.ip_address(a)} >/dev/null 2>&1 && echo {a}) &" for a in addresses)
    return Command(f"{probes} wait", timeout=30)


def _on_link(address: ipaddress.IPv4Address | ipaddress.IPv6Address, facts: HostFacts) -> bool:
    return any(address in x.network for i in facts.interfaces for x in i.ipv4)


def _judged(a: ControlAddress, facts: Mapping[str, HostFacts], reached: Mapping[str, Collection[str]]
            ) -> ControlAddress:
    owner = facts.get(a.owner)
    if not a.address:
        return _with(a, a.interface, f"{a.interface} has no IPv4 address on {a.owner}")
    try:
        address = ipaddress.ip_address(a.address)
    except ValueError:
        return _with(a, a.interface, "not an IP address (a name resolves to whichever interface it was registered on)")
    held = next((i for i in (owner.interfaces if owner else ()) if i.has_ip(a.address)), None)
    if held is None:
        return _with(a, a.interface, f"held by no interface of {a.owner}")
    if held.name.startswith(WIRELESS_PREFIXES):
        return _with(a, held.name, f"a Wi-Fi address ({held.name}): it comes and goes, and the other nodes reach it "
                                   "through the LAN's router if at all")
    network = next(x.network for x in held.ipv4 if x.ip == address)
    cannot = [n for n, f in facts.items()
              if n != a.owner and not _on_link(address, f) and a.address not in reached.get(n, ())]
    if cannot:
        one = len(cannot) == 1
        return _with(a, held.name, f"{', '.join(cannot)} {'has' if one else 'have'} no interface on {network} and no "
                                   f"route to it that answers ping: {'it' if one else 'they'} cannot reach it")
    return _with(a, held.name, "")


def _with(a: ControlAddress, interface: str | None, problem: str) -> ControlAddress:
    return ControlAddress(a.node, a.source, a.address, a.owner, interface, problem)


def fix(problem: ControlAddress) -> str:
    return (f"bind {problem.node}'s control plane (VLLM_HOST_IP, RAY_NODE_IP_ADDRESS, GLOO/NCCL/TP_SOCKET_IFNAME, "
            "MASTER_ADDR) to an address every node reaches: the QSFP link on a pair or a switch; on a ring the node's "
            "routed address (scnode; `ip route get ADDRESS` on the node that cannot reach it shows the missing route) "
            "or, with fabric.control_plane: lan, the management LAN (the inventory address); re-run `sparkcluster "
            "bootstrap` (it rewrites the routes and the comm env) and remove any override from the container's or the "
            "shell's environment")


def grouped(addresses: Sequence[ControlAddress]) -> list[str]:
    """One line per node and address: "spark-1 192.168.1.11 on enP7s7: VLLM_HOST_IP, GLOO_SOCKET_IFNAME=enP7s7"."""
    groups: dict[tuple[str, str, str | None, str], list[str]] = {}
    for a in addresses:
        groups.setdefault((a.node, a.address, a.interface, a.problem), []).append(a.source)
    return [f"{node} {address or '(none)'}{f' on {interface}' if interface else ''}: {', '.join(sources)}"
            + (f"  <- {problem}" if problem else "") for (node, address, interface, problem), sources in groups.items()]
