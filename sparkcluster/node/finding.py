"""What the doctor says about a node or the nodes together: a check, its severity, the words, the fix and, for
platform knowledge, where the fix was reported. Pure values, shared by parity, the known-bad table and the kernel log."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Severity(enum.Enum):
    OK = "ok"
    INFO = "info"  # worth knowing, with a fix, but nothing wrong: doctor still passes (a journal kept in memory only)
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    group: str  # "preflight", "parity", "known issues", "kernel log"
    check: str
    severity: Severity
    summary: str
    fix: str = ""
    nodes: tuple[str, ...] = ()  # the nodes named (those that differ, or carry the bad value)
    values: dict[str, str] = field(default_factory=dict)  # node -> its value, where comparing says something
    source: str = ""  # where owners reported the problem and the fix that worked (threads), for platform knowledge
