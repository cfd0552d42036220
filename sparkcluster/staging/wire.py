"""The control side of staging's TCP transport (`blobwire.py` is the node side): the commands that start a
sender on a node, fetch one blob from it, and stop it. ssh carries these commands and the run's token (on
stdin, never in argv); the blobs themselves go over plain TCP between the fabric addresses."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Literal, get_args

from ..engine.command import Command
from ..engine.deadlines import stall_seconds
from ..engine.errors import SparkclusterError
from ..engine.events import Failure
from ..engine.parallel import parallel_map
from ..engine.remote import python_command, python_of
from ..engine.transport import Transport, Unreachable

# How blobs cross between nodes: plain TCP between the fabric addresses (blobwire), or rsync over ssh.
DataPlane = Literal["tcp", "ssh"]
TRANSPORTS: tuple[DataPlane, ...] = get_args(DataPlane)
BLOBWIRE_PY = (resources.files("sparkcluster.staging") / "blobwire.py").read_text()


def new_token() -> str:
    """One per staging run: the senders serve only connections that present it."""
    return secrets.token_hex(32)


def _blobwire(python: str, *args: str, token: str, timeout: float, name: str) -> Command:
    # The token on stdin: never in argv, where any user of the node could read it.
    # --stall: a silent link ends the transfer in bounded time (engine/deadlines.py), not the 24 h bound below
    return python_command(python, BLOBWIRE_PY, *args, "--stall", f"{stall_seconds():g}", stdin=token + "\n",
                          timeout=timeout, secrets=(token,), name=name)


def serve_command(python: str, bind: str, blobs_dir: str, allowed: Iterable[str], token: str) -> Command:
    return _blobwire(python, "serve", "--bind", bind, "--dir", blobs_dir, "--allow", ",".join(sorted(allowed)),
                     token=token, timeout=30, name=f"`blobwire serve` on {bind}")


def fetch_command(python: str, connect: str, source: str, blobs_dir: str, blob: str, size: int, token: str) -> Command:
    return _blobwire(python, "fetch", "--connect", connect, "--source", source, "--dir", blobs_dir, "--blob", blob,
                     "--size", str(size), token=token, timeout=24 * 3600, name=f"`blobwire fetch {blob}` from {connect}")


@dataclass(frozen=True)
class Sender:
    """A running sender: where fetchers connect, and the process to stop afterwards."""

    address: str
    port: int
    pid: int

    @property
    def endpoint(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"

    def stop_command(self) -> Command:
        # Only our own server (its command line has --allow): a recycled PID is left alone.
        return Command(f"grep -qa -- --allow /proc/{self.pid}/cmdline 2>/dev/null && kill {self.pid}; true",
                       timeout=15)


def parse_started(name: str, address: str, stdout: str) -> Sender:
    try:
        port, pid = (int(word) for word in stdout.split())
    except ValueError:
        raise SparkclusterError(f"{name}: the blob sender did not start (it printed {stdout.strip()[:200]!r})",
                                "check that python3 runs there") from None
    return Sender(address, port, pid)


def start_senders(transports: Mapping[str, Transport], blobs_dirs: Mapping[str, str], addresses: Mapping[str, str],
                  allowed: Iterable[str], token: str) -> tuple[dict[str, Sender], dict[str, Failure]]:
    """A sender on each named node, bound to its address, serving its blobs dir to `allowed` only. Returns
    the senders and, for nodes where none started, why."""
    senders: dict[str, Sender] = {}
    failures: dict[str, Failure] = {}
    allowed = list(allowed)

    def start(name: str) -> None:
        try:
            transport = transports[name]
            command = serve_command(python_of(transport.host), addresses[name], blobs_dirs[name], allowed, token)
            result = transport.run(command)
            if not result.ok:
                failures[name] = Failure(f"the blob sender did not start: {result.stderr_tail(3)}",
                                         f"check that {addresses[name]} is an address of {name} and python3 runs there",
                                         command.label(), result.exit_code, result.stderr_tail())
                return
            senders[name] = parse_started(name, addresses[name], result.stdout)
        except SparkclusterError as e:  # Unreachable included
            failures[name] = Failure(e.message, e.fix)

    parallel_map(start, list(blobs_dirs), workers=max(1, len(blobs_dirs)))
    return senders, failures


def stop_senders(transports: Mapping[str, Transport], senders: Mapping[str, Sender]) -> None:
    """Senders also exit on their own once idle; stopping them now closes their ports at once."""
    def stop(name: str) -> None:
        try:
            transports[name].run(senders[name].stop_command())
        except Unreachable:
            pass  # a node that is gone took its sender with it

    parallel_map(stop, list(senders), workers=max(1, len(senders)))
