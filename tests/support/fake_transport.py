"""A scripted fake transport for the runner's tests: each command answered from a table, every command kept in order."""

from __future__ import annotations

import re
from pathlib import Path

from sparkcluster.engine.command import Command
from sparkcluster.engine.facts import PROBE_SCRIPT
from sparkcluster.engine.transport import Result, Unreachable

PROBE_OUTPUT = (Path(__file__).parents[1] / "fixtures" / "probe-spark.txt")


class FakeTransport:
    """Answers commands from a script of (regex, exit code, stdout, stderr); keeps files in a dict."""

    def __init__(self, name: str, script: list[tuple[str, int, str, str]], unreachable: bool = False) -> None:
        self.name = name
        self.script = script
        self.unreachable = unreachable
        self.files: dict[str, bytes] = {}
        self.ran: list[str] = []
        self.closed = False

    def run(self, command: Command) -> Result:
        if self.unreachable:
            raise Unreachable(f"cannot connect to {self.name}", "power it on")
        self.ran.append(command.script)
        if command.script == PROBE_SCRIPT:
            return Result(command, 0, PROBE_OUTPUT.read_text(), "", 0.01)
        for pattern, code, out, err in self.script:
            if re.search(pattern, command.script):
                return Result(command, code, out, err, 0.01)
        return Result(command, 0, "", "", 0.01)

    def close(self) -> None:
        self.closed = True
