"""Every node's comm env, not only the traffic that happened to flow: a variable that names an interface or address
off the QSFP link is a FAIL even when this run's connections crossed the fabric.

Why the traffic alone cannot tell: with two nodes, which side opens each connection decides the path, and a run
where the well-bound side connected crosses the fabric although the other side's GLOO_SOCKET_IFNAME=enP7s7 would
send its own connections over the management port (a third node, or the other connect order, does).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..engine.facts import HostFacts
from ..node.network import QsfpChoice

# The variables that bind a library's sockets to an interface, and those that name this node's own address.
INTERFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "MN_IF_NAME",
                  "OMPI_MCA_btl_tcp_if_include")
ADDRESS_VARS = ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS")


@dataclass(frozen=True)
class Misbinding:
    node: str
    variable: str
    value: str
    why: str

    def __str__(self) -> str:
        return f"{self.node}: {self.variable}={self.value} {self.why}"


def parse_env(text: str) -> dict[str, str]:
    """`env` output: KEY=value per line (a value with a newline is cut there, which no comm variable has)."""
    env = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.replace("_", "").isalnum():
            env[key] = value
    return env


def misbindings(node: str, env: Mapping[str, str], choice: QsfpChoice, facts: HostFacts,
                fabric: Sequence[ipaddress.IPv4Network]) -> list[Misbinding]:
    """What in `env` binds off the QSFP link of this node (`fabric`: the QSFP subnets of every node)."""
    qsfp = {choice.netdev, *choice.twins}
    found = []
    for variable in INTERFACE_VARS:
        value = env.get(variable)
        if not value or value.startswith("^"):  # unset, or an exclusion list (it names what NOT to use)
            continue
        names = [n.split(":")[0] for n in value.lstrip("=").split(",") if n]
        off = [n for n in names if n not in qsfp]
        if off:
            where = "the management port" if any(n == "enP7s7" for n in off) else "not a QSFP twin"
            found.append(Misbinding(node, variable, value, f"names {', '.join(off)} ({where}; the QSFP link is "
                                                          f"{choice.netdev})"))
    for variable in (*ADDRESS_VARS, "MASTER_ADDR"):
        value = env.get(variable)
        if not value:
            continue
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            found.append(Misbinding(node, variable, value, "is not an IP address (a name resolves to whichever "
                                                           "interface it was registered on)"))
            continue
        mine = variable != "MASTER_ADDR"
        on_link = (any(i.has_ip(value) for i in facts.interfaces if i.name in qsfp) if mine
                   else any(address in net for net in fabric))
        if not on_link:
            held = next((i.name for i in facts.interfaces if i.has_ip(value)), None) if mine else None
            found.append(Misbinding(node, variable, value, f"is off the QSFP link{f' (on {held})' if held else ''}; "
                                                           f"this node's QSFP address is {choice.ip}"))
    return found
