"""How a simulated cluster looks in the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def cluster(console: Console, doc: dict[str, Any]) -> None:
    title = f"simulated cluster [bold]{doc['name']}[/bold] ({doc['status']}, docker {'on' if doc['docker'] else 'off'})"
    table = Table(title=title, title_justify="left")
    for column in ("host", "power", "management (enP7s7)", "QSFP twins", "port", "driver"):
        table.add_column(column)
    def fabric(ips: list[str]) -> str:
        # Fresh from the box, the twins have no address yet: show where bootstrap will put them, marked as such.
        if doc.get("fabric_addresses", True):
            return " ".join(ips)
        given = "link-local 169.254/16 at first" if doc.get("link_local") else "none yet"
        return f"{given} (bootstrap: {' '.join(ips)})"

    for h in doc["hosts"]:
        table.add_row(
            h["name"], "on" if h["running"] else "[red]off[/red]", h["mgmt_ip"], fabric(h["fabric_ips"]),
            str(h["cabled_port"]), h["driver"],
        )
    console.print(table)
    console.print(f"inventory:   {doc['inventory']}")
    console.print(f"ssh key:     {doc['key']}")
    console.print(f"known_hosts: {doc['known_hosts']}")
