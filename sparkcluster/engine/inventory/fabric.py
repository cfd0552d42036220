"""The inventory's `fabric:` settings (vars, at any level), checked where they are written: each problem with its
own line, all of them in one run, before any connection. node/addressing.py reads the same settings into the
FabricConfig it addresses the twins with; these rules are that reader's, stated where the file's lines are known."""

from __future__ import annotations

from ipaddress import IPv4Network
from typing import Any

from ..errors import did_you_mean
from ..yamlsource import SourceList, SourceMap, describe
from .model import Source

TOPOLOGIES = ("auto", "pair", "switch", "ring")
KEYS = ("topology", "subnets", "mtu", "confirm_timeout", "control_plane", "node_subnet")
CONTROL_PLANES = ("routed", "lan")  # a ring's control plane: routed node addresses over the cables, or the LAN
DEFAULT_SUBNETS = ("192.168.177.0/24", "192.168.178.0/24")
DEFAULT_NODE_SUBNET = "10.177.0.0/24"
MTU_RANGE = (1280, 9216)  # IPv6's floor; the largest frame DGX OS configures on the ConnectX-7 ports
CONFIRM_RANGE_S = (5, 600)
EXAMPLE = "e.g. `fabric: {subnets: [192.168.177.0/24, 192.168.178.0/24], mtu: 9000}`"
# Address space no interface is given: a link's or the node addresses' network must stay clear of all of it.
NOT_UNICAST = ((IPv4Network("0.0.0.0/8"), "'this network'"), (IPv4Network("127.0.0.0/8"), "loopback"),
               (IPv4Network("224.0.0.0/4"), "multicast"), (IPv4Network("240.0.0.0/4"), "reserved"))
RING_SUBNETS = 16  # a ring of up to 8 nodes: 8 cables, two twins each


def check_fabric(value: Any, line: int, src: Source) -> None:
    """Reports every problem of a `fabric:` mapping into `src` (none raised: the other settings go on being read)."""
    if value is None:
        return
    if not isinstance(value, SourceMap):
        src.report(src.error(line, f"fabric must be a mapping of {', '.join(KEYS)}, not {describe(value)}", EXAMPLE))
        return
    for key in value:
        if key not in KEYS:
            src.report(src.error(value.key_line(key), f"fabric: unknown key {key!r}{did_you_mean(str(key), KEYS)}",
                                 f"the fabric's settings are {', '.join(KEYS)}"))
    if "topology" in value and value["topology"] not in TOPOLOGIES:
        src.report(src.error(value.key_line("topology"),
                             f"fabric.topology must be one of {', '.join(TOPOLOGIES)}, not {describe(value['topology'])}",
                             "auto (whatever the cables form), or say what they form: pair, switch or ring"))
    if "subnets" in value:
        _check_subnets(value["subnets"], value.key_line("subnets"), src)
    if "control_plane" in value and value["control_plane"] not in CONTROL_PLANES:
        src.report(src.error(value.key_line("control_plane"), f"fabric.control_plane must be routed or lan, not "
                             f"{describe(value['control_plane'])}", "routed (the default: a node address per node, "
                             "routed over a ring's cables) or lan (the management LAN)"))
    if "node_subnet" in value:
        _check_node_subnet(value, src)
    if "mtu" in value:
        mtu = value["mtu"]
        if isinstance(mtu, bool) or not isinstance(mtu, int) or not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
            src.report(src.error(value.key_line("mtu"), f"fabric.mtu must be a whole number from {MTU_RANGE[0]} to "
                                 f"{MTU_RANGE[1]}, not {describe(mtu)}", "9000 (jumbo frames, as the QSFP link wants)"))
    if "confirm_timeout" in value:
        seconds = value["confirm_timeout"]
        low, high = CONFIRM_RANGE_S
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not low <= seconds <= high:
            src.report(src.error(value.key_line("confirm_timeout"), f"fabric.confirm_timeout must be {low} to {high} "
                                 f"seconds, not {describe(seconds)}", "e.g. `confirm_timeout: 30` (the default)"))


