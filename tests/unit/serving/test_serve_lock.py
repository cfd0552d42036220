"""One serve or up at a time per cluster, for the whole of it (README audit round 3, wrong item 1): the lock was an
`flock` held by a channel on the run's own SSH connection, and `up` stops every node with a fresh connection
(lifecycle.stop_everywhere reconnects) just before its Ray phase: the reconnect closed the lock's channel, and two
`up`s 3 s apart both ran. The real Transport runs here over a fake connection layer that behaves as sshd does: a
connection's close ends every channel on it, and so the `flock` its channel held."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.locks import Busy
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Transport
from sparkcluster.serving import phases
from sparkcluster.serving.cli import one_at_a_time
from sparkcluster.serving.launch import Node
from sparkcluster.serving.phases import Phases, ServeOptions, up
from sparkcluster.serving.progress import ignore


class NodeSide:
    """One node's side of the `flock`: which channel holds the serve lock, and the words it left in the file."""

    def __init__(self) -> None:
        self.holder: FakeChannel | None = None
        self.words = ""
        self.lock = threading.Lock()


class FakeChannel:
    """An exec channel: the lock's shell answers `locked` or `busy WHO` and holds the lock until its stdin ends or
    its connection closes; any other command exits 0 with no output."""

    def __init__(self, node: NodeSide) -> None:
        self.node, self.closed, self.eof_received = node, False, True
        self.out, self.locking = b"", False

    def settimeout(self, timeout: float) -> None:
        pass

    def exec_command(self, line: str) -> None:
        self.locking = "flock -n 9" in line

    def sendall(self, data: bytes) -> None:
        if not self.locking:
            return
        with self.node.lock:
            if self.node.holder is None or self.node.holder.closed:
                self.node.holder, self.node.words = self, data.decode().splitlines()[0]
                self.out += b"locked\n"
            else:
                self.out += f"busy {self.node.words}\n".encode()

    def shutdown_write(self) -> None:
        self.close()  # EOF on its stdin: `cat` ends, and the lock with it

    def recv(self, n: int) -> bytes:
        data, self.out = self.out[:n], self.out[n:]
        return data

    def recv_ready(self) -> bool:
        return bool(self.out)

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return not self.locking or self.closed

    def recv_exit_status(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


class FakeConnection:
    """A login: the channels opened on it end with it."""

    def __init__(self, node: NodeSide, opened: list[FakeConnection]) -> None:
        self.node, self.channels, self.open = node, [], True
        opened.append(self)

    @property
    def transport(self) -> FakeConnection:
        return self

    @property
    def is_connected(self) -> bool:
        return self.open

    def open_session(self) -> FakeChannel:
        channel = FakeChannel(self.node)
        self.channels.append(channel)
        return channel

    def close(self) -> None:
        self.open = False
        for channel in self.channels:
            channel.close()


HOSTS = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, NodeSide]]:
    """Every Transport's logins reach these nodes (sshd's side of each `flock`)."""
    found = {h.name: NodeSide() for h in HOSTS}
    opened: list[FakeConnection] = []
    monkeypatch.setattr(Transport, "_open_with_retries", lambda self: FakeConnection(found[self.host.name], opened))
    yield found
    for connection in opened:
        connection.close()


def session() -> Session:
    """A run of the CLI: its own Transport (its own logins) to each node."""
    return Session(Inventory(Path("inv.yml"), "lab", HOSTS, {}), {h.name: Transport(h) for h in HOSTS})


def test_a_held_lock_outlives_its_transports_reconnect_and_close_and_goes_with_its_release(nodes):
    transport = Transport(HOSTS[0])
    assert transport.run(Command("true")).ok  # the run's own connection, opened first
    answer, handle = transport.hold(Command("flock -n 9", stdin="`sparkcluster up` (pid 1)\n"))
    assert answer == "locked"
    transport.reconnect()  # failed before: the lock's channel was on the connection this closes
    transport.close()
    assert nodes["spark-1"].holder is not None and not nodes["spark-1"].holder.closed
    handle.release()
    assert nodes["spark-1"].holder.closed  # let go at once: the next run takes it


def test_a_second_up_is_refused_during_the_first_ones_ray_phase(nodes, monkeypatch):
    """The Ray phase of `up` (after its stop of every node) tries a second serve's lock: refused on every node,
    naming the first; once the first is done, the lock is free."""
    refused: list[Busy] = []

    def ray_starts(session_: Session, commands: object, what: str, fix: str) -> None:
        try:
            with one_at_a_time(session()):
                pass
        except Busy as e:
            refused.append(e)

    monkeypatch.setattr(phases, "read_nodes", lambda s, tp=0: {
        h.name: Node(h.name, i, f"10.1.0.{i + 1}", "10.1.0.1") for i, h in enumerate(HOSTS)})
    monkeypatch.setattr(phases, "ray_commands", lambda s, runtime, n, env: {})
    monkeypatch.setattr(phases, "_recorded_fingerprint", lambda s: None)
    monkeypatch.setattr(phases, "ray_fingerprint", lambda s, commands, mods: "f")
    monkeypatch.setattr(phases, "start", ray_starts)
    monkeypatch.setattr(phases, "wait_ray", lambda s, runtime, n, timeout: [])
    monkeypatch.setattr(phases, "write_record", lambda s, record: None)
    first = session()
    with one_at_a_time(first):
        _, _, _, reused = up(first, ServeOptions(runtime="host"), Phases(), ignore)
        assert not reused and all(t._connection is not None for t in first.transports.values())  # it reconnected
    assert len(refused) == 1, "a second serve took the lock during the first one's Ray phase"
    assert refused[0].message.startswith("spark-1: a serve or up of this cluster is already running there: `")
    with one_at_a_time(session()):  # the first is done: free again
        pass

