"""The values an inventory becomes: Host, Inventory and InventoryError.

They live apart from inventory.py so that the format readers and the shared checks can build and raise them
without importing inventory.py, which imports the readers (an import cycle otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError, did_you_mean

HEAD, WORKER = "head", "worker"


class InventoryError(UsageError):
    """An inventory that is missing or invalid (exit 2); `line` is set when the message points into the file.
    `problems`: every problem found in one reading of the file (this error is the first of them, or all of them
    together: see Source.raise_problems)."""

    def __init__(self, message: str, fix: str = "", *, line: int | None = None,
                 problems: tuple[InventoryError, ...] = ()) -> None:
        super().__init__(message, fix)
        self.line = line
        self.problems = problems or (self,)


@dataclass(frozen=True)
class Source:
    """The file being read, and every problem found in it so far: the readers report a problem and go on with
    the next host, group or setting, so that one run names them all (each with its line) before any connection."""

    shown: str  # the path as the user gave it
    dir: Path  # where relative key paths start
    check_files: bool
    problems: list[InventoryError] = field(default_factory=list, compare=False)

    def error(self, line: int, problem: str, fix: str) -> InventoryError:
        return InventoryError(f"{self.shown}:{line}: {problem}", fix, line=line)

    def report(self, error: InventoryError) -> None:
        if all(e.message != error.message for e in self.problems):  # a shared layer read twice says it once
            self.problems.append(error)

    def raise_problems(self) -> None:
        """One error for all the problems found, in the order they were found (a cause before what follows from
        it: an unknown key `host:` before "no `hosts:` section"), each with its fix; exit 2."""
        found = list(self.problems)
        if len(found) == 1:
            raise found[0]
        if found:  # printed as `error: <first>`, each fix under its problem, the last one's as the error's fix
            lines = [line for e in found[:-1] for line in (e.message, f"  fix: {e.fix}")] + [found[-1].message]
            raise InventoryError("\n".join(lines), found[-1].fix, line=found[0].line, problems=tuple(found))


@dataclass(frozen=True)
class Host:
    name: str  # inventory name, used in all output
    address: str  # what we connect to: an IP literal or a DNS/ssh-config host name
    role: str  # HEAD or WORKER
    user: str | None = None  # None: ~/.ssh/config or the local user decides
    port: int = 22
    key: str | None = None  # absolute path of the private key
    known_hosts: str | None = None  # absolute path of an extra known_hosts file
    become: bool = True
    qsfp_interface: str | None = None
    fabric_ip: str | None = None
    hcas: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # in precedence order, lowest first
    # Merged free-form vars (all < groups < host). Left out of the hash so hosts can be set members and dict keys.
    vars: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Inventory:
    path: Path  # as the user gave it
    name: str
    hosts: tuple[Host, ...]
    vars: Mapping[str, Any] = field(hash=False)  # the free-form vars every host starts from
    models: tuple[str, ...] = ()
    format: str = "sparkcluster"  # or "ansible"
    # Every host's name in the file's order, kept through --limit: what numbers a node stably (fabric addresses).
    everyone: tuple[str, ...] = ()
    # The hosts --limit left out: nothing connects to them, but an HTTP figure of theirs (a replica's /metrics behind
    # the router) is still part of the endpoint's.
    unselected: tuple[Host, ...] = ()

    @property
    def every_host(self) -> tuple[Host, ...]:
        """The selected hosts, then those --limit left out."""
        return (*self.hosts, *self.unselected)

    @property
    def head(self) -> Host:
        return next(h for h in self.hosts if h.role == HEAD)

    @property
    def workers(self) -> tuple[Host, ...]:
        return tuple(h for h in self.hosts if h.role != HEAD)

    def position(self, name: str) -> int:
        """0 for the head, then 1, 2, ... for the other hosts in the file's order, counting those --limit left out."""
        names = self.everyone or tuple(h.name for h in self.hosts)
        return [self.head.name, *(n for n in names if n != self.head.name)].index(name)

    def limit(self, names: Sequence[str]) -> Inventory:
        """Only the named hosts and the members of the named groups (`all` is every host); the head must stay."""
        selected: set[str] = set()
        for name in names:
            members = {h.name for h in self.hosts if name in (h.name, "all", *h.groups)}
            if not members:
                choices = sorted({h.name for h in self.hosts} | {g for h in self.hosts for g in h.groups})
                raise InventoryError(f"{self.path}: no host or group named {name!r}{did_you_mean(name, choices)}",
                                     f"choose from: {', '.join(choices)}")
            selected |= members
        if self.head.name not in selected:
            raise InventoryError(f"{self.path}: the selection {', '.join(names) or '(empty)'} leaves out the head {self.head.name}",
                                 f"include it as well ({', '.join([self.head.name, *names])}): every command needs the head")
        return replace(self, hosts=tuple(h for h in self.hosts if h.name in selected),
                       everyone=self.everyone or tuple(h.name for h in self.hosts),
                       unselected=(*self.unselected, *(h for h in self.hosts if h.name not in selected)))