def _check_subnets(subnets: Any, line: int, src: Source) -> None:
    fix = "list one IPv4 network per twin of the cabled port, e.g. `subnets: [192.168.177.0/24, 192.168.178.0/24]`"
    if not isinstance(subnets, SourceList) or len(subnets) != 2:
        src.report(src.error(line, f"fabric.subnets must list two IPv4 networks, not {describe(subnets)}", fix))
        return
    networks: list[tuple[IPv4Network, int]] = []
    for index, text in enumerate(subnets):
        at = subnets.item_line(index)
        try:
            network = IPv4Network(str(text)) if isinstance(text, str) else None
        except ValueError as e:
            src.report(src.error(at, f"fabric.subnets: {text!r} is not an IPv4 network: {e}", fix))
            continue
        if network is None:
            src.report(src.error(at, f"fabric.subnets: {describe(text)} is not an IPv4 network", fix))
        elif unusable := _not_unicast(network, "a cable"):
            src.report(src.error(at, f"fabric.subnets: {unusable}", fix))
        elif network.num_addresses < 4:
            src.report(src.error(at, f"fabric.subnets: {network} holds no two nodes", "a /24 per twin, as NVIDIA's "
                                                                                      "playbook uses"))
        else:
            networks.append((network, at))
    for i, (a, _) in enumerate(networks):
        for b, at in networks[i + 1:]:
            if a.overlaps(b):
                src.report(src.error(at, f"fabric.subnets {a} and {b} overlap: each twin needs a subnet of its own",
                                     "give the second twin another network, e.g. the next /24"))


def _check_node_subnet(value: SourceMap, src: Source) -> None:
    """The routed node addresses' network: a real one, room for a cluster, clear of the links' subnets (the two
    configured and the /24s after them that a ring's further cables take)."""
    line = value.key_line("node_subnet")
    fix = "a network of its own, neither the management LAN nor a link's, e.g. `node_subnet: 10.177.0.0/24`"
    text = value["node_subnet"]
    try:
        network = IPv4Network(text) if isinstance(text, str) else None
    except ValueError as e:
        src.report(src.error(line, f"fabric.node_subnet: {text!r} is not an IPv4 network: {e}", fix))
        return
    if network is None:
        src.report(src.error(line, f"fabric.node_subnet: {describe(text)} is not an IPv4 network", fix))
        return
    if unusable := _not_unicast(network, "the node addresses"):
        src.report(src.error(line, f"fabric.node_subnet: {unusable}", fix))
        return
    if network.num_addresses < 64:
        src.report(src.error(line, f"fabric.node_subnet: {network} is too small (node numbers start at .11)", fix))
        return
    subnets = value.get("subnets")
    try:
        links = [IPv4Network(str(s)) for s in subnets] if isinstance(subnets, SourceList) else []
    except ValueError:
        return  # reported with the subnets
    if any(_not_unicast(link, "a cable") for link in links):
        return  # likewise
    links = links or [IPv4Network(s) for s in DEFAULT_SUBNETS]
    # A ring takes up to RING_SUBNETS link subnets: the configured two and the ones that follow the second, as far
    # as IPv4 goes (a second subnet near its top has fewer after it).
    last = links[-1]
    links += [IPv4Network((start, last.prefixlen)) for i in range(1, RING_SUBNETS - 1)
              if (start := int(last.network_address) + i * last.num_addresses) < 2**32]
    clash = next((n for n in links if n.overlaps(network)), None)
    if clash is not None:
        src.report(src.error(line, f"fabric.node_subnet {network} overlaps the link subnet {clash}", fix))


def _not_unicast(network: IPv4Network, user: str) -> str | None:
    """Why `network` is no network for `user` (a cable, the node addresses): None where it is unicast space."""
    for space, kind in NOT_UNICAST:
        if network.subnet_of(space):
            return f"{network} is {kind} address space ({space}), not a network {user} can use"
        if network.overlaps(space):
            return f"{network} takes in {kind} address space ({space}), not a network {user} can use"
    return None
