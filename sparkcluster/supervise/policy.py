"""The supervisor's judgement, with no I/O: what one round of checks saw (a `Check` per engine or replica), and
whether that calls for an action yet. The guards the field learned (keeping-it-serving.md, 1.3):
- a loading grace: an engine whose process runs but was never ready since it started is not judged until its start
  timeout ran out (a single-miss policy stopped a model that was still loading);
- `misses` failed checks in a row before any action (a busy engine missing one deadline was restarted 8 times a day);
- a 401 or 403 on the probe is a configuration error, reported, never a reason to restart (a probe without the key
  killed a healthy engine);
- backoff between restarts, and a circuit breaker: after `max_restarts` in an hour it acts no more and says why.
Time is given (`now`, monotonic seconds), so the tests walk a policy through hours in microseconds."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from ..serving.incidents import Seen

HOUR_S = 3600.0


@dataclass(frozen=True)
class Policy:
    interval_s: float = 15.0  # a round of checks: processes, nodes, /health, progress
    probe_every_s: float = 30.0  # the one-token completion
    probe_timeout_s: float = 20.0
    misses: int = 2  # failed checks in a row before an action
    stall_s: float = 60.0  # requests running and no token counted for this long: wedged
    node_grace_s: float = 60.0  # a node gone this long (misses in a row too) before a layout is served without it
    boot_grace_s: float = 180.0  # after the supervisor starts (the head booted): nodes slower to boot are awaited
    backoff_s: tuple[float, ...] = (0.0, 60.0, 300.0)  # before the 1st, 2nd, 3rd... restart, from the last one's end
    max_restarts: int = 3  # per hour, or failed in a row; one more fault after them opens the breaker
    start_timeout_s: float = 1800.0  # the serve's own readiness deadline: the loading grace ends there

    def worst_detection_s(self) -> float:
        """The longest a fault can go unnoticed: a probe hang needs `misses` probes, each waited for in full."""
        return self.misses * (self.probe_every_s + self.probe_timeout_s)


def policy_values(given: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    """The inventory's `supervise:` settings as Policy fields, and what was refused (an unknown name, a value of the
    wrong kind): refused settings keep their default, and are told, never a supervisor that cannot run a round."""
    defaults = Policy()
    values: dict[str, object] = {}
    refused: list[str] = []
    for name, value in given.items():
        default = getattr(defaults, name, None)
        if default is None or name == "start_timeout_s":
            refused.append(f"{name}: not a setting")
        elif isinstance(default, tuple):
            if (isinstance(value, list | tuple) and value
                    and all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in value)):
                values[name] = tuple(float(v) for v in value)
            else:
                refused.append(f"{name}: not a list of seconds")
        elif isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            values[name] = int(value) if isinstance(default, int) else float(value)
        else:
            refused.append(f"{name}: not a positive number")
    return values, refused


class ProbeResult(StrEnum):
    OK = "ok"  # a token came (judged by the usage's count, never the text: a reasoning model's may be empty)
    FAILED = "failed"  # an error status, or no token counted
    BUSY = "busy"  # 429 or 503: the engine sheds load; alive, not a fault
    TIMED_OUT = "timed-out"
    UNAUTHORIZED = "unauthorized"  # 401 or 403


@dataclass(frozen=True)
class Check:
    """One engine (or replica) as one round saw it."""

    target: str
    nodes_down: tuple[str, ...] = ()  # its nodes that did not answer over SSH
    processes_down: tuple[str, ...] = ()  # its nodes whose serving process is not running
    health: int = 200  # /health's status; 0: no answer
    probe: ProbeResult | None = None  # None: no probe this round
    stalled: bool = False  # requests running, no token counted for stall_s
    advancing: bool = False  # tokens were counted since the last round: busy, whatever a probe waited for

    def fault(self) -> Seen | None:
        """What is wrong, the most basic cause first; None: healthy (as far as this round saw)."""
        if self.nodes_down:
            return Seen.NODE_DOWN
        if self.processes_down:
            return Seen.ENGINE_DEAD
        if self.probe is ProbeResult.UNAUTHORIZED:
            return Seen.UNAUTHORIZED
        if self.health != 200:
            return Seen.UNHEALTHY
        if self.stalled:
            return Seen.WEDGED
        if self.probe is ProbeResult.TIMED_OUT and not self.advancing:  # a busy engine answers late (gonka's trap)
            return Seen.WEDGED
        if self.probe is ProbeResult.FAILED:
            return Seen.PROBE_FAILED
        return None


@dataclass
class TargetMemory:
    """What the judge keeps of one engine between rounds."""

    started_at: float  # when its (re)start began: the loading grace counts from here
    ready_once: bool = True  # False only for an engine the supervisor itself (re)started, until it is ready
    misses: int = 0
    first_miss_at: float | None = None
    told_unauthorized: bool = False
    probe_failing: bool = False  # the last probe failed: a round without a probe neither clears nor repeats it
    node_gone_at: float | None = None  # since when one of its nodes does not answer


@dataclass(frozen=True)
class Verdict:
    target: str
    seen: Seen
    act: bool  # the misses in a row (and, for a lost node, its grace) are reached: do something now
    detected_s: float  # since the first failed check of this run of misses
    loading: bool = False  # within the loading grace: not judged


@dataclass
class Judge:
    policy: Policy
    born_at: float = 0.0  # when the supervisor started: the boot grace for lost nodes counts from here
    memory: dict[str, TargetMemory] = field(default_factory=dict)
    restarts: deque[float] = field(default_factory=deque)  # when each restart of the last hour began
    last_end_at: float | None = None  # when the last restart ended: the backoff counts from here
    failed_in_row: int = 0  # restarts that failed since the last one that served

    def started(self, target: str, now: float) -> None:
        """`target` is being (re)started now: its loading grace begins, its misses are forgotten."""
        self.memory[target] = TargetMemory(started_at=now, ready_once=False)

    def judge(self, check: Check, now: float) -> Verdict | None:
        """None while healthy (or loading); a verdict for a fault, with `act` once it was seen `misses` times."""
        mem = self.memory.setdefault(check.target, TargetMemory(started_at=now))
        seen = check.fault()
        if seen is not Seen.NODE_DOWN:
            mem.node_gone_at = None
        if seen is None:
            if check.probe is None and mem.probe_failing:
                return None  # no probe this round: the pending probe miss stands until the next probe
            mem.ready_once, mem.misses, mem.first_miss_at, mem.probe_failing = True, 0, None, False
            return None
        if seen is Seen.UNAUTHORIZED:  # configuration: told once, never counted as a miss
            first = not mem.told_unauthorized
            mem.told_unauthorized = True
            return Verdict(check.target, seen, act=first, detected_s=0.0)
        mem.probe_failing = check.probe in (ProbeResult.TIMED_OUT, ProbeResult.FAILED)
        loading = (not mem.ready_once and seen in (Seen.UNHEALTHY, Seen.PROBE_FAILED, Seen.WEDGED)
                   and now - mem.started_at < self.policy.start_timeout_s)
        if loading:  # its process runs and it was never ready since it started: still loading
            return Verdict(check.target, seen, act=False, detected_s=0.0, loading=True)
        mem.misses += 1
        if mem.first_miss_at is None:
            mem.first_miss_at = now
        act = mem.misses >= self.policy.misses
        if seen is Seen.NODE_DOWN:  # an SSH blip, or a node still booting, is no reason to serve without it
            mem.node_gone_at = mem.node_gone_at if mem.node_gone_at is not None else now
            act = act and now - mem.node_gone_at >= self.policy.node_grace_s \
                and now - self.born_at >= self.policy.boot_grace_s
        return Verdict(check.target, seen, act=act, detected_s=now - mem.first_miss_at)

    def may_restart(self, now: float) -> tuple[bool, str | None]:
        """(whether a restart may begin now, why not): the breaker first, then the backoff."""
        while self.restarts and now - self.restarts[0] >= HOUR_S:
            self.restarts.popleft()
        if self.failed_in_row >= self.policy.max_restarts:
            return False, f"{self.failed_in_row} restarts failed in a row (the limit is {self.policy.max_restarts})"
        if len(self.restarts) >= self.policy.max_restarts:
            return False, f"{len(self.restarts)} restarts within the last hour (the limit is {self.policy.max_restarts})"
        wait = self.policy.backoff_s[min(len(self.restarts), len(self.policy.backoff_s) - 1)]
        if self.last_end_at is not None and now - self.last_end_at < wait:
            return False, None  # backing off: not yet, and nothing to say
        return True, None

    def restarting(self, now: float) -> None:
        self.restarts.append(now)

    def finished(self, now: float, ok: bool) -> None:
        """A restart ended: the backoff counts from now; a failure counts toward the breaker, a success clears it."""
        self.last_end_at = now
        self.failed_in_row = 0 if ok else self.failed_in_row + 1

    def not_counted(self) -> None:
        """The restart just begun did not happen (a serve by hand held the cluster): forget it."""
        if self.restarts:
            self.restarts.pop()

    def restarts_last_hour(self, now: float) -> int:
        return sum(1 for t in self.restarts if now - t < HOUR_S)

    def breaker_json(self, now: float, wall: float) -> dict[str, object]:
        """The breaker's memory as wall-clock times (`now` monotonic, `wall` the same instant's epoch seconds), so a
        supervisor started again (a crash, a reboot) keeps counting where this one was."""
        return {"restarts": [wall - (now - t) for t in self.restarts], "failed_in_row": self.failed_in_row,
                "last_end": None if self.last_end_at is None else wall - (now - self.last_end_at)}

    def take_breaker(self, doc: dict[str, object], now: float, wall: float) -> None:
        """What breaker_json kept, on this process's monotonic clock; anything unreadable is forgotten."""
        restarts, failed, last_end = doc.get("restarts"), doc.get("failed_in_row"), doc.get("last_end")
        if isinstance(restarts, list) and all(isinstance(t, int | float) for t in restarts):
            self.restarts = deque(sorted(now - (wall - float(t)) for t in restarts))
        if isinstance(failed, int) and failed >= 0:
            self.failed_in_row = failed
        if isinstance(last_end, int | float):
            self.last_end_at = now - (wall - float(last_end))
