"""The doctor's output: findings grouped (preflight, parity, known issues, kernel log, gpu, upgrades), each failure and
warning with its fix (and where owners reported it), then the compared values side by side, one column per node. A finding's
words and values carry node text (driver versions, interface names, nvidia-smi's errors): each is printed as text
(`as_markup`), never as escapes or markup."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..engine.nodetext import as_markup
from ..node.parity import Finding, Severity
from .run import DoctorReport

MARK = {Severity.OK: "[green]ok[/green]  ", Severity.INFO: "[blue]info[/blue]", Severity.WARN: "[yellow]warn[/yellow]",
        Severity.FAIL: "[red]FAIL[/red]"}
GROUPS = ("preflight", "parity", "known issues", "kernel log", "gpu", "upgrades")
PER_NODE = ("preflight", "kernel log")  # groups whose passing checks are listed by node
IN_FULL = ("gpu", "upgrades")  # groups whose passing checks each carry a node's figures (temperature, power, clock;
# what it would upgrade)


def _line(console: Console, f: Finding) -> None:
    console.print(f"  {MARK[f.severity]} {f.check}: {as_markup(f.summary)}", highlight=False)
    if f.fix and f.severity is not Severity.OK:
        console.print(f"         fix: {as_markup(f.fix)}", highlight=False)
    if f.source and f.severity is not Severity.OK:  # where owners reported it, and the fix that worked
        console.print(f"         reported: {as_markup(f.source)}", highlight=False)


def render(console: Console, report: DoctorReport) -> None:
    for name, why in report.unreachable.items():
        console.print(f"[red]FAIL[/red] {name}: {as_markup(why)}", highlight=False)
    for group in GROUPS:
        found = [f for f in report.findings if f.group == group]
        if not found and group != "known issues":
            continue
        console.print(f"[bold]{group}[/bold]")
        passed = [f for f in found if f.severity is Severity.OK]
        if group in IN_FULL:
            for f in passed:
                _line(console, f)
        elif group in PER_NODE:  # one line per check for the nodes that pass it; the others in full
            for check in dict.fromkeys(f.check for f in passed):
                names = ", ".join(n for f in passed if f.check == check for n in f.nodes)
                console.print(f"  {MARK[Severity.OK]} {check}: {names}", highlight=False)
        elif passed:
            console.print(f"  {MARK[Severity.OK]} {', '.join(f.check for f in passed) if group == 'parity' else ''}"
                          f"{': the same on every node' if group == 'parity' else ''}", highlight=False)
        for f in found:
            if f.severity is not Severity.OK:
                _line(console, f)
        if group == "known issues" and not [f for f in found if f.severity is not Severity.OK]:
            console.print(f"  {MARK[Severity.OK]} none of the known-bad values", highlight=False)
    if len(report.nodes) > 1:
        table = Table(title="compared across nodes", title_justify="left")
        table.add_column("")
        for name in report.nodes:
            table.add_column(name)
        for f in report.findings:
            if f.group == "parity":
                odd = set(f.nodes)
                values = {n: as_markup(f.values.get(n, "")) for n in report.nodes}
                table.add_row(f.check, *(f"[red]{values[n]}[/red]" if n in odd else values[n] for n in report.nodes))
        console.print(table)
    fails = sum(f.severity is Severity.FAIL for f in report.findings) + len(report.unreachable)
    warns = sum(f.severity is Severity.WARN for f in report.findings)
    verdict = "[red]problems found[/red]" if report.failed else "[green]healthy[/green]"
    console.print(f"doctor: {verdict}: {fails} failed, {warns} warnings, {len(report.nodes)} nodes checked", highlight=False)
