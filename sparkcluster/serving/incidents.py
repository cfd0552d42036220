"""What the supervisor on the head tells: its state (state.json) and its incidents (events.jsonl, one JSON object a
line), typed. Written by the supervisor (supervise/), read by `status`, `events` and the metrics exporter, so the
shapes live here, below all of them. Both files sit in the supervisor's private folder on the head."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

SUPERVISOR_DIR = ".config/sparkcluster/supervisor"  # on the head, relative to the login user's home; mode 0700
STATE_FILE = f"{SUPERVISOR_DIR}/state.json"
EVENTS_FILE = f"{SUPERVISOR_DIR}/events.jsonl"
FORMAT_VERSION = 1


class WatchState(StrEnum):
    LOADING = "loading"  # the serve is starting (or restarting): nothing is judged yet
    WATCHING = "watching"
    RECOVERING = "recovering"
    DEGRADED = "degraded"  # serving on fewer nodes than asked, until the lost ones are back
    GAVE_UP = "gave-up"  # the circuit breaker opened: it acts no more, and says why
    OFF = "off"


class Seen(StrEnum):
    ENGINE_DEAD = "engine-dead"  # a rank's process (or the router) is not running
    WEDGED = "wedged"  # alive and /health 200, but no token comes (the probe, or no progress while requests run)
    UNHEALTHY = "unhealthy"  # /health answers other than 200, or not at all
    PROBE_FAILED = "probe-failed"  # the one-token completion failed (not 401/403)
    NODE_DOWN = "node-down"  # a node does not answer over SSH
    NODE_BACK = "node-back"  # a lost node answers again
    UNAUTHORIZED = "unauthorized"  # the probe's key was refused: configuration, never a reason to restart


class Action(StrEnum):
    RESTART = "restart"  # every rank down, then the layout served again from the serve record
    RESTART_REPLICA = "restart-replica"  # one replica alone; the router keeps serving the others
    DEGRADE = "degrade"  # the largest layout that fits on the nodes left
    RESTORE = "restore"  # back to the full layout
    NONE = "none"
    GAVE_UP = "gave-up"


class Outcome(StrEnum):
    RECOVERED = "recovered"
    FAILED = "failed"
    GAVE_UP = "gave-up"
    REPORTED = "reported"  # told, nothing done (a configuration error, or the router already serves around it)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Incident:
    """One fault and what was done about it. detected_s: from the first failed check to the decision to act (the
    misses in a row); recovered_s: from that decision until the serve answered again (None: it did not)."""

    at: str
    target: str  # "vLLM", "replica 2", "spark-2"
    seen: Seen
    action: Action
    outcome: Outcome
    detected_s: float | None = None
    recovered_s: float | None = None
    root_cause: str | None = None
    text: str = ""
    version: int = FORMAT_VERSION
    phases: dict[str, float] | None = None  # what the recovery was made of: its serve's phases, in seconds

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, StrEnum) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Incident:
        return cls(at=str(doc["at"]), target=str(doc["target"]), seen=Seen(doc["seen"]), action=Action(doc["action"]),
                   outcome=Outcome(doc["outcome"]), detected_s=_number(doc.get("detected_s")),
                   recovered_s=_number(doc.get("recovered_s")), root_cause=doc.get("root_cause"),
                   text=str(doc.get("text", "")), version=int(doc.get("version", FORMAT_VERSION)),
                   phases=_phases(doc.get("phases")))

    def line(self) -> str:
        """One line for a person: when, what, what was done, how long."""
        took = [f"detected in {self.detected_s:.0f} s" if self.detected_s is not None else "",
                f"answering again after {self.recovered_s:.0f} s" if self.recovered_s is not None else ""]
        times = ", ".join(t for t in took if t)
        return f"{self.at} {self.target}: {self.text}" + (f" ({times})" if times else "")


@dataclass(frozen=True)
class SupervisorState:
    state: WatchState
    since: str
    restarts_last_hour: int = 0
    reason: str | None = None  # why it is degraded or gave up
    version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "state": str(self.state), "since": self.since,
                "restarts_last_hour": self.restarts_last_hour, "reason": self.reason}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SupervisorState:
        return cls(WatchState(doc["state"]), str(doc["since"]), int(doc.get("restarts_last_hour", 0)),
                   doc.get("reason"), int(doc.get("version", FORMAT_VERSION)))


def parse_events(text: str) -> list[Incident]:
    """The incidents of an events.jsonl, oldest first; a line that is not one (a torn last line after a power cut)
    is skipped, never an error."""
    found = []
    for line in text.splitlines():
        try:
            found.append(Incident.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def parse_state(text: str | None) -> SupervisorState | None:
    if not text:
        return None
    try:
        return SupervisorState.from_json(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None


def _phases(value: object) -> dict[str, float] | None:
    if not isinstance(value, dict):
        return None
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
