"""A strict fake Transport: every command a test does not expect fails it, naming the command.

It has the interface steps and the runner use (fake_transport.Transporting: host, run, read_file, write_file_atomic,
reconnect, host_key, close).
Expectations match the exact shell line (`Command.line()`, sudo wrapper and exports included) or a regex over it,
answer with an exit code, stdout and stderr, and are used up once each (unless `times=None`). A test asserts that
every expectation ran with `verify()`. It stands in for the node's shell where the engine's own protocols meet it:
a batch (engine/batch.py) runs its commands one by one through run(), framed as the real script frames them, and
the file commands of engine/steps/files.py read and write `files`, unless an expectation matches them first.

An unexpected command raises AssertionError in the calling thread and is also recorded, because the runner
turns any exception inside a step into that step's failure: `verify()` re-raises it there, so a strict
transport driven by the runner still fails the test.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkcluster.engine.batch import Batch
from sparkcluster.engine.command import Command
from sparkcluster.engine.facts import PROBE
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.steps.files import FileRead, FileWrite
from sparkcluster.engine.transport import Result, Unreachable, remote_path

DEFAULT_HOST_KEY = ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIStrictFakeHostKey")


@dataclass
class Expectation:
    match: str | re.Pattern[str]  # str: the exact Command.line(); Pattern: searched in it
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    times: int | None = 1  # None: any number of times (at least once for verify())
    unreachable: bool = False  # raise Unreachable, as a host dropping off mid-command does
    before: Callable[[Command], None] | None = None  # runs before the answer (to block, interrupt, ...)
    stdin: str | None = None  # when set, the command must also send exactly this on stdin
    used: int = field(default=0, init=False)

    def matches(self, command: Command, line: str) -> bool:
        if self.stdin is not None and command.stdin != self.stdin:
            return False
        if isinstance(self.match, re.Pattern):
            return self.match.search(line) is not None
        return self.match == line

    @property
    def available(self) -> bool:
        return self.times is None or self.used < self.times

    def describe(self) -> str:
        shown = f"re:{self.match.pattern!r}" if isinstance(self.match, re.Pattern) else repr(self.match)
        return shown if self.stdin is None else f"{shown} with stdin {self.stdin!r}"


@dataclass
class RemoteFile:
    content: bytes
    mode: int  # permission bits, e.g. 0o644
    readable: bool = True


class StrictTransport:
    """A host's connection in a test. `files` are keyed by the path the steps give SFTP (`~/x` arrives as `x`)."""

    def __init__(self, name: str = "spark-1", *, ordered: bool = False,
                 host_key: tuple[str, str] = DEFAULT_HOST_KEY) -> None:
        self.name = name
        self.host = Host(name, "10.0.0.1", role="head" if name == "spark-1" else "worker")  # as the real one's
        self.ordered = ordered  # expectations must run in the order they were given
        self._host_key = host_key
        self.expectations: list[Expectation] = []
        self.files: dict[str, RemoteFile] = {}
        self.ran: list[Command] = []  # every command that ran, expected or not, in order
        self.writes: list[tuple[str, bytes, int]] = []  # (path, content, mode) of each write_file_atomic
        self.reads: list[str] = []
        self.unexpected: list[str] = []  # the display() of each command nobody expected
        self.reconnects = 0
        self.closed = threading.Event()
        self._lock = threading.RLock()

    # ---- what the test says -------------------------------------------------------------------------
    def expect(self, match: str | re.Pattern[str], *, exit_code: int = 0, stdout: str = "", stderr: str = "",
               timed_out: bool = False, times: int | None = 1, unreachable: bool = False,
               before: Callable[[Command], None] | None = None, stdin: str | None = None) -> StrictTransport:
        self.expectations.append(Expectation(match, exit_code, stdout, stderr, timed_out, times, unreachable, before,
                                             stdin))
        return self

    def expect_command(self, command: Command, **answer: object) -> StrictTransport:
        """Expect exactly this Command's shell line."""
        return self.expect(command.line(), **answer)  # type: ignore[arg-type]

    def expect_probe(self, text: str) -> StrictTransport:
        """The facts probe (one round trip) answering with `text`."""
        return self.expect(PROBE.line(), stdout=text)

    def put_file(self, path: str, content: str | bytes, mode: int = 0o644, *, readable: bool = True) -> StrictTransport:
        data = content.encode() if isinstance(content, str) else content
        self.files[path] = RemoteFile(data, mode, readable)
        return self

    # ---- what the test checks -----------------------------------------------------------------------
    def lines(self) -> list[str]:
        return [c.line() for c in self.ran]

    def pending(self) -> list[str]:
        return [e.describe() for e in self.expectations if (e.used == 0 if e.times is None else e.used < e.times)]

    def verify(self) -> None:
        """Fail unless every expectation ran (as often as it said) and nothing unexpected ran."""
        with self._lock:
            if self.unexpected:
                raise AssertionError(f"{self.name}: unexpected command(s): {self.unexpected}")
            pending = self.pending()
            if pending:
                raise AssertionError(f"{self.name}: expected command(s) that never ran: {pending}; "
                                     f"what ran: {[c.display() for c in self.ran]}")

    # ---- the Transport interface --------------------------------------------------------------------
    def run(self, command: Command) -> Result:
        line = command.line()
        with self._lock:
            self.ran.append(command)
            candidates = [e for e in self.expectations if e.available]
            if self.ordered:
                candidates = candidates[:1]
            found = next((e for e in candidates if e.matches(command, line)), None)
            if found is None and isinstance(command, Batch):
                return self._batch(command)
            if found is None and isinstance(command, (FileRead, FileWrite)):
                return self._file_command(command)
            if found is None:
                self.unexpected.append(command.display())
                waiting = [e.describe() for e in candidates]
                raise AssertionError(f"{self.name}: unexpected command `{command.display()}`\n  line: {line!r}\n"
                                     f"  still expected: {waiting}")
            found.used += 1
        if found.before is not None:
            found.before(command)
        if found.unreachable:
            raise Unreachable(f"{self.name} dropped off while running `{command.display()}`", "power it on",
                              host=self.name)  # as the real Transport names its host
        return Result(command, found.exit_code, found.stdout, found.stderr, 0.0, found.timed_out)

    def _batch(self, batch: Batch) -> Result:
        """What the batch's script prints, each command answered as if it ran alone (run() records it)."""
        text, code = "", 0
        for i, part in enumerate(batch.parts):
            result = self.run(part)
            code = -1 if result.timed_out else result.exit_code
            text += f"\n{batch.marker} {i} out\n{result.stdout}\n{batch.marker} {i} err {code}\n{result.stderr}"
            if i < batch.changes and code != 0:
                break
        return Result(batch, 0, text + f"\n{batch.marker} end\n", "", 0.0)

    def _file_command(self, command: FileRead | FileWrite) -> Result:
        path = remote_path(command.path)
        if isinstance(command, FileWrite):
            self.write_file_atomic(path, (command.stdin or "").encode(), int(command.mode, 8))
            return Result(command, 0, "", "", 0.0)
        with self._lock:
            self.reads.append(path)
            remote = self.files.get(path)
        if remote is None:
            return Result(command, 0, "@missing\n", "", 0.0)
        if not remote.readable:
            return Result(command, 0, "@unreadable\n", "", 0.0)
        return Result(command, 0, f"{remote.mode:o}\n{base64.b64encode(remote.content).decode()}\n", "", 0.0)

    def read_file(self, path: str) -> bytes | None:
        with self._lock:
            self.reads.append(path)
            remote = self.files.get(path)
        if remote is None:
            return None
        if not remote.readable:
            raise PermissionError(13, "Permission denied", path)
        return remote.content

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None:
        with self._lock:
            self.writes.append((path, content, mode))
            self.files[path] = RemoteFile(content, mode)

    def host_key(self) -> tuple[str, str]:
        return self._host_key

    def reconnect(self) -> None:
        with self._lock:
            self.reconnects += 1

    def close(self) -> None:
        self.closed.set()


def verify_all(transports: dict[str, StrictTransport] | list[StrictTransport]) -> None:
    for t in (transports.values() if isinstance(transports, dict) else transports):
        t.verify()
