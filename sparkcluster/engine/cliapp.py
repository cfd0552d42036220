"""What every wing's sub-commands are wired with (`register(commands, app)` in each wing's `cli.py`): the way to
connect to the inventory the flags select, and the flag sets shared by every command that connects or changes
something. The top-level `cli.py` builds the one App; the wings never import it.

Nothing here imports the transport, the session or the inventory at module level: `cli.py` builds its parser from
this module for every command, and `sparkcluster --help` must not pay for paramiko (a third of a second)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import AbstractContextManager

from . import flags
from .flags import DEFAULT_FORKS

# typing.TYPE_CHECKING without importing typing (nor dataclasses, with inspect): `sparkcluster --help` builds its
# parser from this module, and those two are a quarter of what it would import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .inventory import Inventory
    from .session import Session

# The inventory the flags select, `check` run on it before anything connects; `require_all`: an unreachable
# host is an error (serving and verifying need every node) rather than the caller's to report.
Connect = Callable[..., AbstractContextManager["Session"]]
Command = Callable[[argparse.Namespace, Connect], int]


class Parser(argparse.ArgumentParser):
    """argparse, except that an option given `--` as its value (`--forks=--`) gets that value, checked by the
    option's type like any other, instead of an empty list: Python before 3.13 strips every `--` from an
    option's values, and a count of `[]` reached the runner."""

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> object:
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            return self._get_value(action, "--")
        return super()._get_values(action, arg_strings)


def no_check(inventory: Inventory) -> None:
    """For commands whose flags need nothing of the inventory before connecting."""


def connecting(p: argparse.ArgumentParser, inventory_positional: bool = True) -> argparse.ArgumentParser:
    """-i/--limit/--forks/--trust-new-host-keys/--json (and the INVENTORY positional) on a command that connects."""
    if inventory_positional:
        p.add_argument("inventory_arg", nargs="?", metavar="INVENTORY", help="inventory file")
    p.add_argument("-i", "--inventory", help="inventory file (else $SPARKCLUSTER_INVENTORY, ./inventory.yml, "
                                              "then the one the last bootstrap used)")
    p.add_argument("--limit", type=flags.names, help="comma-separated hosts or groups to act on")
    p.add_argument("--forks", type=flags.count, default=DEFAULT_FORKS,
                   help=f"hosts in parallel (default {DEFAULT_FORKS})")
    p.add_argument("--trust-new-host-keys", action="store_true",
                   help="accept and record host keys not yet in known_hosts (never a changed key)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def changing(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--check/--diff/-K on a command that changes the nodes."""
    p.add_argument("--check", action="store_true", help="show what would change; change nothing")
    p.add_argument("--diff", action="store_true", help="show the changes made to files")
    p.add_argument("--ask-become-pass", "-K", action="store_true", help="ask once for the sudo password")
    return p


def selected_inventory(args: argparse.Namespace) -> Inventory:
    """The inventory the flags name (the positional one, -i, or the fallbacks), loaded and validated, --limit
    applied. Says on stderr which file it is and why, unless the output is --json."""
    from .console import err
    from .inventory import find_inventory, load_inventory

    positional = getattr(args, "inventory_arg", None)
    path, reason = find_inventory(positional or args.inventory,
                                  explicit_reason="as given" if positional else "from -i")
    if not getattr(args, "json", False):
        err.print(f"inventory: {path} ({reason})", highlight=False)
    inventory = load_inventory(path)
    if args.limit:
        inventory = inventory.limit([n.strip() for n in args.limit.split(",") if n.strip()])
    return inventory


def become_password(args: argparse.Namespace) -> str | None:
    # Asked once, fed to sudo on stdin; never in argv, logs or --json.
    if not getattr(args, "ask_become_pass", False):
        return None
    import getpass  # with termios: only for -K

    return getpass.getpass("BECOME (sudo) password: ")


def connect_selected(args: argparse.Namespace, check: Callable[[Inventory], None] = no_check,
                     require_all: bool = True) -> AbstractContextManager[Session]:
    """The selected inventory (`check` sees it before anything connects), connected, with every node's facts."""
    from .session import connected

    inventory = selected_inventory(args)
    check(inventory)
    return connected(inventory, forks=args.forks, trust_new_host_keys=args.trust_new_host_keys,
                     sudo_password=become_password(args), require_all=require_all)


class App:
    """What each wing's `register(commands, app)` is given: how to connect, and the shared flag sets."""

    def __init__(self, connect: Connect = connect_selected) -> None:
        self.connect = connect
        # adds -i/--limit/--forks/--json (and INVENTORY)
        self.connecting: Callable[..., argparse.ArgumentParser] = connecting
        # adds --check/--diff/-K
        self.changing: Callable[[argparse.ArgumentParser], argparse.ArgumentParser] = changing

    def wire(self, parser: argparse.ArgumentParser, command: Command) -> None:
        parser.set_defaults(func=lambda args: command(args, self.connect))
