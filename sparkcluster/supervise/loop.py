"""The supervisor's loop on the head: observe (watch.py) -> judge (policy.py) -> act (act.py), one round every
`interval_s`, one action at a time. It reads the serve record each round (a serve or down by hand changes it), keeps
its state and incidents in its private folder (serving/incidents.py), and posts each incident where told (notify.py).

What it does, per fault:
- an engine of one TP/PP layout dead, wedged or unhealthy: the whole layout served again (every rank down first:
  a single restarted rank cannot rejoin the others);
- a replica: that replica alone, while the router serves the others;
- a node lost (after its grace): with replicas, nothing (the router already serves around it: degraded); with one
  engine, the largest layout of the same shape on the nodes left; back to the full layout once the node answers;
- a 401/403 on its probe: reported, nothing restarted;
- after `max_restarts` in an hour, or that many failed in a row: it stops acting, says why, with the last failure's
  cause."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..engine.inventory import Inventory, load_inventory
from ..engine.localfiles import write_text
from ..engine.session import connect
from ..serving.apikey import environment_key
from ..serving.incidents import Action, Incident, Outcome, Seen, SupervisorState, WatchState, now_iso
from ..serving.record import ServeRecord, read_record
from ..serving.runtime import RuntimeChoice
from ..serving.supervision import KEPT_RECORD
from ..serving.supervisor_unit import SupervisorSpec
from . import act
from .act import Outcome as Done
from .notify import post
from .policy import Check, Judge, Policy, Verdict, policy_values
from .watch import Progress, Target, check, nodes_view, targets, unreachable

log = logging.getLogger("sparkcluster.supervise")


def policy_from(spec: SupervisorSpec, inventory: Inventory) -> Policy:
    """The defaults, then the inventory's `supervise:` settings, then the serve's own readiness deadline; a setting
    that is not one (or of the wrong kind) keeps its default and is logged."""
    given = inventory.vars.get("supervise")
    values, refused = policy_values({**(dict(given) if isinstance(given, Mapping) else {}), **dict(spec.policy)})
    for why in refused:
        log.warning("the inventory's supervise: setting %s; its default is kept", why)
    settings: dict[str, Any] = dict(values)
    return replace(Policy(start_timeout_s=spec.ready_timeout_s), **settings)


@dataclass
class Degraded:
    lost: tuple[str, ...]  # the nodes it serves without


@dataclass
class Supervisor:
    folder: Path  # the supervisor's private folder (its spec, inventory, state, events, log)
    spec: SupervisorSpec
    inventory_path: Path
    policy: Policy
    clock: Callable[[], float] = time.monotonic
    judge: Judge = field(init=False)
    progress: Progress = field(default_factory=Progress)
    degraded: Degraded | None = None
    gave_up: str | None = None
    last_probe: float = float("-inf")
    last_failure: str | None = None

    def __post_init__(self) -> None:
        self.judge = Judge(self.policy, born_at=self.clock())
        try:
            self.judge.take_breaker(json.loads((self.folder / "breaker.json").read_text()), self.clock(), time.time())
        except (OSError, ValueError, AttributeError):
            pass  # none kept yet (or unreadable): a fresh count
        try:
            lost = tuple(json.loads((self.folder / "degraded.json").read_text())["lost"])
            self.degraded = Degraded(lost)
        except (OSError, ValueError, KeyError, TypeError):
            self.degraded = None

    # ---- what it tells
    def tell(self, state: WatchState, reason: str | None = None) -> None:
        doc = SupervisorState(state, now_iso(), self.judge.restarts_last_hour(self.clock()), reason)
        write_text(self.folder / "state.json", json.dumps(doc.to_json()) + "\n", 0o600)

    def record(self, incident: Incident) -> None:
        with open(self.folder / "events.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(incident.to_json()) + "\n")
        log.warning(incident.line())
        if self.spec.notify:
            post(self.spec.notify, incident)

    # ---- one round
    def round(self) -> None:
        inventory = load_inventory(self.inventory_path)
        now = self.clock()
        with connect(inventory) as session:
            try:
                record = read_record(session)
            except Exception as e:  # the head's own file: unreadable is told, and the round skipped
                log.warning("the serve record cannot be read: %s", e)
                return
            record = self.kept(record)
            if record is None or record.serving is None:
                self.tell(WatchState.WATCHING, "nothing is served")
                return
            runtime = RuntimeChoice(record.runtime, record.image)
            serving = record.serving
            found = targets(inventory, record.nodes, serving)
            served = session.only(record.nodes)
            view = nodes_view(served, runtime, serving, record.launcher)
            probe_now = now - self.last_probe >= self.policy.probe_every_s
            if probe_now:
                self.last_probe = now
            checks = [check(t, view, serving.served_name, environment_key(), self.policy, self.progress, now,
                            probe_now) for t in found]
            lost_still = unreachable(session.only(self.degraded.lost)) if self.degraded else ()
        by_name = {t.name: t for t in found}
        verdicts = [(c, self.judge.judge(c, now)) for c in checks]
        if self.gave_up:
            self.tell(WatchState.GAVE_UP, self.gave_up)
            return
        if self.degraded and not lost_still:
            self.restore(now, record)
            return
        # The router first: without it no replica is reached, and serving the layout again restarts every part.
        for c, verdict in sorted(verdicts, key=lambda cv: not by_name[cv[0].target].router):
            covered = self.degraded is not None and set(c.nodes_down) <= set(self.degraded.lost)
            if verdict is not None and verdict.act and not (verdict.seen is Seen.NODE_DOWN and covered):
                self.act(c, verdict, by_name.get(c.target), record, now, view.down)
                return
        loading = any(v is not None and v.loading for _, v in verdicts)
        if self.degraded:
            self.tell(WatchState.DEGRADED, f"serving without {', '.join(self.degraded.lost)}")
        else:
            self.tell(WatchState.LOADING if loading else WatchState.WATCHING)

    # ---- what it does
    def act(self, c: Check, verdict: Verdict, target: Target | None, record: ServeRecord, now: float,
            down: tuple[str, ...] = ()) -> None:
        seen = verdict.seen
        name = c.target
        if seen is Seen.UNAUTHORIZED:
            self.record(Incident(now_iso(), name, seen, Action.NONE, Outcome.REPORTED, 0.0, None,
                                 "the probe's API key was refused (401/403)",
                                 f"{name}: the probe's API key was refused: a configuration error, nothing restarted; "
                                 "serve again with the key the endpoint wants"))
            return
        serving = record.serving
        assert serving is not None
        if seen is Seen.NODE_DOWN and serving.replicas and target is not None and not target.router:
            if self.degraded is None:  # the router's health checks already keep clients off it
                self.set_degraded(Degraded(c.nodes_down))
                self.record(Incident(now_iso(), name, seen, Action.NONE, Outcome.REPORTED, verdict.detected_s, None,
                                     None, f"{', '.join(c.nodes_down)} does not answer: the router serves the other "
                                           "replicas (degraded) until it is back"))
            self.tell(WatchState.DEGRADED, f"serving without {', '.join(c.nodes_down)}")
            return
        allowed, why_not = self.judge.may_restart(now)
        if not allowed:
            if why_not:
                self.give_up(name, seen, verdict.detected_s, why_not)
            return
        self.judge.restarting(now)
        self.keep_breaker()
        self.tell(WatchState.RECOVERING, f"{name}: {seen}")
        lost = tuple(n for n in record.nodes if n in set(down) | set(c.nodes_down))
        if lost and not (target is not None and target.replica is not None):
            self.degrade(name, seen, verdict, record, lost)  # a full serve needs every node: serve without them
            return
        if target is not None and target.replica is not None:
            outcome = act.restart_replica(self.spec, self.inventory_path, target.replica, self.log_path)
            action = Action.RESTART_REPLICA
        else:
            outcome = act.run_serve(act.serve_argv(self.spec, self.inventory_path), self.spec.ready_timeout_s + 600,
                                    self.log_path)
            action = Action.RESTART
        self.after(name, seen, action, verdict, outcome, target.name if target else name)

    def degrade(self, name: str, seen: Seen, verdict: Verdict, record: ServeRecord, lost: tuple[str, ...]) -> None:
        """The largest layout of the same shape on the nodes left: TP (x PP) on a power of two of them, or the
        replicas whose nodes all answer; its serve says whether the model fits there."""
        serving = record.serving
        assert serving is not None
        survivors = [h for h in record.nodes if h not in lost]
        if serving.replicas:
            whole = [p for p in serving.replicas if not set(p.nodes) & set(lost)]
            used = [n for p in whole for n in p.nodes]
            argv = act.serve_argv(self.spec, self.inventory_path, used, replicas=len(whole))
            what = f"{len(whole)} replica(s) on {', '.join(used)}"
        else:
            size = 1 << (max(1, len(survivors) // max(1, serving.pp)).bit_length() - 1)  # TP divides the heads
            used = survivors[:size * max(1, serving.pp)]
            argv = act.serve_argv(self.spec, self.inventory_path, used, tp=size)
            what = f"TP {size} on {', '.join(used)}"
        outcome = act.run_serve(argv, self.spec.ready_timeout_s + 600, self.log_path)
        if outcome.ok:
            self.set_degraded(Degraded(lost))
        self.after(name, seen, Action.DEGRADE, verdict, outcome, what)

    def restore(self, now: float, record_now: ServeRecord) -> None:
        """The lost nodes answer again: with replicas, the next rounds restart the lost replica alone (its engine is
        not running); with one engine, the full layout served again, as a restart is (backoff and breaker)."""
        assert self.degraded is not None
        back = ", ".join(self.degraded.lost)
        if record_now.serving and record_now.serving.replicas:
            self.record(Incident(now_iso(), back, Seen.NODE_BACK, Action.NONE, Outcome.REPORTED, None, None, None,
                                 f"{back} answers again: its replica is started again"))
            self.set_degraded(None)
            return
        allowed, why_not = self.judge.may_restart(now)
        if not allowed:
            if why_not:
                self.give_up("vLLM", Seen.NODE_BACK, 0.0, why_not)
            return  # backing off; degraded until then
        self.judge.restarting(now)
        self.keep_breaker()
        self.tell(WatchState.RECOVERING, f"{back} answers again: back to the full layout")
        outcome = act.run_serve(act.serve_argv(self.spec, self.inventory_path), self.spec.ready_timeout_s + 600,
                                self.log_path)
        verdict = Verdict(back, Seen.NODE_BACK, True, 0.0)
        if outcome.ok:
            self.set_degraded(None)
        self.after("vLLM", Seen.NODE_BACK, Action.RESTORE, verdict, outcome, f"{back} answers again: the full layout")
        if not outcome.ok and not outcome.busy:
            # The failed full serve stopped the degraded one: serve without the node again, and keep waiting.
            self.degrade("vLLM", Seen.NODE_BACK, verdict, record_now, self.degraded.lost)

    def give_up(self, name: str, seen: Seen, detected_s: float, why: str) -> None:
        """The breaker opens: no more actions, the cluster left as it is, and why, with the last failure's cause."""
        self.gave_up = f"{why}; the last failure: {self.last_failure or seen}"
        self.record(Incident(now_iso(), name, seen, Action.GAVE_UP, Outcome.GAVE_UP, round(detected_s, 1), None,
                             self.last_failure, f"gave up: {self.gave_up}; the cluster is left as it is; "
                                                "`sparkcluster serve` by hand starts it afresh"))
        self.tell(WatchState.GAVE_UP, self.gave_up)

    def set_degraded(self, degraded: Degraded | None) -> None:
        """Kept in the folder too: a supervisor started again (its unit, a reboot) still knows what it serves without."""
        self.degraded = degraded
        kept = self.folder / "degraded.json"
        if degraded is None:
            kept.unlink(missing_ok=True)
        else:
            write_text(kept, json.dumps({"lost": list(degraded.lost)}) + "\n", 0o600)

    def keep_breaker(self) -> None:
        """The restarts the breaker counts, kept in the folder: a supervisor that crashes and is started again by its
        unit must not begin counting from zero."""
        doc = self.judge.breaker_json(self.clock(), time.time())
        write_text(self.folder / "breaker.json", json.dumps(doc) + "\n", 0o600)

    def after(self, name: str, seen: Seen, action: Action, verdict: Verdict, outcome: Done, what: str) -> None:
        if outcome.busy:
            self.judge.not_counted()
            self.keep_breaker()
            self.tell(WatchState.WATCHING, "a serve or down by hand holds the cluster: it waits")
            return
        self.judge.finished(self.clock(), outcome.ok)
        self.keep_breaker()
        if outcome.ok:
            self.judge.started(name, self.clock())
            self.record(Incident(now_iso(), name, seen, action, Outcome.RECOVERED, round(verdict.detected_s, 1),
                                 round(outcome.seconds, 1), None, f"{seen}: {action} ({what}): answering again",
                                 phases=outcome.phases))
            self.tell(WatchState.DEGRADED if self.degraded else WatchState.WATCHING,
                      f"serving without {', '.join(self.degraded.lost)}" if self.degraded else None)
        else:
            self.last_failure = outcome.cause
            self.record(Incident(now_iso(), name, seen, action, Outcome.FAILED, round(verdict.detected_s, 1), None,
                                 outcome.cause, f"{seen}: {action} ({what}) failed: {outcome.cause}"))
            self.tell(WatchState.RECOVERING, outcome.cause)

    def kept(self, record: ServeRecord | None) -> ServeRecord | None:
        """The head's serve record, kept in the supervisor's folder; where the head has none any more (a failed serve
        clears it), the one kept: what is to be served does not change because a restart failed. `down` by hand
        stops the supervisor before it clears the record."""
        copy = Path.home() / KEPT_RECORD
        if record is not None and record.serving is not None:
            write_text(copy, json.dumps(record.to_json()) + "\n", 0o600)
            return record
        try:
            return ServeRecord.from_json(json.loads(copy.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return record

    @property
    def log_path(self) -> Path:
        return self.folder / "supervisor.log"

    def forever(self) -> None:
        self.tell(WatchState.LOADING, "starting")
        while True:
            began = self.clock()
            try:
                self.round()
            except Exception:  # a round that broke is logged; the supervisor itself keeps watching
                log.exception("a round of checks failed")
            time.sleep(max(0.0, self.policy.interval_s - (self.clock() - began)))
