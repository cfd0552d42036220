"""One command's connections: a transport per selected host, every host's facts gathered once in parallel, and
every connection closed when the command is done, however it ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import SparkclusterError
from .facts import HostFacts, gather_all
from .inventory import Inventory
from .transport import Transport, Unreachable


@dataclass(frozen=True)
class Session:
    inventory: Inventory
    transports: dict[str, Transport]
    facts: dict[str, HostFacts]  # the reachable hosts'
    unreachable: dict[str, Unreachable]


@contextmanager
def connected(inventory: Inventory, *, forks: int, trust_new_host_keys: bool = False,
              sudo_password: str | None = None, require_all: bool = True) -> Iterator[Session]:
    """Connects to every host and gathers its facts. `require_all`: an unreachable host is an error naming it
    (serving and verifying need every node); otherwise the caller reports it."""
    transports = {h.name: Transport(h, trust_new_host_keys=trust_new_host_keys, sudo_password=sudo_password)
                  for h in inventory.hosts}
    try:
        gathered = gather_all(transports, forks)
        down = {n: v for n, v in gathered.items() if isinstance(v, Unreachable)}
        if down and require_all:
            raise SparkclusterError("unreachable: " + "; ".join(f"{n}: {e.message}" for n, e in down.items()),
                                    "power the nodes on, or --limit to the others")
        yield Session(inventory, transports,
                      {n: v for n, v in gathered.items() if not isinstance(v, Unreachable)}, down)
    finally:
        for transport in transports.values():
            transport.close()
