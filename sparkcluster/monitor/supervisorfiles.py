"""The supervisor's files on the head, read for the exporter, with the supervisor's own typed shapes
(serving/incidents.py: state.json's SupervisorState, events.jsonl's Incident, their vocabularies as enums), bounded:
events.jsonl's last MAX_EVENT_BYTES only, each line at most MAX_LINE_BYTES.

Only the closed vocabularies become labels (state, seen, action, outcome), and a target only where it is `vLLM`,
`replica N` or a host name; free text (reason, root_cause, text) never leaves the node this way: it may quote a log
line, and a log line may hold a key. A line that is not an incident, or names another target, is skipped and
counted, never guessed at.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..serving.incidents import EVENTS_FILE, STATE_FILE, SUPERVISOR_DIR, Incident, SupervisorState, parse_state

__all__ = ["SUPERVISOR_DIR", "SupervisorFiles", "epoch_seconds", "read"]
TARGET = re.compile(r"vLLM|replica \d{1,3}|[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # the engine, a replica, a node
MAX_EVENT_BYTES = 4 << 20  # weeks of incidents, read per scrape
MAX_LINE_BYTES = 16 << 10


@dataclass(frozen=True)
class SupervisorFiles:
    state: SupervisorState | None = None  # None: no state file, or not one the supervisor wrote
    incidents: tuple[Incident, ...] = ()
    skipped_lines: int = 0
    events_present: bool = False


def epoch_seconds(text: Any) -> float | None:
    """An ISO-8601 time (`Z` or an offset) as epoch seconds; None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_incident(line: str) -> Incident | None:
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        incident = Incident.from_json(json.loads(line))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return incident if TARGET.fullmatch(incident.target) else None


def _tail(path: Path) -> list[str] | None:
    """The file's last MAX_EVENT_BYTES, whole lines only; None where there is no such file."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - MAX_EVENT_BYTES))
            data = f.read(MAX_EVENT_BYTES)
    except OSError:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if size > MAX_EVENT_BYTES else lines


def read(home: Path) -> SupervisorFiles:
    """The supervisor's files under `home` (the login user's), as far as they exist."""
    try:
        state_text: str | None = (home / STATE_FILE).read_text(errors="replace")[:MAX_LINE_BYTES]
    except OSError:
        state_text = None
    lines = _tail(home / EVENTS_FILE)
    incidents = [parse_incident(line) for line in lines or () if line.strip()]
    return SupervisorFiles(parse_state(state_text), tuple(i for i in incidents if i is not None),
                           sum(i is None for i in incidents), lines is not None)
