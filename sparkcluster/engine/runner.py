"""Runs a playbook: plays in order (each a barrier), hosts in parallel inside a play, steps in order per host.

For each step: check() -> Plan; a no-op is `ok`; otherwise apply() (unless --check) and check() again,
which must now be a no-op (`changed`), or the step failed to converge. A failure is data on the event,
never an exception crossing a thread. Unreachable hosts drop out of the rest of the run.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from .batch import batchable, run_batch
from .command import Command
from .errors import UsageError
from .events import (
    Event,
    Failure,
    HostRecap,
    PlayFinished,
    PlayStarted,
    RunFinished,
    RunStarted,
    Status,
    StepFinished,
    StepStarted,
)
from .facts import HostFacts, gather
from .inventory import Host
from .playbook import Play, Playbook, StepCall, build_args
from .session import Session
from .steps import HostContext, Plan, StepFailed
from .transport import Result, Unreachable, load_ssh_library

# A bug, or a library calling sys.exit(), must fail its host and never end that host's thread unreported; the
# other hosts go on. KeyboardInterrupt is not among them: Ctrl-C stays an interrupt.
BUGS = (Exception, SystemExit, GeneratorExit)


class Runner:
    """Runs `playbook` over `session`'s hosts. The session's owner closes its connections; the runner gathers
    each host's facts into it play by play."""

    def __init__(
        self,
        session: Session,
        playbook: Playbook,
        emit: Callable[[Event], None],
        *,
        check: bool = False,
        extra_vars: Mapping[str, Any] | None = None,
    ) -> None:
        self.session = session
        self.inventory = session.inventory
        self.playbook = playbook
        self.emit = emit
        self.check = check
        self.forks = session.forks
        self.transports = session.transports
        self.extra_vars = dict(extra_vars or {})
        self.facts: dict[str, HostFacts] = session.facts
        self._changed_since_facts: set[str] = set()
        self._planned: set[str] = set()  # check mode: hosts whose facts are an earlier step's plan (Plan.planned_facts)
        self._prefetched: dict[str, dict[str, Result]] = {}  # per host: its play's reads, run as one batch
        # Per host: its facts as templates see them, made once per facts gathered (each step's arguments render
        # twice a play, and the JSON form of a node's facts costs about 0.6 ms).
        self._facts_json: dict[str, tuple[HostFacts, dict[str, Any]]] = {}
        self._prepared = threading.Thread(target=self._prepare, name="prepare", daemon=True)
        self.recap = {h.name: HostRecap() for h in session.hosts}
        self.failures: dict[str, Failure] = {}
        self.down: set[str] = set()  # failed or unreachable: no further steps
        self._cancel = threading.Event()
        self._lock = threading.Lock()

    # ---- public ------------------------------------------------------------------------------------
    def run(self) -> RunFinished:
        for play in self.playbook.plays:
            self._select(play)  # a play aimed at nothing is bad input: fail before any connection
        start = time.monotonic()
        self.emit(RunStarted(self.playbook.name, tuple(h.name for h in self.inventory.hosts), self.check))
        stopped_by = None
        interrupted = False
        try:
            for play in self.playbook.plays:
                hosts = self._select(play)
                if play.require_all and any(h.name in self.down for h in hosts):
                    stopped_by = play.name
                    break
                self._run_play(play, [h for h in hosts if h.name not in self.down])
                if play.require_all and any(h.name in self.down for h in hosts):
                    self.emit(PlayFinished(play.name, stopped_run=True))
                    stopped_by = play.name
                    break
                self.emit(PlayFinished(play.name))
        except KeyboardInterrupt:
            interrupted = True
            self._cancel.set()
            self.session.close()  # threads blocked on a remote command return at once
        result = RunFinished(self.recap, interrupted, stopped_by, time.monotonic() - start, dict(self.failures))
        self.emit(result)
        return result

    # ---- plays -------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        """The playbook's imports and templates (Playbook.prepare), while the first play's facts come in: the
        nodes run their probes then, and this process only waits. The SSH library comes first: the first
        connection needs it at once, and nothing here must delay that. A warm pair's bootstrap: 4-10% less wall
        time (medians of three A/B runs of 14 interleaved rounds: 1.027 -> 0.987, 0.948 -> 0.853, 0.965 -> 0.917 s).
        Started at the run's start instead, before paramiko's import, it gained nothing (1.036 -> 1.054 s)."""
        load_ssh_library()
        self.playbook.prepare()

    def _select(self, play: Play) -> list[Host]:
        selector = play.hosts
        if selector == "all":
            return list(self.inventory.hosts)
        if selector == "head":
            return [self.inventory.head]
        if selector == "workers":
            return list(self.inventory.workers)
        chosen = [h for h in self.inventory.hosts if selector in h.groups or h.name == selector]
        if not chosen:
            raise UsageError(f"play {play.name!r} targets {selector!r}, which matches no host or group",
                             "use all, head, workers, a group or a host name")
        return chosen

    def _run_play(self, play: Play, hosts: list[Host]) -> None:
        self.emit(PlayStarted(play.name, tuple(h.name for h in hosts)))
        if self._prepared.ident is None:  # the first play
            self._prepared.start()
        if play.gather_facts:
            self._parallel(hosts, lambda host: self._gather(host, play.refresh_facts))
            hosts = [h for h in hosts if h.name not in self.down]
        self._prepared.join()
        play.import_steps()  # a bundled playbook's step modules: here, once, rather than in each host's thread
        self._parallel(hosts, lambda host: self._run_steps(play, host))

    def _parallel(self, hosts: list[Host], work: Callable[[Host], None]) -> None:
        """Run `work` per host on up to `forks` threads; Ctrl-C stops waiting and cancels what has not started."""
        if not hosts:
            return
        pool = ThreadPoolExecutor(max_workers=min(self.forks, len(hosts)))
        futures: set[Future[None]] = {pool.submit(work, h) for h in hosts}
        try:
            while futures:
                _, futures = wait(futures, timeout=0.2, return_when=FIRST_COMPLETED)
        except KeyboardInterrupt:
            self._cancel.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    # ---- per host ----------------------------------------------------------------------------------
    def _gather(self, host: Host, refresh: bool = False) -> None:
        if host.name in self.facts and not (refresh and host.name in self._changed_since_facts):
            return
        self._changed_since_facts.discard(host.name)
        started = time.monotonic()
        try:
            facts = gather(self.transports[host.name])
        except Unreachable as e:
            self._finish(host, "facts", "gather facts", Status.UNREACHABLE, e.message, started,
                         failure=Failure(e.message, e.fix))
            return
        except BUGS as e:
            message, failure = _internal_error("gather facts", e)
            self._finish(host, "facts", "gather facts", Status.FAILED, message, started, failure=failure)
            return
        with self._lock:
            self.facts[host.name] = facts

    def _run_steps(self, play: Play, host: Host) -> None:
        self._prefetch(play, host)
        for call in play.steps:
            if self._cancel.is_set() or host.name in self.down:
                return
            self._run_step(play, host, call)

    def _context(self, host: Host) -> HostContext:
        # Cross-node steps see the facts of only the nodes still in the run: a failed node is not a peer to set up.
        healthy = {name: facts for name, facts in self.facts.items() if name not in self.down}
        return HostContext(host, dataclasses.replace(self.session, facts=healthy), self.check,
                           frozenset(self._planned), self._prefetched.setdefault(host.name, {}))

    def _prefetch(self, play: Play, host: Host) -> None:
        """The reads every step of `play` declares for `host`, run as one exec: one round trip for the play's
        checks instead of one per command. Best effort: whatever is not brought here, a step runs itself, so a
        step whose arguments or reads fail says so in its own check, as it would without the batch."""
        prefetched = self._prefetched.setdefault(host.name, {})
        prefetched.clear()
        ctx = self._context(host)
        wanted: dict[str, Command] = {}
        for call in play.steps:
            try:
                step = call.step(build_args(call, self._template_context(host)))
                for command in step.reads(ctx):
                    if batchable(command, self.transports[host.name]):
                        wanted.setdefault(command.line(), command)
            except (*BUGS, UsageError, StepFailed):
                continue  # the step's own run reports it
        if len(wanted) < 2:
            return  # one command alone gains nothing from the batch's framing
        commands = list(wanted.values())
        try:
            results = run_batch(self.transports[host.name], commands)
        except Unreachable:
            return  # the first step meets it again and reports the host
        if results is not None:
            prefetched.update({commands[i].line(): result for i, result in results.items()})

    def _run_step(self, play: Play, host: Host, call: StepCall, retried: bool = False) -> None:
        started = time.monotonic()
        self.emit(StepStarted(host.name, play.name, call.name))
        ctx = self._context(host)
        try:
            step = call.step(build_args(call, self._template_context(host)))
            plan = step.check(ctx)
            warnings = plan.warnings
            if plan.skip:
                self._finish(host, play.name, call.name, Status.SKIPPED, plan.reason, started, warnings=warnings)
                return
            if not plan.changes:
                self._finish(host, play.name, call.name, Status.OK, plan.reason, started, warnings=warnings)
                return
            if self.check:
                if plan.planned_facts is not None:  # what later steps check against: the state this plan makes
                    with self._lock:
                        self.facts[host.name] = plan.planned_facts
                        self._planned.add(host.name)
                self._finish(host, play.name, call.name, Status.CHANGED, f"would {plan.reason}", started, plan)
                return
            ctx.prefetched.clear()  # what this changes may be what a later step's batched read saw
            step.apply(ctx, plan)
            if not call.step.always_changes:
                after = step.check(ctx)
                if after.changes:
                    raise StepFailed(f"did not converge: after applying, check still says {after.reason!r}",
                                     "this is a bug in the step or something on the host reverts it; run again with --diff")
            self._finish(host, play.name, call.name, Status.CHANGED, plan.reason, started, plan)
        except StepFailed as e:
            result = e.result
            failure = Failure(
                e.message, e.fix,
                command=result.command.display() if result else "",
                exit_code=result.exit_code if result else None,
                stderr_tail=result.stderr_tail() if result else "",
            )
            self._finish(host, play.name, call.name, Status.FAILED, e.message, started, failure=failure)
        except Unreachable as e:
            peer = next((h for h in self.inventory.hosts if h.name == e.host and h.name != host.name), None)
            if peer is None or retried:
                self._finish(host, play.name, call.name, Status.UNREACHABLE, e.message, started,
                             failure=Failure(e.message, e.fix))
                return
            # A step on this node reached for another that is gone: that node is the unreachable one, and this
            # node's step runs again without it, rather than failing for what it could not help.
            if peer.name not in self.down:
                self._finish(peer, play.name, call.name, Status.UNREACHABLE, e.message, started,
                             failure=Failure(e.message, e.fix))
            self._run_step(play, host, call, retried=True)
        except UsageError as e:
            self._finish(host, play.name, call.name, Status.FAILED, e.message, started,
                         failure=Failure(e.message, e.fix))
        except BUGS as e:
            message, failure = _internal_error(call.name, e)
            self._finish(host, play.name, call.name, Status.FAILED, message, started, failure=failure)

    def _template_context(self, host: Host) -> dict[str, Any]:
        facts = self.facts.get(host.name)
        return {
            **dict(self.inventory.vars),
            **dict(host.vars),
            **self.extra_vars,
            "host": host,
            "inventory": self.inventory,
            "facts": self._facts_as_json(host.name, facts) if facts else {},
        }

    def _facts_as_json(self, name: str, facts: HostFacts) -> dict[str, Any]:
        cached = self._facts_json.get(name)
        if cached is None or cached[0] is not facts:
            cached = self._facts_json[name] = (facts, facts.to_json())
        return cached[1]

    def _finish(self, host: Host, play: str, step: str, status: Status, reason: str, started: float,
                plan: Plan | None = None, failure: Failure | None = None, warnings: tuple[str, ...] = ()) -> None:
        """Counts `status` for `host` and emits it. `plan` is the one that was (in check mode: would be) carried
        out: the event shows its commands, uploads and notes each as what they are."""
        if self._cancel.is_set():
            return  # interrupted: the recap is already out; a thread finishing late must not add to it
        with self._lock:
            self.recap[host.name].add(status)
            if status is Status.CHANGED and not self.check:
                self._changed_since_facts.add(host.name)
            if status.stops_host:
                self.down.add(host.name)
                if failure:
                    self.failures[host.name] = failure
        duration = time.monotonic() - started
        if plan is None:
            self.emit(StepFinished(host.name, play, step, status, reason, duration, failure=failure, warnings=warnings))
            return
        self.emit(StepFinished(host.name, play, step, status, reason, duration,
                               commands=tuple(c.display() for c in plan.commands), diff=plan.diff, failure=failure,
                               warnings=plan.warnings, uploads=plan.uploads, notes=plan.notes))


def _internal_error(what: str, error: BaseException) -> tuple[str, Failure]:
    message = f"internal error in {what}: {type(error).__name__}: {error}"
    return message, Failure(message, "please report this as a bug")
