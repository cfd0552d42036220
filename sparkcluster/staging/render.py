"""How staging looks in the terminal: a line per blob as it lands, then a table per node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .chain import BlobDone, StageResult

STATE_STYLE = {"complete": "green", "missing": "yellow", "incomplete": "yellow", "corrupt": "bold red",
               "absent": "red", "failed": "bold red"}


def progress_printer(console: Console) -> Callable[[BlobDone], None]:
    def show(e: BlobDone) -> None:
        rate = e.bytes / e.seconds / 1e6 if e.seconds > 0 else 0.0
        console.print(f"{e.node} <- {e.done_files}/{e.total_files} {e.path} {e.bytes / 1e6:.0f} MB "
                      f"in {e.seconds:.1f} s ({rate:.0f} MB/s)", highlight=False, markup=False)

    return show


def result_table(console: Console, result: StageResult) -> None:
    table = Table(title=f"{result.model} @ {result.commit[:12]} from {result.source}", title_justify="left")
    for column in ("node", "before", "now", "sent", "MB/s", "error"):
        table.add_column(column)
    for name, r in result.nodes.items():
        rate = f"{r.bytes / r.seconds / 1e6:.0f}" if r.bytes and r.seconds else "-"
        style = STATE_STYLE.get(r.state, "")
        error = f"{r.error} (fix: {r.fix})" if r.error else ""
        table.add_row(name, r.status_before, f"[{style}]{r.state}[/]", f"{r.bytes / 1e6:.0f} MB", rate, escape(error))
    console.print(table, highlight=False)


def status_table(console: Console, model: str, doc: dict[str, Any]) -> None:
    title = f"{model}" + (f" @ {doc['commit'][:12]} ({doc['files']} files, {doc['bytes'] / 1e9:.2f} GB)"
                          if doc.get("commit") else " (no complete copy on any node)")
    table = Table(title=title, title_justify="left")
    for column in ("node", "state", "missing", "corrupt"):
        table.add_column(column)
    for name, s in doc["nodes"].items():
        style = STATE_STYLE.get(s["state"], "")
        table.add_row(name, f"[{style}]{s['state']}[/]", str(len(s["missing"])), str(len(s["corrupt"])))
    console.print(table, highlight=False)
