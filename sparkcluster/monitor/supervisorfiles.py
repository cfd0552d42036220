"""The supervisor's files on the head, read for the exporter: its state (state.json) and its incidents
(events.jsonl, one JSON object a line), both version 1 as the supervisor writes them:

    state.json   {"version": 1, "state": "watching", "since": "<ISO UTC>", "restarts_last_hour": 0, "reason": null}
    events.jsonl {"version": 1, "at": "<ISO UTC>", "target": "replica 2", "seen": "wedged", "action": "restart",
                  "outcome": "recovered", "detected_s": 71.2, "recovered_s": 95.0, "root_cause": null, "text": "..."}

Only the closed vocabularies become labels (state, seen, action, outcome; a target is `vLLM` or `replica N`);
free text (reason, root_cause, text) never leaves the node this way: it may quote a log line, and a log line may
hold a key. A line that is not a version-1 incident is skipped and counted, never guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

SUPERVISOR_DIR = "~/.local/state/sparkcluster/supervisor"
STATES = ("watching", "loading", "recovering", "degraded", "gave-up", "off")
SEEN = ("engine-dead", "wedged", "unhealthy", "probe-failed", "node-down", "unauthorized")
ACTIONS = ("restart", "degrade", "restore", "none", "gave-up")
OUTCOMES = ("recovered", "failed", "gave-up", "reported")
TARGET = re.compile(r"vLLM|replica \d{1,3}")
MAX_EVENT_BYTES = 4 << 20  # the tail of events.jsonl read per scrape: weeks of incidents, bounded
MAX_LINE_BYTES = 16 << 10


@dataclass(frozen=True)
class SupervisorState:
    state: str  # one of STATES
    since_s: float | None  # epoch seconds
    restarts_last_hour: int | None


@dataclass(frozen=True)
class Incident:
    at_s: float | None
    target: str
    seen: str
    action: str
    outcome: str
    detected_s: float | None
    recovered_s: float | None


@dataclass(frozen=True)
class SupervisorFiles:
    state: SupervisorState | None = None  # None: no state file, or not one of ours
    incidents: tuple[Incident, ...] = ()
    skipped_lines: int = 0
    events_present: bool = False
    problems: tuple[str, ...] = field(default_factory=tuple)


def epoch_seconds(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def parse_state(text: str) -> SupervisorState | None:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("version") != 1 or doc.get("state") not in STATES:
        return None
    restarts = doc.get("restarts_last_hour")
    return SupervisorState(doc["state"], epoch_seconds(doc.get("since")),
                           restarts if isinstance(restarts, int) and not isinstance(restarts, bool) else None)


def parse_incident(line: str) -> Incident | None:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return None
    target = doc.get("target")
    if not (isinstance(target, str) and TARGET.fullmatch(target)) or doc.get("seen") not in SEEN \
            or doc.get("action") not in ACTIONS or doc.get("outcome") not in OUTCOMES:
        return None
    return Incident(epoch_seconds(doc.get("at")), target, doc["seen"], doc["action"], doc["outcome"],
                    _seconds(doc.get("detected_s")), _seconds(doc.get("recovered_s")))


def parse_events(lines: Iterable[str]) -> tuple[tuple[Incident, ...], int]:
    incidents, skipped = [], 0
    for line in lines:
        if not line.strip():
            continue
        incident = parse_incident(line) if len(line) <= MAX_LINE_BYTES else None
        if incident is None:
            skipped += 1
        else:
            incidents.append(incident)
    return tuple(incidents), skipped


def _tail(path: Path) -> list[str] | None:
    """events.jsonl's last MAX_EVENT_BYTES, whole lines only; None where there is no such file."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - MAX_EVENT_BYTES))
            data = f.read(MAX_EVENT_BYTES)
    except OSError:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if size > MAX_EVENT_BYTES else lines


def read(folder: Path) -> SupervisorFiles:
    """The supervisor's files in `folder` (SUPERVISOR_DIR expanded), as far as they exist."""
    try:
        state_text: str | None = (folder / "state.json").read_text(errors="replace")[:MAX_LINE_BYTES]
    except OSError:
        state_text = None
    state = parse_state(state_text) if state_text is not None else None
    problems = ("state.json is not a version-1 supervisor state",) if state_text is not None and state is None else ()
    lines = _tail(folder / "events.jsonl")
    incidents, skipped = parse_events(lines or [])
    return SupervisorFiles(state, incidents, skipped, lines is not None, problems)
