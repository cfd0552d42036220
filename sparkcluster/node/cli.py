"""`sparkcluster topology`: the fabric as the cables make it (discovery, node/discovery.py), compared with what
the inventory says; a picture in the terminal or `--json` (a `links` list, each link naming its two ends)."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from ..engine.cliapp import App, Connect
from ..engine.console import out as console
from ..engine.errors import EXIT_FAILED, EXIT_OK
from ..engine.nodetext import as_markup
from ..engine.report import print_json
from .discovery import Checked, check_cabling, discover
from .fabric import Fabric, Kind


def topology_json(checked: Checked) -> dict[str, Any]:
    return {**checked.fabric.to_json(), "expected": checked.expected,
            "problems": [{"what": p.what, "fix": p.fix} for p in checked.problems]}


def _speed(mbps: int | None) -> str:
    return f"{mbps // 1000} Gb/s" if mbps else "?"


def _at(node: str, port: int | None) -> str:
    """A cable's end: the node's QSFP port, or the node alone where its twin has no QSFP port's name."""
    return node if port is None else f"{node} port {port}"


def picture(fabric: Fabric) -> list[str]:
    """Who is cabled to whom, one line per cable (both twins on it), in the order of the fabric's subnets."""
    lines = []
    for (a_node, a_port), (b_node, b_port) in fabric.cables():
        twins = [l for l in fabric.links if l.cable == ((a_node, a_port), (b_node, b_port))]
        detail = ", ".join(f"{l.a.netdev}<->{l.b.netdev}" for l in twins)
        lines.append(f"{_at(a_node, a_port)} ==== {_at(b_node, b_port)}   ({detail})")
    switched = sorted({l.a.node for l in fabric.links if not l.direct and l.b.node != "?"},
                      key=lambda n: fabric.nodes.index(n) if n in fabric.nodes else 99)
    for node in switched:
        ports = sorted({l.a.port for l in fabric.links if l.a.node == node and not l.direct}, key=lambda p: p or 0)
        lines.append(f"{node} port {', '.join(map(str, ports))} ==== switch")
    order = fabric.ring_order()
    if fabric.kind is Kind.RING:
        lines.append("ring: " + " -> ".join((*order, order[0])))
    return lines


def render(out: Console, checked: Checked) -> None:
    """Interface names and addresses are the nodes' own text: printed as text (as_markup), never as escapes."""
    fabric = checked.fabric
    out.print(f"[bold]fabric[/bold]: {fabric.kind.value} of {len(fabric.nodes)} node(s) "
              f"(inventory: {as_markup(checked.expected)})", highlight=False)
    for line in picture(fabric):
        out.print("  " + as_markup(line), highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("end a", "end b", "twin", "speed", "subnet"):
        table.add_column(column)
    for link in fabric.links:
        table.add_row(as_markup(link.a.label()), as_markup(link.b.label()), str(link.a.twin), _speed(link.speed_mbps),
                      str(link.subnet) if link.subnet else "(no address yet)")
    out.print(table)
    muddled = {twin for d in checked.duplicates for twin in d.twins}
    for end in fabric.silent:
        why = "what answered on it is a duplicate address (below)" if (end.node, end.netdev) in muddled else \
            "nobody answered on it"
        out.print(f"[yellow]![/yellow] {as_markup(end.label())} is Up but {why}", highlight=False)
    for node in fabric.unprobed:
        out.print(f"[yellow]![/yellow] {node} was not probed (unreachable)", highlight=False)
    for problem in checked.problems:
        out.print(f"[red]x[/red] {as_markup(problem.what)}\n  fix: {as_markup(problem.fix)}", highlight=False)


def cmd_topology(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args, require_all=False) as session:
        checked = check_cabling(session.inventory, discover(session), session.facts)
    if args.json:
        print_json(topology_json(checked))
    else:
        render(console, checked)
    return EXIT_FAILED if checked.problems or checked.fabric.unprobed else EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    topo = app.connecting(commands.add_parser(
        "topology", help="the QSFP fabric as cabled: who is cabled to whom, on which port and twin"))
    app.wire(topo, cmd_topology)
