"""What the runner reports while it works. The runner emits these and never prints (DESIGN.md §2)."""

from __future__ import annotations

from dataclasses import dataclass, field

STATUSES = ("ok", "changed", "skipped", "failed", "unreachable")


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
    status: str  # one of STATUSES
    reason: str
    duration: float
    commands: tuple[str, ...] = ()  # what was (or, in check mode, would be) run
    diff: str | None = None
    failure: Failure | None = None
    warnings: tuple[str, ...] = ()


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
