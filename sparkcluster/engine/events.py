"""What the runner reports while it works. The runner emits these and never prints: how they
look (a live table, plain lines, --json) is the reporter's business (report.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .steps.base import Upload


class Status(StrEnum):
    """Ansible's words exactly; a StrEnum, so JSON output and greppable lines print the same words."""

    OK = "ok"
    CHANGED = "changed"
    SKIPPED = "skipped"
    FAILED = "failed"
    UNREACHABLE = "unreachable"

    @property
    def stops_host(self) -> bool:
        """The host takes no further steps in this run."""
        return self in (Status.FAILED, Status.UNREACHABLE)


@dataclass(frozen=True)
class Failure:
    message: str
    fix: str = ""
    command: str = ""  # as displayed (secrets masked)
    exit_code: int | None = None
    stderr_tail: str = ""


@dataclass(frozen=True)
class RunStarted:
    playbook: str
    hosts: tuple[str, ...]
    check: bool


@dataclass(frozen=True)
class PlayStarted:
    play: str
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class StepStarted:
    host: str
    play: str
    step: str


@dataclass(frozen=True)
class StepFinished:
    host: str
    play: str
    step: str
    status: Status
    reason: str
    duration: float
    commands: tuple[str, ...] = ()  # the shell lines that were (in check mode: would be) run, as displayed
    diff: str | None = None
    failure: Failure | None = None
    warnings: tuple[str, ...] = ()
    uploads: tuple[Upload, ...] = ()  # files written (would be written) whole, by write_file
    notes: tuple[str, ...] = ()  # what was (would be) done otherwise, in words: never among `commands`


@dataclass(frozen=True)
class PlayFinished:
    play: str
    stopped_run: bool = False  # a require: all play with a failed host


@dataclass
class HostRecap:
    ok: int = 0
    changed: int = 0
    skipped: int = 0
    failed: int = 0
    unreachable: int = 0

    def count(self, status: Status) -> int:
        return {Status.OK: self.ok, Status.CHANGED: self.changed, Status.SKIPPED: self.skipped,
                Status.FAILED: self.failed, Status.UNREACHABLE: self.unreachable}[status]

    def add(self, status: Status) -> None:
        match status:
            case Status.OK:
                self.ok += 1
            case Status.CHANGED:
                self.changed += 1
            case Status.SKIPPED:
                self.skipped += 1
            case Status.FAILED:
                self.failed += 1
            case Status.UNREACHABLE:
                self.unreachable += 1


@dataclass(frozen=True)
class RunFinished:
    recap: dict[str, HostRecap]
    interrupted: bool = False
    stopped_by: str | None = None  # the play whose `require: all` stopped the run
    duration: float = 0.0
    failures: dict[str, Failure] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        return 1 if any(r.failed or r.unreachable for r in self.recap.values()) else 0


Event = RunStarted | PlayStarted | StepStarted | StepFinished | PlayFinished | RunFinished
