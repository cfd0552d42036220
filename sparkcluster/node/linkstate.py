"""A node's QSFP links as they are now, read after a transfer over the fabric failed: which of them are down, so
the message names the link ("spark-2's QSFP links: enp1s0f1np1 down ...") rather than a timeout or a remote
traceback. Read fresh, not from the facts: the run's facts were gathered before the link went."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..engine.command import Command
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import Transport, Unreachable
from .network import qsfp_port

# One line per netdev: name, operstate, `ups=` how often its carrier came up since boot, then its IPv4 addresses
# (without prefix).
LINKS_COMMAND = Command(
    "for i in /sys/class/net/*; do n=${i##*/}; read -r s < \"$i/operstate\" 2>/dev/null || s=unknown; "
    "read -r c < \"$i/carrier_up_count\" 2>/dev/null || c=; "
    "a=$(ip -o -4 addr show dev \"$n\" 2>/dev/null | awk '{split($4, p, \"/\"); printf \"%s \", p[1]}'); "
    "echo \"$n $s ups=$c $a\"; done", timeout=15)


@dataclass(frozen=True)
class LinkState:
    netdev: str
    state: str  # the kernel's operstate: up, down, lowerlayerdown, unknown...
    ipv4: tuple[str, ...]
    carrier_ups: int | None = None  # carrier_up_count: 0 for a port no cable ever lit since boot; None: not read

    @property
    def up(self) -> bool:
        return self.state == "up"

    def text(self) -> str:
        addresses = f" ({', '.join(self.ipv4)})" if self.ipv4 else ""
        return f"{self.netdev} {self.state}{addresses}"


def parse_links(stdout: str) -> list[LinkState]:
    links = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) >= 2:
            ups = words[2].removeprefix("ups=") if len(words) > 2 and words[2].startswith("ups=") else None
            addresses = tuple(words[3:] if ups is not None else words[2:])
            links.append(LinkState(words[0], words[1].lower(), addresses, int(ups) if ups and ups.isdigit() else None))
    return links


def qsfp_links(links: Sequence[LinkState], address: str | None = None) -> list[LinkState]:
    """The QSFP netdevs (Spark names), or, where a node's names do not follow them, the one holding `address`."""
    named = [link for link in links if qsfp_port(link.netdev) is not None]
    return named or [link for link in links if address is not None and address in link.ipv4]


def read_links(transport: Transport) -> list[LinkState] | None:
    """The node's links now, or None when the node cannot be asked (it is the one that is gone)."""
    try:
        result = transport.run(LINKS_COMMAND)
    except Unreachable:
        return None
    return parse_links(result.stdout) if result.ok else None


def describe(node: str, links: Sequence[LinkState] | None, address: str | None = None) -> str:
    """`spark-2's QSFP links: enp1s0f1np1 down (10.100.0.12), enP2p1s0f1np1 down`, naming the down ones first."""
    if links is None:
        return f"{node} did not answer to show its links"
    shown = sorted(qsfp_links(links, address), key=lambda link: (link.up, link.netdev))
    if not shown:
        return f"{node} has no QSFP link"
    return f"{node}'s QSFP links: " + ", ".join(link.text() for link in shown)


def any_down(links: Sequence[LinkState] | None, address: str | None = None) -> bool:
    """A QSFP link the node uses is down: one that holds an address, or whose carrier came up since boot (a cable
    pulled now; networkd and NetworkManager drop a port's address with its carrier). A port no cable ever lit (a
    pair leaves a port's two twins dark on every node) is not the broken link."""
    if links is None:
        return False
    qsfp = qsfp_links(links, address)
    used = [link for link in qsfp if link.ipv4 or link.carrier_ups] or qsfp
    return any(not link.up for link in used)


def nodes_with_links_down(session: Session) -> list[str]:
    """For each node of the session with a QSFP link down now, `describe()`'s line: what a failure of traffic
    over the fabric (a probe's rendezvous timing out) is really about. Empty when every link is up."""
    def one(host: Host) -> tuple[str, list[LinkState] | None]:
        return host.name, read_links(session.transport(host))

    return [describe(name, links) for name, links in session.each(one) if any_down(links)]
