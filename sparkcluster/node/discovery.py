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

from ..engine.command import Command
from ..engine.facts import HostFacts
from ..engine.inventory import Host, Inventory
from ..engine.session import Session
from ..engine.transport import Transport
from .fabric import Fabric, Problem, Sightings, build_fabric, cabling_problems, expected_topology, up_twins

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


FABRIC = "node.fabric"  # the session memo's key: one discovery per run


def fabric_of(session: Session) -> Fabric:
    """This run's fabric, discovered once: the cabling play finds it, the addressing and comm steps of the same
    run (and every narrowing of its session) read it."""
    return session.memo.get(FABRIC, lambda: discover(session))


def forget(session: Session) -> None:
    """After the fabric's addresses changed: the next reader discovers again."""
    session.memo.forget(FABRIC)
