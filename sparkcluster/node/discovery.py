"""Discovery: which node answers on each Up QSFP twin of each node, before anything is changed.

A link-layer probe with tools every node has: an ICMPv6 echo to the all-nodes group (ff02::1) out of each twin
answers from every neighbour on that wire by its IPv6 link-local address, which a fresh twin has before it has
any IPv4 address; where a twin already has IPv4, an echo to each other node's address on that subnet, out of that
twin, answers too (our netplan turns IPv6 link-local off). The answers are mapped to (node, netdev) through the
nodes' facts. All twins of all nodes are probed at once, for PROBE_S seconds in all: a few echoes each, so an
answer that a loaded node is late with, or an echo lost, still counts.

Why not LLDP: lldpd is not on a DGX OS install by default, needs root and a daemon running for ~30 s before
its neighbours show up; the probe needs nothing installed and sees the same wire.
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..engine.command import Command
from ..engine.facts import HostFacts
from ..engine.inventory import Host, Inventory
from ..engine.session import Session
from ..engine.transport import Transport
from .fabric import Fabric, Problem, Sightings, build_fabric, cabling_problems, expected_topology, up_twins

PROBE_S = 3  # each twin's probe lasts this long (an echo a second); the twins are probed in parallel


def probe_command(twins: Sequence[str], candidates: Mapping[str, Sequence[str]]) -> Command:
    """One shell line per node: `NETDEV addr addr ...` for each twin, the addresses that answered on it."""
    jobs = []
    for netdev in twins:
        q = shlex.quote(netdev)
        # Multicast: an echo a second (the shortest interval a non-root ping may send to a group) until the
        # deadline, every answer kept; unicast: an echo a second until the first answer or the deadline.
        pings = [f"ping -6 -n -w {PROBE_S} ff02::1%{q}"]
        pings += [f"ping -n -c 1 -w {PROBE_S} -I {q} {shlex.quote(a)}" for a in candidates.get(netdev, ())]
        # awk prints the 4th field of "64 bytes from ADDR: icmp_seq=..." lines; one echo keeps a twin's line whole.
        every = " ".join(f"{p} 2>/dev/null &" for p in pings)
        jobs.append(f"( echo {q} $( ({every} wait) | awk '/bytes from/ {{print $4}}' | sort -u) ) &")
    return Command("PATH=$PATH:/usr/sbin:/sbin:/bin; " + " ".join(jobs) + " wait", timeout=PROBE_S + 20)


def parse_probe(text: str) -> dict[str, tuple[str, ...]]:
    """`NETDEV fe80::1%NETDEV: 10.0.0.12: ...` lines -> netdev -> addresses (scope and colon stripped)."""
    seen: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        seen[parts[0]] = tuple(dict.fromkeys(p.rstrip(":").split("%")[0] for p in parts[1:]))
    return seen


def ipv4_candidates(node: str, facts: Mapping[str, HostFacts]) -> dict[str, tuple[str, ...]]:
    """Per Up twin of `node` with IPv4: the other nodes' addresses on its subnets (any of their interfaces)."""
    mine = facts[node]
    out: dict[str, tuple[str, ...]] = {}
    for netdev in up_twins(mine):
        interface = mine.interface(netdev)
        nets = [a.network for a in interface.ipv4] if interface else []
        out[netdev] = tuple(str(a.ip) for other, f in facts.items() if other != node
                            for i in f.interfaces for a in i.ipv4 if any(a.ip in n for n in nets))
    return out


def probe_node(transport: Transport, node: str, facts: Mapping[str, HostFacts]) -> dict[str, tuple[str, ...]]:
    twins = up_twins(facts[node])
    if not twins:
        return {}
    return parse_probe(transport.run(probe_command(twins, ipv4_candidates(node, facts))).stdout)


def discover(session: Session) -> Fabric:
    """The fabric as the cables make it: every reachable node probed at once."""
    hosts = [h for h in session.hosts if h.name in session.facts]

    def one(host: Host) -> tuple[str, dict[str, tuple[str, ...]]]:
        return host.name, probe_node(session.transport(host), host.name, session.facts)

    sightings: Sightings = dict(session.each(one, hosts))
    # Every node of the inventory, also those outside a --limit: their facts are what the others see answering.
    return build_fabric([h.name for h in session.hosts], session.facts, sightings)


@dataclass(frozen=True)
class Checked:
    fabric: Fabric
    expected: str
    problems: tuple[Problem, ...]


def pinned_netdevs(host: Host, facts: HostFacts | None) -> tuple[str, ...]:
    """The QSFP netdevs a host's inventory pins: qsfp_interface, and the netdevs of its pinned hcas."""
    pins = [host.qsfp_interface] if host.qsfp_interface else []
    if facts is not None:
        pins += [d.netdev for d in facts.rdma if d.hca in host.hcas]
    return tuple(pins)


def check_cabling(inventory: Inventory, fabric: Fabric, facts: Mapping[str, HostFacts]) -> Checked:
    expected = expected_topology(inventory.vars)
    pinned = {h.name: pinned_netdevs(h, facts.get(h.name)) for h in inventory.hosts}
    return Checked(fabric, expected, tuple(cabling_problems(fabric, expected, pinned)))


# One discovery per run: the cabling play finds the fabric, the addressing and comm steps of the same run read it.
_found: dict[int, tuple[object, Fabric]] = {}
_finding = threading.Lock()  # every node's step asks at once; one discovery answers them all


def fabric_of(session: Session) -> Fabric:
    """This run's fabric (keyed by the run's connections, which narrowed sessions share), discovered once."""
    key = id(session.transports)
    with _finding:
        if key not in _found:
            _found[key] = (session.transports, discover(session))
        return _found[key][1]


def forget(session: Session) -> None:
    """After the fabric's addresses changed: the next reader discovers again."""
    _found.pop(id(session.transports), None)
