"""Discovery: which node answers on each Up QSFP twin of each node, before anything is changed.

A link-layer probe with tools every node has: an ICMPv6 echo to the all-nodes group (ff02::1) out of each twin
answers from every neighbour on that wire by its IPv6 link-local address, which a fresh twin has before it has
any IPv4 address; where a twin already has IPv4, an echo to each other node's address on that subnet, out of that
twin, answers too (our netplan turns IPv6 link-local off). The answers are mapped to (node, netdev) through the
nodes' facts. All twins of all nodes are probed at once; a fresh twin listens PROBE_S seconds (a few echoes, so an
answer that a loaded node is late with, or an echo lost, still counts), an addressed one until the evidence is in
(see probe_command).

Why not LLDP: lldpd is not on a DGX OS install by default, needs root and a daemon running for ~30 s before
its neighbours show up; the probe needs nothing installed and sees the same wire.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Interface, ip_address

from ..engine.command import Command
from ..engine.facts import HostFacts
from ..engine.inventory import Host, Inventory
from ..engine.session import Session
from ..engine.transport import Transport
from .fabric import Fabric, Problem, Sightings, build_fabric, cabling_problems, expected_topology, up_twins
from .network import qsfp_port

PROBE_S = 3  # a twin's multicast listens this long at most (an echo a second); the twins are probed in parallel


def probe_command(twins: Sequence[str], candidates: Mapping[str, Sequence[str]],
                  link_local: Collection[str] | None = None) -> Command:
    """One shell line per node: `NETDEV addr addr ...` for each twin, the addresses that answered on it.

    `candidates`: per twin, the other nodes' IPv4 addresses on its subnets (unicast echoes, out of that twin);
    `link_local`: the twins that have an IPv6 link-local address (None: all of them). Per twin:
    - no candidates (a fresh cable): the multicast listens its whole PROBE_S;
    - candidates, no link-local address (our netplan turns it off): the unicast echoes alone. A multicast echo
      needs a source address on the twin's link for anyone to answer it, so it could only wait PROBE_S for nothing;
    - candidates and a link-local address: both, and once every candidate answered, the multicast ends as soon
      as it has read an answer to its second echo. Ending at the unicast answers alone is not enough: only the
      multicast hears a voice outside the inventory (what tells a switch from a cable where two nodes share it),
      and a ping reads its answers in the order they came, so by its first answer to the second echo (sent a
      second after the first, the shortest interval a non-root ping may use on a group) it has read every answer
      to the first. A loaded node reads them late, but still all of them and in that order.
    A silent candidate leaves the multicast its whole PROBE_S."""
    jobs = []
    for netdev in twins:
        q = shlex.quote(netdev)
        addresses = candidates.get(netdev, ())
        multicast = f"ping -6 -n -w {PROBE_S} ff02::1%{q} 2>/dev/null"
        if not addresses:
            every = multicast
        else:
            unicast = " ".join(f"ping -n -c 1 -w {PROBE_S} -I {q} {shlex.quote(a)} 2>/dev/null &" for a in addresses)
            # Each unicast answer becomes one of ping's own lines, for the awk below.
            answered = (f"u=$( ({unicast} wait) | awk '/bytes from/ {{print $4}}' ); "
                        f'for a in $u; do echo "64 bytes from $a"; done')
            if link_local is not None and netdev not in link_local:
                every = answered
            else:
                # Into one pipe: the multicast's pid, its lines as they come, the unicast answers, and `@all` when
                # every candidate answered; `listen` stops the multicast once it has `@all` and a second echo's answer.
                every = (f"{{ {multicast} & echo \"@pid $!\"; {answered}; set -- $u; "
                         f"[ $# -ge {len(addresses)} ] && echo @all; wait; }} | listen")
        # awk prints the 4th field of "64 bytes from ADDR: icmp_seq=..." lines; one echo keeps a twin's line whole.
        jobs.append(f"( echo {q} $( ({every}) | awk '/bytes from/ {{print $4}}' | sort -u) ) &")
    # Shell built-ins only (no process per line), and no file written: check mode leaves the node as it was.
    listen = ("listen() { p=; a=; s=; while read -r l; do case $l in '@pid '*) p=${l#@pid };; @all) a=1;; "
              "*'icmp_seq=2 '*) s=1; echo \"$l\";; *) echo \"$l\";; esac; "
              "if [ \"$a$s\" = 11 ] && [ -n \"$p\" ]; then kill $p 2>/dev/null; a=2; fi; done; }")
    return Command(f"PATH=$PATH:/usr/sbin:/sbin:/bin; {listen}; " + " ".join(jobs) + " wait", timeout=PROBE_S + 20)


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
    link_local = [t for t in twins if (i := facts[node].interface(t)) is not None and i.ipv6_link_local]
    return parse_probe(transport.run(probe_command(twins, ipv4_candidates(node, facts), link_local)).stdout)


def discover(session: Session) -> Fabric:
    """The fabric as the cables make it: every reachable node probed at once."""
    hosts = [h for h in session.hosts if h.name in session.facts]

    def one(host: Host) -> tuple[str, dict[str, tuple[str, ...]]]:
        return host.name, probe_node(session.transport(host), host.name, session.facts)

    sightings: Sightings = dict(session.each(one, hosts))
    # Every node of the inventory, also those outside a --limit: their facts are what the others see answering.
    return fabric_from([h.name for h in session.hosts], session.facts, sightings)


def fabric_from(nodes: Sequence[str], facts: Mapping[str, HostFacts], sightings: Sightings) -> Fabric:
    """The graph from what answered, less what a duplicate address makes ambiguous (see `unambiguous`)."""
    return build_fabric(nodes, facts, unambiguous(sightings, facts, duplicate_addresses(facts)))


@dataclass(frozen=True)
class Duplicate:
    """An address that QSFP twins of two or more nodes hold: an answer from it names none of them."""

    address: str
    holders: tuple[tuple[str, str, IPv4Interface], ...]  # (node, netdev, address/prefix), the likelier stray first
    twins: tuple[tuple[str, str], ...] = ()  # every (node, netdev) on its subnet: what answers there is muddled

    @property
    def per_link(self) -> bool:
        """A link-local address (169.254/16) is unique on its own link only: IPv4 link-local defends it by ARP
        there, and the same one on two cables is no conflict. Its answers still name neither holder."""
        return self.holders[0][2].ip.is_link_local

    def problem(self) -> Problem:
        names = " and ".join(f"{node} ({netdev})" for node, netdev, _ in self.holders)
        removals = ", or ".join(f"on {node}: `sudo ip addr del {held} dev {shlex.quote(netdev)}`"
                                for node, netdev, held in self.holders)
        both = "both" if len(self.holders) == 2 else "all"
        return Problem(f"duplicate address {self.address}: {names} {both} hold it, so discovery cannot tell which "
                       "of them answers from it",
                       f"remove it from the node that should not hold it ({removals}); then run topology again")


def duplicate_addresses(facts: Mapping[str, HostFacts]) -> tuple[Duplicate, ...]:
    """The IPv4 addresses held on QSFP twins of more than one node. The holder on which the address is not its
    twin's first one (added beside the twin's own) comes first: the likelier stray."""
    held: dict[str, list[tuple[bool, str, str, IPv4Interface]]] = {}
    twins = [(node, interface) for node, f in facts.items() for interface in f.interfaces
             if qsfp_port(interface.name) is not None]  # not the LAN, nor docker0 (172.17.0.1 on every node)
    for node, interface in twins:
        for i, address in enumerate(interface.ipv4):
            held.setdefault(str(address.ip), []).append((i == 0, node, interface.name, address))
    duplicates = []
    for ip, holders in held.items():
        if len({node for _, node, _, _ in holders}) > 1:
            address = holders[0][3]
            duplicates.append(Duplicate(
                ip, tuple((node, netdev, a) for _, node, netdev, a in sorted(holders, key=lambda h: h[0])),
                tuple((node, i.name) for node, i in twins if any(address.ip in own.network for own in i.ipv4))))
    return tuple(duplicates)


def unambiguous(sightings: Sightings, facts: Mapping[str, HostFacts],
                duplicates: Sequence[Duplicate]) -> dict[str, dict[str, tuple[str, ...]]]:
    """The answers without those a duplicate address makes ambiguous: an answer from the address itself (either
    holder may have sent it), and on a twin that holds it, the answers on its subnet alone (a node answers for
    any of its addresses on any wire, so a stray address on a twin draws answers from the other cable's far end:
    they would read as a second voice on the wire, a switch)."""
    dup = {d.address for d in duplicates}
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for node, twins in sightings.items():
        out[node] = {}
        for netdev, answered in twins.items():
            interface = facts[node].interface(netdev) if node in facts else None
            own = interface.ipv4 if interface else ()
            stray = [a.network for a in own if str(a.ip) in dup]
            clean = [a.network for a in own if str(a.ip) not in dup]

            def kept(address: str) -> bool:
                try:
                    ip = ip_address(address.split("%")[0])
                except ValueError:
                    return True
                on = [net for net in (*stray, *clean) if ip.version == net.version and ip in net]
                return str(ip) not in dup and (not on or any(net in clean for net in on))

            out[node][netdev] = tuple(a for a in answered if kept(a))
    return out


@dataclass(frozen=True)
class Checked:
    fabric: Fabric
    expected: str
    problems: tuple[Problem, ...]
    duplicates: tuple[Duplicate, ...] = ()


def pinned_netdevs(host: Host, facts: HostFacts | None) -> tuple[str, ...]:
    """The QSFP netdevs a host's inventory pins: qsfp_interface, and the netdevs of its pinned hcas."""
    pins = [host.qsfp_interface] if host.qsfp_interface else []
    if facts is not None:
        pins += [d.netdev for d in facts.rdma if d.hca in host.hcas]
    return tuple(pins)


def check_cabling(inventory: Inventory, fabric: Fabric, facts: Mapping[str, HostFacts]) -> Checked:
    """The cabling's problems, a duplicate address first: it is what muddles every answer on its subnet."""
    expected = expected_topology(inventory.vars)
    pinned = {h.name: pinned_netdevs(h, facts.get(h.name)) for h in inventory.hosts}
    duplicates = tuple(d for d in duplicate_addresses(facts) if not d.per_link)
    problems = [d.problem() for d in duplicates] + cabling_problems(fabric, expected, pinned)
    return Checked(fabric, expected, tuple(problems), duplicates)


FABRIC = "node.fabric"  # the session memo's key: one discovery per run


def fabric_of(session: Session) -> Fabric:
    """This run's fabric, discovered once: the cabling play finds it, the addressing and comm steps of the same
    run (and every narrowing of its session) read it."""
    return session.memo.get(FABRIC, lambda: discover(session))


def forget(session: Session) -> None:
    """After the fabric's addresses changed: the next reader discovers again."""
    session.memo.forget(FABRIC)
