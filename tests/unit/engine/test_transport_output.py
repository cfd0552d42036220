"""Transport.run reads a command's output to its end: sshd may send the exit status before the last of the
output (a real sim host lost the last line of `printf ...; id -u; id -g` once in 2,000 runs, and bootstrap failed
on it), so the EOF after all the data ends the read, not the exit status. A background child that holds the output
open delays the answer by a bounded grace only. A scripted channel sets each message's arrival exactly."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from sparkcluster.engine import transport
from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.transport import Transport


@dataclass
class ScriptedChannel:
    """A paramiko channel whose messages arrive on a schedule of polls: (poll, kind, payload), kind one of
    stdout, stderr, exit, eof. A poll is one call of recv_ready, as Transport's loop makes once per turn."""
    script: list[tuple[int, str, object]]
    polls: int = 0
    stdout: list[bytes] = field(default_factory=list)
    stderr: list[bytes] = field(default_factory=list)
    exit_code: int | None = None
    eof_received: bool = False
    closed: bool = False

    def _arrive(self) -> None:
        for when, kind, payload in [m for m in self.script if m[0] <= self.polls]:
            self.script.remove((when, kind, payload))
            if kind == "stdout":
                self.stdout.append(payload)  # type: ignore[arg-type]
            elif kind == "stderr":
                self.stderr.append(payload)  # type: ignore[arg-type]
            elif kind == "exit":
                self.exit_code = payload  # type: ignore[assignment]
            else:
                self.eof_received = True

    def recv_ready(self) -> bool:
        self.polls += 1
        self._arrive()
        return bool(self.stdout)

    def recv(self, _n: int) -> bytes:
        return self.stdout.pop(0)

    def recv_stderr_ready(self) -> bool:
        return bool(self.stderr)

    def recv_stderr(self, _n: int) -> bytes:
        return self.stderr.pop(0)

    def exit_status_ready(self) -> bool:
        return self.exit_code is not None

    def recv_exit_status(self) -> int:
        assert self.exit_code is not None
        return self.exit_code

    def settimeout(self, _s: float) -> None: ...
    def exec_command(self, _line: str) -> None: ...
    def sendall(self, _data: bytes) -> None: ...
    def shutdown_write(self) -> None: ...

    def close(self) -> None:
        self.closed = True


@dataclass
class ScriptedConnection:
    channel: ScriptedChannel

    @property
    def transport(self) -> ScriptedConnection:
        return self

    def open_session(self) -> ScriptedChannel:
        return self.channel

    is_connected = True


def run(script: list[tuple[int, str, object]], monkeypatch: pytest.MonkeyPatch) -> transport.Result:
    t = Transport(Host("spark-1", "10.0.0.1", "head"))
    monkeypatch.setattr(t, "_connect", lambda: ScriptedConnection(ScriptedChannel(script)))
    return t.run(Command("printf '%s\\n' /home/spark/.cache/huggingface; id -u; id -g"))


def test_output_after_the_exit_status_is_read_to_the_eof(monkeypatch):
    result = run([(1, "stdout", b"/home/spark/.cache/huggingface\n1500\n"), (1, "exit", 0),
                  (4, "stderr", b"late warning\n"), (6, "stdout", b"1500\n"), (9, "eof", None)], monkeypatch)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "/home/spark/.cache/huggingface\n1500\n1500\n",
                                                                "late warning\n")


def test_a_child_holding_the_output_open_delays_the_answer_by_the_grace_only(monkeypatch):
    monkeypatch.setattr(transport, "EOF_AFTER_EXIT_S", 0.2)
    start = time.monotonic()
    result = run([(1, "stdout", b"started\n"), (2, "exit", 0)], monkeypatch)  # no EOF ever
    assert (result.exit_code, result.stdout) == (0, "started\n")
    assert 0.2 <= time.monotonic() - start < 5


def test_an_eof_with_the_exit_status_ends_at_once(monkeypatch):
    monkeypatch.setattr(transport, "EOF_AFTER_EXIT_S", 30.0)
    start = time.monotonic()
    result = run([(1, "stdout", b"a\n"), (1, "eof", None), (1, "exit", 3)], monkeypatch)
    assert (result.exit_code, result.stdout) == (3, "a\n")
    assert time.monotonic() - start < 5
