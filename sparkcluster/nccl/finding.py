"""What a verdict is: its status, its cause and fix, and the findings it is chosen from (verdict.py gathers them,
ringverdict.py adds what rings and switches print)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class VerdictStatus(StrEnum):
    PASS = "PASS"
    WARN = "WARN"  # works, but not as a Spark pair should (one twin, intra-node only, bandwidth unknown)
    FAIL = "FAIL"  # a fallback (socket, management network), or the log cannot prove the transport


@dataclass(frozen=True)
class Verdict:
    status: VerdictStatus
    cause: str
    fix: str
    details: tuple[str, ...]
    transports: tuple[str, ...]  # inter-node transports seen
    intra_node_only: bool


@dataclass(frozen=True)
class Finding:
    status: VerdictStatus
    cause: str
    fix: str
