"""Errors that reach the user: what is wrong and how to fix it, with the exit code (2: bad input, refused
before any connection; 1: a host failed or was unreachable; 130: interrupted)."""

from __future__ import annotations

from collections.abc import Iterable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: `sparkcluster --help` imports this module
if TYPE_CHECKING:
    from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1  # some host failed or was unreachable
EXIT_USAGE = 2  # invalid input or a missing prerequisite, found before anything changed
EXIT_INTERRUPTED = 130


class SparkclusterError(Exception):
    """An error with a fix. Raised for problems found before or while changing things; never a traceback."""

    def __init__(self, message: str, fix: str = "", exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class UsageError(SparkclusterError):
    """Bad input or a missing prerequisite: nothing was changed (exit 2)."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message, fix, exit_code=EXIT_USAGE)


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """` (did you mean 'hosts'?)` for the closest choice, or "" when none is close."""
    import difflib  # only with a typo to explain

    match = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
