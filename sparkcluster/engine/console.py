"""The one console setup every command prints through: rich on a terminal; into a pipe or a file, lines that
are never wrapped (a pipe is not an 80-column terminal: a size must not break into "1.07\nGB", nor an endpoint
URL across two lines). Results go to `out`, progress and errors to `err`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:  # not at run time: --help must not import paramiko through the console
    from .transport import Unreachable

# Wide enough for any table row or URL a command prints; tables still take only the width they need.
UNWRAPPED_WIDTH = 1000


def make_console(*, stderr: bool = False) -> Console:
    # No emoji codes: nothing we print means one, a host name or path like `:fire:` must print as it is, and
    # rich's table of codes is a module of its own that every command's first line would import.
    console = Console(stderr=stderr, emoji=False)
    if console.is_terminal:
        return console
    # Not even $COLUMNS: a shell exports the terminal's width to every program it starts, piped or not.
    return Console(stderr=stderr, width=UNWRAPPED_WIDTH, soft_wrap=True, emoji=False)


out = make_console()
err = make_console(stderr=True)


def print_error(message: str, fix: str = "") -> None:
    """An error and its fix, as every command shows them on stderr."""
    err.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False)
    if fix:
        err.print(f"  [bold]fix:[/bold] {escape(fix)}", highlight=False)


def print_unreachable(console: Console, name: str, address: str, error: Unreachable) -> None:
    console.print(f"[bold magenta]unreachable[/] {name} ({address}): {escape(error.message)}\n"
                  f"  fix: {escape(error.fix)}", highlight=False)
