"""The one scripted fake transport of the tests, typed: each command answered from a script of (regex, exit code,
stdout, stderr), else one default answer; every command kept in order; files kept in a dict. It satisfies
`Transporting`, the part of the real Transport (sparkcluster/engine/transport.py) that steps, the runner and the
commands call on a host's transport, with the same signatures (tests/unit/engine/test_fake_transport.py holds
that, for both). Where a test wants every command it does not expect to fail it, StrictTransport
(strict_transport.py) is the stricter fake."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from sparkcluster.engine.command import Command
from sparkcluster.engine.facts import PROBE_SCRIPT
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.transport import Result, Unreachable

PROBE_OUTPUT = (Path(__file__).parents[1] / "fixtures" / "probe-spark.txt")
Answer = tuple[int, str, str]  # exit code, stdout, stderr
Script = Sequence[tuple[str, int, str, str]]  # regex searched in the command's script, then its answer


@runtime_checkable
class Transporting(Protocol):
    """A host's transport as the engine and the commands use it."""

    host: Host

    def run(self, command: Command) -> Result: ...

    def read_file(self, path: str) -> bytes | None: ...

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None: ...

    def host_key(self) -> tuple[str, str]: ...

    def reconnect(self) -> None: ...

    def close(self) -> None: ...


class FakeTransport:
    """Answers the facts probe with a Spark's (fixtures/probe-spark.txt), a command its script matches with that
    answer, any other with `answer`; `unreachable`: every command raises Unreachable, as a host that is off."""

    def __init__(self, name: str = "spark-1", script: Script = (), *, unreachable: bool = False,
                 answer: Answer = (0, "", ""), address: str = "10.0.0.1") -> None:
        self.host = Host(name, address, role="head" if name == "spark-1" else "worker")
        self.name = name
        self.script = list(script)
        self.answer = answer
        self.unreachable = unreachable
        self.files: dict[str, bytes] = {}
        self.commands: list[Command] = []
        self.ran: list[str] = []  # each command's script, in order
        self.closed = False
        self.reconnects = 0

    def run(self, command: Command) -> Result:
        if self.unreachable:
            raise Unreachable(f"cannot connect to {self.name}", "power it on")
        self.commands.append(command)
        self.ran.append(command.script)
        if command.script == PROBE_SCRIPT:
            return Result(command, 0, PROBE_OUTPUT.read_text(), "", 0.01)
        code, out, err = next(((code, out, err) for pattern, code, out, err in self.script
                               if re.search(pattern, command.script)), self.answer)
        return Result(command, code, out, err, 0.01)

    def read_file(self, path: str) -> bytes | None:
        return self.files.get(path)

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None:
        self.files[path] = content

    def host_key(self) -> tuple[str, str]:
        return "ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIFakeTransportHostKey"

    def reconnect(self) -> None:
        self.reconnects += 1

    def close(self) -> None:
        self.closed = True
