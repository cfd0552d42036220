"""Why a vLLM failed to start, read from its logs: the first exception and its message (the engine core's, a
worker's that Ray forwards, the API server's), or vLLM's own usage error, rather than the last lines of the log,
which are the end of the last traceback and name only the consequence ("Engine core initialization failed. See
root cause above."). Python prints a chain's cause first, and a failed process fails the others after it, so the
earliest exception is the root cause; across several logs (one per node) the earliest by vLLM's timestamps.
Pure functions over lines: tests read real captures (tests/fixtures/vllm/)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# What vLLM and Ray put before a process's line: `(EngineCore pid=20873) `, `(RayWorkerProc pid=9, ip=10.0.0.2) `.
PROCESS_PREFIX = re.compile(r"^\((?P<process>[A-Za-z_][\w.-]*)(?: pid=\d+)?(?:, ip=[^)]*)?\) ")
# vLLM's logger: `ERROR 11-27 16:25:18 [core.py:1510] `.
LOGGER_PREFIX = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<at>\d\d-\d\d \d\d:\d\d:\d\d)"
                           r"(?:\.\d+)? \[[^\]]*\] ")
# argparse's refusal, which exits without a traceback: `vllm: error: unrecognized arguments: --no-such-flag 3`.
USAGE_ERROR = re.compile(r"^[\w.-]+: error: \S")
TRACEBACK = "Traceback (most recent call last):"
MESSAGE_LINES = 4  # an exception's message may go on in indented lines (pydantic's does); no more than this
MAX_CHARS = 1200


@dataclass(frozen=True)
class StartError:
    """The first error of one log: the exception line and its message, and which process printed it."""

    text: str  # `ValueError: current platform cpu does not support ray.`
    process: str = ""  # the process vLLM's prefix names (`EngineCore`), "" where the line has none
    at: str | None = None  # the time of the last timestamped line before it (`11-27 16:25:18`), where known
    logged_only: bool = False  # no exception nor usage error: the log's first ERROR line stands in


@dataclass(frozen=True)
class _Line:
    process: str
    body: str  # the line without its process and logger prefixes
    level: str
    at: str | None


def _parse(lines: Iterable[str]) -> list[_Line]:
    parsed, at = [], None
    for raw in lines:
        line = raw.rstrip("\n")
        prefix = PROCESS_PREFIX.match(line)
        process = prefix["process"] if prefix else ""
        body = line[prefix.end():] if prefix else line
        logger = LOGGER_PREFIX.match(body)
        if logger:
            at, body = logger["at"], body[logger.end():]
        parsed.append(_Line(process, body, logger["level"] if logger else "", at))
    return parsed


def first_error(lines: Iterable[str]) -> StartError | None:
    """The log's first exception (the line that ends a traceback's frames, with the indented lines of its message)
    or usage error; failing both, its first ERROR line; None for a log that shows no error."""
    parsed = _parse(lines)
    in_traceback: set[str] = set()  # processes whose traceback frames are being read (their lines interleave)
    for i, line in enumerate(parsed):
        if line.body.startswith(TRACEBACK):
            in_traceback.add(line.process)
        elif line.process in in_traceback and line.body and not line.body[0].isspace():
            return StartError(_with_message(parsed, i), line.process, line.at)
        elif USAGE_ERROR.match(line.body):
            return StartError(line.body.strip(), line.process, line.at)
    logged = next((line for line in parsed if line.level in ("ERROR", "CRITICAL") and line.body.strip()), None)
    return StartError(logged.body.strip(), logged.process, logged.at, logged_only=True) if logged else None


def _with_message(parsed: Sequence[_Line], i: int) -> str:
    """The exception line at `i` and the indented lines of its process that carry on its message."""
    words = [parsed[i].body.strip()]
    for line in parsed[i + 1:i + 1 + MESSAGE_LINES]:
        if line.process != parsed[i].process or not line.body[:1].isspace():
            break
        if not line.body.strip().startswith("For further information visit"):  # pydantic's link to its docs
            words.append(line.body.strip())
    text = " ".join(words)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + " ..."


@dataclass(frozen=True)
class LogRead:
    """One log read for a diagnosis: the node, which of its logs (in words) and its lines."""

    node: str
    log: str  # `vLLM log`, `Ray log`
    lines: tuple[str, ...]


@dataclass(frozen=True)
class RootCause:
    error: StartError
    node: str
    log: str

    def describe(self) -> str:
        process = f", {self.error.process}" if self.error.process else ""
        return f"{self.error.text} ({self.node}'s {self.log}{process})"


def root_cause(logs: Sequence[LogRead]) -> RootCause | None:
    """The earliest first error among the logs, by vLLM's timestamps (where those are unknown, the first log's); an
    exception before any log's mere ERROR line."""
    found = [(log, error) for log in logs if (error := first_error(log.lines)) is not None]
    if not found:
        return None
    log, error = min(found, key=lambda pair: (pair[1].logged_only, pair[1].at is None, pair[1].at or ""))
    return RootCause(error, log.node, log.log)
