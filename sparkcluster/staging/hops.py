"""Which node sends the image to which, and on which addresses: the fan-out of `image sync` along cables that exist.

Where one QSFP subnet joins the head to every node that needs the image (a pair, a switch), the head sends to all
of them at once, as it always did. On a ring each cable is its own subnets, so the head's address on one cable
reaches one neighbour only, and a 4-ring has no diagonal: the image then goes as a chain through neighbours, each
node sending on to the next over the cable between them (stage's chain walks the same way, node/network.py's
`cable_order`). A node that already holds the image still passes it on. Where no walk through neighbours exists
(cabling that discovery would name as a problem), the head sends to every node on the control-plane addresses,
which every node reaches."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ..engine.facts import HostFacts
from ..node.network import cable_order, facing


@dataclass(frozen=True)
class Hop:
    """One sender and the nodes it sends to at once, with each one's address on the subnet they share."""

    source: str
    receivers: tuple[str, ...]
    ips: Mapping[str, str]  # the source's and each receiver's address: the sender binds to one, accepts the others


def image_hops(head: str, names: Sequence[str], need: Collection[str], facts: Mapping[str, HostFacts],
               control: Mapping[str, str]) -> list[Hop]:
    """The hops, in order (each one's source holds the image once the hops before it are done). `names`: every
    node, head included; `need`: those lacking the image; `control`: each node's control-plane address."""
    receivers = [n for n in names if n in need and n != head]
    if not receivers:
        return []
    if all(n in facts for n in names):
        faced = [ends for n in receivers if (ends := facing(facts[head], facts[n]))]
        if len(faced) < len(receivers) or len({ends[0] for ends in faced}) > 1:
            return _chain(head, names, need, facts) or _star(head, receivers, control)
    return _star(head, receivers, control)


def _star(head: str, receivers: list[str], control: Mapping[str, str]) -> list[Hop]:
    """The head to every receiver at once, on the control-plane addresses (on a pair or a switch, each node's QSFP
    address; where the cables allow no chain, the management LAN's)."""
    return [Hop(head, tuple(receivers), {n: control[n] for n in [head, *receivers]})]


def _chain(head: str, names: Sequence[str], need: Collection[str], facts: Mapping[str, HostFacts]) -> list[Hop]:
    """Through neighbours from the head, each hop on the cable between its two nodes; [] where no such walk exists."""
    walk = cable_order([head, *[n for n in names if n != head]], facts)
    steps = [(a, b, ends) for a, b in zip(walk, walk[1:]) if (ends := facing(facts[a], facts[b]))]
    if len(steps) < len(walk) - 1:
        return []
    return [Hop(a, (b,), {a: ends[0], b: ends[1]}) for a, b, ends in steps if b in need]
