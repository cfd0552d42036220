"""Renders runner events: a live per-host table on a terminal, plain lines otherwise (CI logs), or JSON.

Events arrive from the runner's worker threads, so every reporter serialises its output with a lock.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from rich.console import Console
from rich.markup import escape

from .events import (
    Event,
    Failure,
    HostRecap,
    PlayFinished,
    PlayStarted,
    RunFinished,
    RunStarted,
    Status,
    StepFinished,
    StepStarted,
)
from .facts import HostFacts

if TYPE_CHECKING:  # imported where a table is drawn: a --json or plain run (CI, a pipe) draws none
    from rich.live import Live
    from rich.table import Table

STYLE = {Status.OK: "green", Status.CHANGED: "yellow", Status.SKIPPED: "cyan", Status.FAILED: "bold red",
         Status.UNREACHABLE: "bold magenta"}


class Reporter:
    def __init__(self, console: Console, show_diff: bool = False) -> None:
        self.console = console
        self.show_diff = show_diff
        self.check = False  # from RunStarted: --check shows what each change would do
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.handle(event)

    def handle(self, event: Event) -> None:
        raise NotImplementedError

    # shared pieces
    def _actions(self, event: StepFinished) -> list[str]:
        """In check mode, what a change would do, each kind as what it is: a shell line is `run:`, a file written
        whole (write_file) is `upload:`, and what happens otherwise (on other nodes, through staging) is `would:`."""
        if not self.check:
            return []
        return [*(f"  run:    {c}" for c in event.commands), *(f"  upload: {u.display()}" for u in event.uploads),
                *(f"  would:  {n}" for n in event.notes)]

    def _diff(self, event: StepFinished) -> None:
        if self.show_diff and event.diff:
            self.console.print(event.diff, markup=False, highlight=False, end="")

    def _failures(self, failures: dict[str, Failure]) -> None:
        for host, f in failures.items():
            self.console.print(f"[bold red]FAILED[/bold red] {host}: {escape(f.message)}", highlight=False)
            if f.command:
                self.console.print(f"  command:   {f.command}", markup=False, highlight=False)
            if f.exit_code is not None:
                self.console.print(f"  exit code: {f.exit_code}", highlight=False)
            if f.stderr_tail:
                self.console.print("  stderr:    " + f.stderr_tail.replace("\n", "\n             "), markup=False,
                                   highlight=False)
            if f.fix:
                self.console.print(f"  fix:       {f.fix}", markup=False, highlight=False)

    def _recap(self, event: RunFinished) -> None:
        self._recap_counts(event)
        if event.stopped_by:
            self.console.print(f"[bold red]stopped:[/bold red] play {event.stopped_by!r} needs every host, and some "
                               "failed or were unreachable")
        if event.interrupted:
            self.console.print("[bold]interrupted[/bold]: the recap above is partial")
        self.console.print(f"took {event.duration:.1f} s")

    def _recap_counts(self, event: RunFinished) -> None:
        """Ansible's recap lines, `host : ok=1 changed=0 ...`: easy to grep in CI logs."""
        self.console.print("RECAP")
        width = max(len(h) for h in event.recap) if event.recap else 0
        for host, r in event.recap.items():
            counts = "  ".join(f"{s}={_count(s, r.count(s))}" for s in Status)
            self.console.print(f"{host:<{width}} : {counts}", highlight=False)


def _count(status: Status, n: int) -> str:
    return f"[{STYLE[status]}]{n}[/]" if n else "0"


class PlainReporter(Reporter):
    """One line per finished step, never wrapped: greppable CI logs."""

    def __init__(self, console: Console, show_diff: bool = False) -> None:
        # emoji=False as console.py's: a host or step text holding `:name:` prints as it is
        super().__init__(Console(file=console.file, soft_wrap=True, no_color=console.no_color, emoji=False), show_diff)

    def handle(self, event: Event) -> None:
        c = self.console
        if isinstance(event, RunStarted):
            self.check = event.check
            mode = " (check mode: nothing will be changed)" if event.check else ""
            c.print(f"playbook {event.playbook} on {', '.join(event.hosts)}{mode}", highlight=False)
        elif isinstance(event, PlayStarted):
            # Escaped: rich would read `[spark-1]` as a markup tag and drop it.
            c.print(escape(f"\nPLAY {event.play} [{', '.join(event.hosts)}]"), highlight=False)
        elif isinstance(event, StepFinished):
            c.print(f"[{STYLE[event.status]}]{event.status:<11}[/] {event.host} | {event.step} | {escape(event.reason)}",
                    highlight=False)
            for line in self._actions(event):
                c.print(line, markup=False, highlight=False)
            for warning in event.warnings:
                c.print(f"[yellow]warning[/]     {event.host} | {event.step} | {escape(warning)}", highlight=False)
            self._diff(event)
        elif isinstance(event, RunFinished):
            c.print()
            self._failures(event.failures)
            self._recap(event)


@dataclass
class _Row:
    """A host's row in the live table."""

    now: str = "waiting"
    counts: HostRecap = field(default_factory=HostRecap)


