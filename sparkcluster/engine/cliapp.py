"""What every wing's sub-commands are wired with (`register(commands, app)` in each wing's `cli.py`): the way to
connect to the inventory the flags select, and the flag sets shared by every command that connects or changes
something. The top-level `cli.py` builds the one App; the wings never import it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from .inventory import Inventory
from .session import Session

# The inventory the flags select, `check` run on it before anything connects; `require_all`: an unreachable
# host is an error (serving and verifying need every node) rather than the caller's to report.
Connect = Callable[..., AbstractContextManager[Session]]
Command = Callable[[argparse.Namespace, Connect], int]


def no_check(inventory: Inventory) -> None:
    """For commands whose flags need nothing of the inventory before connecting."""


@dataclass(frozen=True)
class App:
    connect: Connect
    connecting: Callable[..., argparse.ArgumentParser]  # adds -i/--limit/--forks/--json (and INVENTORY)
    changing: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]  # adds --check/--diff/-K

    def wire(self, parser: argparse.ArgumentParser, command: Command) -> None:
        parser.set_defaults(func=lambda args: command(args, self.connect))
