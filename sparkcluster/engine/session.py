"""One connected cluster: the inventory, one transport per host, the facts of every reachable host, who is
unreachable. Every wing receives this one value (as Fabric's `Group`): it runs a command on one host or a
function on each, and closes every connection when the command is done, however it ends."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from .command import Command
from .errors import SparkclusterError
from .facts import HostFacts, gather_all
from .flags import DEFAULT_FORKS
from .inventory import Host, Inventory
from .parallel import parallel_map
from .transport import Result, Transport, Unreachable

T = TypeVar("T")


class RunMemo:
    """Values a run works out once and every step of it reads (the fabric that discovery finds): shared by a
    session and every narrowing of it, gone with the run. One lock for all: when every node's step asks at
    once, one of them works the value out and the others wait for it rather than each doing it again."""

    def __init__(self) -> None:
        self._values: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, key: str, make: Callable[[], T]) -> T:
        with self._lock:
            if key not in self._values:
                self._values[key] = make()
            return cast(T, self._values[key])

    def forget(self, key: str) -> None:
        """What the value was worked out from changed: the next reader works it out again."""
        with self._lock:
            self._values.pop(key, None)


@dataclass(frozen=True)
class Session:
    inventory: Inventory
    transports: dict[str, Transport]
    facts: dict[str, HostFacts] = field(default_factory=dict)  # the reachable hosts', gathered once
    unreachable: dict[str, Unreachable] = field(default_factory=dict)
    forks: int = DEFAULT_FORKS
    memo: RunMemo = field(default_factory=RunMemo, compare=False, repr=False)  # shared by `only`'s narrowings

    @property
    def head(self) -> Host:
        return self.inventory.head

    @property
    def hosts(self) -> tuple[Host, ...]:
        """The selected hosts, head first."""
        return self.inventory.hosts

    def transport(self, host: Host | str) -> Transport:
        return self.transports[host if isinstance(host, str) else host.name]

    def run(self, host: Host | str, command: Command) -> Result:
        return self.transport(host).run(command)

    def each(self, fn: Callable[[Host], T], hosts: Iterable[Host] | None = None) -> list[T]:
        """`fn` on every host (or on `hosts`) at once, in order; an interrupt closes every connection first so
        that no thread blocked on a remote command holds the command up."""
        chosen = list(self.hosts if hosts is None else hosts)
        return parallel_map(fn, chosen, workers=max(self.forks, len(chosen)), on_abort=self.close)

    def only(self, names: Iterable[str]) -> Session:
        """The same connections, narrowed to `names` (in inventory order): the nodes still in a run. Closing
        the narrowed session is the caller's business, never the narrowing's."""
        keep = set(names)
        return replace(self, inventory=replace(self.inventory, hosts=tuple(h for h in self.hosts if h.name in keep)),
                       facts={n: f for n, f in self.facts.items() if n in keep},
                       unreachable={n: e for n, e in self.unreachable.items() if n in keep})

    def close(self) -> None:
        for transport in self.transports.values():
            transport.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(inventory: Inventory, *, forks: int = DEFAULT_FORKS, trust_new_host_keys: bool = False,
            sudo_password: str | None = None) -> Session:
    """A transport per host, none of them connected yet (each connects on first use); no facts. The runner
    starts here, gathering facts play by play."""
    transports = {h.name: Transport(h, trust_new_host_keys=trust_new_host_keys, sudo_password=sudo_password)
                  for h in inventory.hosts}
    return Session(inventory, transports, forks=max(1, forks))


@contextmanager
def connected(inventory: Inventory, *, forks: int = DEFAULT_FORKS, trust_new_host_keys: bool = False,
              sudo_password: str | None = None, require_all: bool = True) -> Iterator[Session]:
    """Connects to every host and gathers its facts in parallel. `require_all`: an unreachable host is an error
    naming it (serving and verifying need every node); otherwise the caller reports it."""
    with connect(inventory, forks=forks, trust_new_host_keys=trust_new_host_keys,
                 sudo_password=sudo_password) as session:
        gathered = gather_all(session.transports, session.forks, session.close)
        down = {n: v for n, v in gathered.items() if isinstance(v, Unreachable)}
        if down and require_all:
            raise SparkclusterError("unreachable: " + "; ".join(f"{n}: {e.message}" for n, e in down.items()),
                                    "power the nodes on, or --limit to the others")
        session.facts.update({n: v for n, v in gathered.items() if not isinstance(v, Unreachable)})
        session.unreachable.update(down)
        yield session