class LiveReporter(Reporter):
    """A live table, one row per host: what it is doing now and its counts so far."""

    def __init__(self, console: Console, show_diff: bool = False) -> None:
        super().__init__(console, show_diff)
        self.rows: dict[str, _Row] = {}
        self.live: Live | None = None
        self.title = ""

    def _table(self) -> Table:
        from rich.table import Table

        table = Table(title=self.title, title_justify="left")
        table.add_column("host")
        table.add_column("now")
        for status in Status:
            table.add_column(status, justify="right")
        for host, row in self.rows.items():
            table.add_row(host, row.now, *(_count(s, row.counts.count(s)) for s in Status))
        return table

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.check = event.check
            self.rows = {h: _Row() for h in event.hosts}
            self.title = f"playbook {event.playbook}" + (" (check mode)" if event.check else "")
            from rich.live import Live

            self.live = Live(self._table(), console=self.console, refresh_per_second=8, transient=False)
            self.live.start()
        elif isinstance(event, PlayStarted):
            for h in event.hosts:
                self.rows[h].now = event.play
        elif isinstance(event, StepStarted):
            self.rows[event.host].now = f"{event.play}: {event.step}"
        elif isinstance(event, StepFinished):
            row = self.rows[event.host]
            row.counts.add(event.status)
            if event.status.stops_host:
                row.now = f"[{STYLE[event.status]}]{event.status}: {event.step}[/]"
            actions = self._actions(event)
            if actions and self.live:
                self.live.console.print(f"[{STYLE[event.status]}]{event.status}[/] {event.host} | {event.step} | "
                                        f"{escape(event.reason)}", highlight=False)
                for line in actions:
                    self.live.console.print(line, markup=False, highlight=False)
            if event.diff and self.show_diff and self.live:
                self.live.console.print(event.diff, markup=False, highlight=False, end="")
            for warning in event.warnings:
                if self.live:
                    self.live.console.print(f"[yellow]warning[/] {event.host} | {event.step} | {escape(warning)}",
                                            highlight=False)
        elif isinstance(event, PlayFinished):
            for row in self.rows.values():
                if not row.now.startswith("["):
                    row.now = "done"
        elif isinstance(event, RunFinished):
            if self.live:
                self.live.update(self._table())
                self.live.stop()
            self._failures(event.failures)
            self._recap(event)
            return
        if self.live:
            self.live.update(self._table())


    def _recap_counts(self, event: RunFinished) -> None:
        from rich.table import Table

        table = Table(title="recap", title_justify="left", show_edge=False)
        table.add_column("host")
        for status in Status:
            table.add_column(status, justify="right")
        for host, r in event.recap.items():
            table.add_row(host, *(_count(status, r.count(status)) for status in Status))
        self.console.print(table)


class JsonReporter(Reporter):
    """Collects everything and prints one JSON document at the end (secrets were masked at the source)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(Console(file=out, emoji=False))
        self.out = out
        self.steps: list[dict[str, object]] = []  # each StepFinished: commands, uploads and notes are separate fields
        self.doc: dict[str, object] = {"steps": self.steps}

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.doc.update(playbook=event.playbook, hosts=list(event.hosts), check=event.check)
        elif isinstance(event, StepFinished):
            self.steps.append(dataclasses.asdict(event))
        elif isinstance(event, RunFinished):
            self.doc.update(
                recap={h: dataclasses.asdict(r) for h, r in event.recap.items()},
                failures={h: dataclasses.asdict(f) for h, f in event.failures.items()},
                interrupted=event.interrupted, stopped_by=event.stopped_by, exit_code=event.exit_code,
                duration=round(event.duration, 3),
            )
            self.out.write(json.dumps(self.doc, indent=2) + "\n")


def print_json(doc: object) -> None:
    """A command's --json document on stdout: the one shape every command prints."""
    print(json.dumps(doc, indent=2))


def make_reporter(console: Console, *, json_output: bool, show_diff: bool, out: TextIO) -> Reporter:
    if json_output:
        return JsonReporter(out)
    if console.is_terminal:
        return LiveReporter(console, show_diff)
    return PlainReporter(console, show_diff)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB free"


def facts_table(console: Console, host: str, address: str, facts: HostFacts) -> None:
    """One host's facts as a two-column table: what a Spark owner checks first. Its values are the node's own text,
    shown as text (as_markup): no escape sequence of a node's reaches the terminal."""
    from rich.table import Table

    from .nodetext import as_markup

    table = Table(title=f"{host} ({address})", title_justify="left", show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    table.add_row("system", as_markup(f"{facts.hostname}, {facts.os}, {facts.arch}, kernel {facts.kernel}"))
    table.add_row("user", as_markup(f"{facts.user} (uid {facts.uid}), home {facts.home}, groups {' '.join(facts.groups)}"))
    gpus = "; ".join(f"{g.name}, driver {g.driver_version}" + (f", cc {g.compute_cap}" if g.compute_cap else "")
                     for g in facts.gpus)
    table.add_row("GPU", as_markup(gpus) if gpus else f"[red]{as_markup(str(facts.gpu_error))}[/red]")
    rdma = ", ".join(f"{as_markup(f'{d.hca}→{d.netdev}')} [{'green' if d.up else 'red'}]{'Up' if d.up else 'Down'}[/]"
                     for d in facts.rdma)
    table.add_row(f"RDMA ({facts.rdma_source})", rdma or "[red]none found[/red]")
    for i in facts.interfaces:
        if i.name == "lo":
            continue
        speed = f"{i.speed_mbps // 1000} Gb/s" if i.speed_mbps else "speed ?"
        table.add_row(f"  {as_markup(i.name)}", f"{as_markup(i.state):<7} {' '.join(map(str, i.ipv4)) or '-':<18} mtu {i.mtu:<5} {speed}")
    d = facts.docker
    docker = ("not installed" if not d.installed else
              f"{'daemon up' if d.daemon_up else '[red]daemon down[/red]'}, "
              f"{'usable by ' + facts.user if d.usable else '[yellow]not usable by ' + facts.user + '[/yellow]'}"
              f"{', server ' + d.server_version if d.server_version else ''}, "
              f"nvidia runtime {'yes' if d.nvidia_runtime else '[red]no[/red]'}")
    table.add_row("docker", docker)
    table.add_row("HF cache", f"{as_markup(facts.hf_cache)} ({_gib(facts.hf_free_bytes)})")
    console.print(table, highlight=False)
