"""Where a piece of the monitoring runs: a node over the session's connection, or this machine (`--here`). Both
run a shell line from the login user's home and write a file atomically with its mode, so what runs Prometheus
or an exporter is one script either way."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..engine.command import Command
from ..engine.transport import Transport


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.code == 0


class Place(Protocol):
    name: str  # the inventory name, or "this machine"

    def run(self, script: str, timeout: float = 60) -> Ran: ...

    def write(self, path: str, data: bytes, mode: int) -> None:
        """`path` relative to the home folder, its folder existing."""


@dataclass
class NodePlace:
    name: str
    transport: Transport
    home: str = ""

    def run(self, script: str, timeout: float = 60) -> Ran:
        result = self.transport.run(Command(script, timeout=timeout))
        return Ran(result.exit_code, result.stdout, result.stderr)

    def write(self, path: str, data: bytes, mode: int) -> None:
        if not self.home:
            self.home = self.run("printf %s \"$HOME\"").stdout.strip()
        self.transport.write_file_atomic(f"{self.home}/{path}", data, mode)


@dataclass
class LocalPlace:
    name: str = "this machine"

    def run(self, script: str, timeout: float = 60) -> Ran:
        try:
            done = subprocess.run(["sh", "-c", script], cwd=Path.home(), capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return Ran(-1, "", f"timed out after {timeout:g} s")
        return Ran(done.returncode, done.stdout, done.stderr)

    def write(self, path: str, data: bytes, mode: int) -> None:
        target = Path.home() / path
        tmp = target.with_name(f".{target.name}.{os.urandom(4).hex()}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.replace(target)
