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
    backoff_s: tuple[float, ...] = (0.0, 60.0, 300.0)  # wait before the 1st, 2nd, 3rd... restart within an hour
    max_restarts: int = 3  # per hour; one more fault after them opens the breaker
    start_timeout_s: float = 1800.0  # the serve's own readiness deadline: the loading grace ends there

    def worst_detection_s(self) -> float:
        """The longest a fault can go unnoticed: a probe hang needs `misses` probes, each waited for in full."""
        return self.misses * (self.probe_every_s + self.probe_timeout_s)


class ProbeResult(StrEnum):
    OK = "ok"  # a token came (judged by the usage's count, never the text: a reasoning model's may be empty)
    FAILED = "failed"  # an error status, or no token counted
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
        if self.probe in (ProbeResult.TIMED_OUT, ProbeResult.FAILED) or self.stalled:
            return Seen.WEDGED if self.health == 200 else Seen.PROBE_FAILED
        return None


@dataclass
class TargetMemory:
    """What the judge keeps of one engine between rounds."""

    started_at: float  # when its (re)start began: the loading grace counts from here
    ready_once: bool = False
    misses: int = 0
    first_miss_at: float | None = None
    told_unauthorized: bool = False


@dataclass(frozen=True)
class Verdict:
    target: str
    seen: Seen
    act: bool  # the misses in a row are reached: do something now
    detected_s: float  # since the first failed check of this run of misses
    loading: bool = False  # within the loading grace: not judged


@dataclass
class Judge:
    policy: Policy
    memory: dict[str, TargetMemory] = field(default_factory=dict)
    restarts: deque[float] = field(default_factory=deque)  # when each restart of the last hour began
    last_restart_at: float | None = None

    def started(self, target: str, now: float) -> None:
        """`target` is being (re)started now: its loading grace begins, its misses are forgotten."""
        self.memory[target] = TargetMemory(started_at=now)

    def judge(self, check: Check, now: float) -> Verdict | None:
        """None while healthy (or loading); a verdict for a fault, with `act` once it was seen `misses` times."""
        mem = self.memory.setdefault(check.target, TargetMemory(started_at=now))
        seen = check.fault()
        if seen is None:
            mem.ready_once, mem.misses, mem.first_miss_at = True, 0, None
            return None
        if seen is Seen.UNAUTHORIZED:  # configuration: told once, never counted as a miss
            first = not mem.told_unauthorized
            mem.told_unauthorized = True
            return Verdict(check.target, seen, act=first, detected_s=0.0)
        loading = (not mem.ready_once and seen in (Seen.UNHEALTHY, Seen.PROBE_FAILED, Seen.WEDGED)
                   and now - mem.started_at < self.policy.start_timeout_s)
        if loading:  # its process runs and it was never ready since it started: still loading
            return Verdict(check.target, seen, act=False, detected_s=0.0, loading=True)
        mem.misses += 1
        if mem.first_miss_at is None:
            mem.first_miss_at = now
        return Verdict(check.target, seen, act=mem.misses >= self.policy.misses, detected_s=now - mem.first_miss_at)

    def may_restart(self, now: float) -> tuple[bool, str | None]:
        """(whether a restart may begin now, why not): the breaker first, then the backoff."""
        while self.restarts and now - self.restarts[0] >= HOUR_S:
            self.restarts.popleft()
        if len(self.restarts) >= self.policy.max_restarts:
            return False, f"{len(self.restarts)} restarts within the last hour (the limit is {self.policy.max_restarts})"
        wait = self.policy.backoff_s[min(len(self.restarts), len(self.policy.backoff_s) - 1)]
        if self.last_restart_at is not None and now - self.last_restart_at < wait:
            return False, None  # backing off: not yet, and nothing to say
        return True, None

    def restarting(self, now: float) -> None:
        self.restarts.append(now)
        self.last_restart_at = now

    def restarts_last_hour(self, now: float) -> int:
        return sum(1 for t in self.restarts if now - t < HOUR_S)
