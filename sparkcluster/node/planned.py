"""A node's facts as they will be once fabric.addresses has applied its plan: what `bootstrap --check` hands the
later steps (the QSFP preflight, the comm env, the ssh mesh), so that a freshly cabled pair's check shows the whole
plan instead of failing on the addresses an earlier step would have given it."""

from __future__ import annotations

from dataclasses import replace
from ipaddress import IPv4Address

from ..engine.facts import Gid, HostFacts, Interface
from .addressing import AddressPlan, Twin
from .routed import NODE_NETDEV

ROCE_V1, ROCE_V2 = "IB/RoCE v1", "RoCE v2"


def planned_facts(facts: HostFacts, plan: AddressPlan) -> HostFacts:
    """Each twin of the plan with its address (the link-local ones it replaces gone) at the plan's MTU, and the
    RoCE GIDs the kernel adds for a new IPv4 address (a v1 and a v2 entry at the lowest free indexes of the
    twin's RDMA port) and drops for a removed one; on a ring, the node address on its bridge."""
    twins = {t.netdev: t for t in plan.twins}
    interfaces = tuple(_interface(i, twins[i.name], plan.mtu) if i.name in twins else i for i in facts.interfaces)
    if plan.node is not None:  # a ring node's routed control-plane address, on its bridge
        interfaces = (*(i for i in interfaces if i.name != NODE_NETDEV),
                      Interface(NODE_NETDEV, "UNKNOWN", 1500, (plan.node.address,)))
    gids = list(facts.gids)
    for twin in plan.twins:
        device = next((d for d in facts.rdma if d.netdev == twin.netdev), None)
        if device is None:
            continue
        gone = {_mapped(a.ip) for a in twin.replaces}
        gids = [g for g in gids if not (g.hca == device.hca and g.port == device.port and g.gid in gone)]
        if twin.assign:
            taken = {g.index for g in gids if g.hca == device.hca and g.port == device.port}
            free = (i for i in range(len(taken) + 2) if i not in taken)
            gids += [Gid(device.hca, device.port, next(free), _mapped(twin.address.ip), twin.netdev, kind)
                     for kind in (ROCE_V1, ROCE_V2)]
    return replace(facts, interfaces=interfaces, gids=tuple(gids))


def _interface(interface: Interface, twin: Twin, mtu: int) -> Interface:
    kept = tuple(a for a in interface.ipv4 if a not in twin.replaces)
    retuned = twin.assign or (twin.managed and twin.mtu != mtu)
    return replace(interface, ipv4=kept + ((twin.address,) if twin.assign else ()),
                   mtu=mtu if retuned else interface.mtu)


def _mapped(ip: IPv4Address) -> str:
    """The IPv4-mapped GID of an address, as the kernel writes it in the GID table."""
    packed = ip.packed
    return "0000:0000:0000:0000:0000:ffff:" + f"{packed[0]:02x}{packed[1]:02x}:{packed[2]:02x}{packed[3]:02x}"
