"""The runner's less travelled paths, through strict fake transports (tests/support/strict_transport.py): a step that does
not converge, a step that raises something unexpected, and an interrupt in the middle of a run."""

from __future__ import annotations

import _thread
import copy
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.events import (
    Failure, HostRecap, PlayFinished, PlayStarted, RunFinished, RunStarted, StepFinished, StepStarted,
)
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.playbook import Play, Playbook, StepCall
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import Session
from sparkcluster.engine.steps import REGISTRY, HostContext, Plan, Step
from sparkcluster.engine.steps import NoArgs
from tests.support.strict_transport import StrictTransport, verify_all

PROBE_TEXT = (Path(__file__).resolve().parents[2] / "fixtures" / "probe-spark.txt").read_text()
NAMES = ("spark-1", "spark-2", "spark-3")
GETENT = "getent group docker"
USERMOD = "sudo -n -H -- sh -c 'usermod -aG docker spark'"


def inventory(names: tuple[str, ...]) -> Inventory:
    hosts = tuple(Host(name=n, address=f"10.0.0.{i}", role="head" if i == 1 else "worker", user="spark")
                  for i, n in enumerate(names, start=1))
    return Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={})


def call(name: str, **args: object) -> StepCall:
    return StepCall(REGISTRY[name], dict(args), 1)


def playbook(*plays: Play) -> Playbook:
    return Playbook("pb.yml", "pb", plays)


class Recorder:
    """The emit callback: every event, and what the recap said at the moment RunFinished was delivered."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.recap_at_finish: dict[str, HostRecap] | None = None

    def __call__(self, event: object) -> None:
        if isinstance(event, RunFinished):
            self.recap_at_finish = copy.deepcopy(event.recap)
        self.events.append(event)

    def finished(self) -> list[tuple[str, str, str]]:
        return sorted((e.host, e.step, e.status) for e in self.events if isinstance(e, StepFinished))

    def of(self, host: str) -> list[StepFinished]:
        return [e for e in self.events if isinstance(e, StepFinished) and e.host == host]


@pytest.fixture
def thread_exceptions(monkeypatch) -> Iterator[list[object]]:
    """Exceptions that escaped a thread: the runner must leave none (a failure is data on an event)."""
    seen: list[object] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    yield seen


def run(names: tuple[str, ...], book: Playbook, transports: dict[str, StrictTransport]) -> tuple[RunFinished, Recorder]:
    recorder = Recorder()
    try:
        result = Runner(Session(inventory(names), transports), book, recorder).run()  # type: ignore[arg-type]
    except KeyboardInterrupt:  # would otherwise stop the whole test session
        pytest.fail("KeyboardInterrupt escaped Runner.run()")
    assert recorder.events[-1] is result
    return result, recorder


# ---- non-convergence -------------------------------------------------------------------------------------
def test_apply_that_succeeds_but_leaves_check_wanting_changes_fails_as_not_converged(thread_exceptions):
    """spark-1's usermod 'works' but the group never shows the user (say, docker is an LDAP group):
    check() after apply() still plans a change, so the step failed and that host goes no further."""
    transports = {
        "spark-1": StrictTransport("spark-1", ordered=True).expect_probe(PROBE_TEXT)
        .expect(GETENT, stdout="docker:x:998:\n").expect(USERMOD).expect("docker ps -q")
        .expect(GETENT, stdout="docker:x:998:\n"),
        "spark-2": StrictTransport("spark-2", ordered=True).expect_probe(PROBE_TEXT)
        .expect(GETENT, stdout="docker:x:998:\n").expect(USERMOD).expect("docker ps -q")
        .expect(GETENT, stdout="docker:x:998:spark\n").expect("echo next"),
    }
    book = playbook(Play("prepare", "all", (call("docker.group"), call("command.run", cmd="echo next"))))
    result, recorder = run(NAMES[:2], book, transports)

    verify_all(transports)  # spark-1 never got to `echo next`
    failed = recorder.of("spark-1")
    assert [(e.step, e.status) for e in failed] == [("docker.group", "failed")]
    message = "did not converge: after applying, check still says 'add spark to group docker'"
    assert failed[0].reason == message
    assert failed[0].failure == Failure(
        message, "this is a bug in the step or something on the host reverts it; run again with --diff")
    assert [(e.step, e.status, e.reason) for e in recorder.of("spark-2")] == [
        ("docker.group", "changed", "add spark to group docker"), ("command.run", "changed", "run echo next")]
    assert result.recap == {"spark-1": HostRecap(failed=1), "spark-2": HostRecap(changed=2)}
    assert result.failures == {"spark-1": failed[0].failure}
    assert result.exit_code == 1
    assert thread_exceptions == []


def test_a_verb_is_not_checked_again_after_it_ran():
    """command.run always changes: check() after apply() cannot prove anything, so it is not asked (the strict
    transport would fail on a second `test -e`)."""
    transports = {"spark-1": StrictTransport("spark-1", ordered=True)
                  .expect('test -e "$HOME"/marker', exit_code=1).expect("make install")}
    book = playbook(Play("p", "all", (call("command.run", cmd="make install", creates="~/marker"),), gather_facts=False))
    result, recorder = run(NAMES[:1], book, transports)
    verify_all(transports)
    assert recorder.finished() == [("spark-1", "command.run", "changed")]
    assert result.exit_code == 0


# ---- unexpected exceptions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BoomArgs:
    host: str = "spark-2"
    where: str = "check"  # or "apply"


class Boom(Step):
    """A step with a bug on one host: it raises in check() or apply()."""

    name = "test.boom"
    Args = BoomArgs
    always_changes = True  # a verb: not checked again after apply()

    def check(self, ctx: HostContext) -> Plan:
        if ctx.host.name == self.args.host and self.args.where == "check":
            raise KeyError("gpu_uuid")
        return Plan(f"touch /tmp/boom on {ctx.host.name}", (Command("touch /tmp/boom"),))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        if ctx.host.name == self.args.host and self.args.where == "apply":
            raise ZeroDivisionError("division by zero")
        super().apply(ctx, plan)


@pytest.mark.parametrize("where,message", [
    ("check", "internal error in test.boom: KeyError: 'gpu_uuid'"),
    ("apply", "internal error in test.boom: ZeroDivisionError: division by zero"),
])
def test_a_bug_in_a_step_fails_that_host_only_and_never_escapes_a_thread(where, message, thread_exceptions):
    transports = {name: StrictTransport(name) for name in NAMES}
    for name in ("spark-1", "spark-3"):
        # the healthy hosts finish the step, the play and the next play
        transports[name].expect("touch /tmp/boom").expect("echo after").expect("echo later")
    if where == "apply":
        transports["spark-2"].expect("touch /tmp/boom", times=0)  # never reached: apply() raised first
    book = playbook(
        Play("first", "all", (StepCall(Boom, {"where": where}, 1), call("command.run", cmd="echo after")),
             gather_facts=False),
        Play("second", "all", (call("command.run", cmd="echo later"),), gather_facts=False),
    )
    result, recorder = run(NAMES, book, transports)

    verify_all(transports)
    assert [(e.step, e.status, e.reason) for e in recorder.of("spark-2")] == [("test.boom", "failed", message)]
    assert recorder.of("spark-2")[0].failure == Failure(message, "please report this as a bug")
    assert "Traceback" not in message
    for name in ("spark-1", "spark-3"):
        assert [(e.step, e.status) for e in recorder.of(name)] == [
            ("test.boom", "changed"), ("command.run", "changed"), ("command.run", "changed")]
    assert result.recap["spark-2"] == HostRecap(failed=1)
    assert [e.play for e in recorder.events if isinstance(e, PlayFinished)] == ["first", "second"]
    assert result.exit_code == 1
    assert thread_exceptions == []


def test_an_unexpected_command_on_a_strict_transport_fails_the_step_and_the_test():
    """Under the runner the strict transport's AssertionError becomes the step's failure; verify() still
    reports it, so a test driving the runner cannot pass over a command nobody expected."""
    transports = {"spark-1": StrictTransport("spark-1")}
    result, recorder = run(NAMES[:1], playbook(Play("p", "all", (call("command.run", cmd="rm -rf /tmp/x"),),
                                                     gather_facts=False)), transports)
    [event] = recorder.of("spark-1")
    assert event.status == "failed"
    assert event.reason.startswith("internal error in command.run: AssertionError: spark-1: unexpected command "
                                   "`rm -rf /tmp/x`")
    with pytest.raises(AssertionError, match=r"unexpected command\(s\): \['rm -rf /tmp/x'\]"):
        transports["spark-1"].verify()


def test_a_bug_while_gathering_facts_fails_that_host_instead_of_vanishing(thread_exceptions):
    def parser_bug(command: Command) -> None:
        raise ValueError("unexpected probe output")

    transports = {
        "spark-1": StrictTransport("spark-1").expect_probe(PROBE_TEXT).expect("echo hi"),
        "spark-2": StrictTransport("spark-2").expect(re.compile("@@sparkcluster@@"), before=parser_bug)
        .expect("echo hi", times=0),  # a host whose facts failed must not run steps
    }
    result, recorder = run(NAMES[:2], playbook(Play("p", "all", (call("command.run", cmd="echo hi"),))), transports)
    facts_failures = [e for e in recorder.of("spark-2") if e.step == "gather facts"]
    assert [(e.status, e.reason) for e in facts_failures] == [
        ("failed", "internal error in gather facts: ValueError: unexpected probe output")]
    assert result.exit_code == 1
    verify_all(transports)


def test_a_step_raising_system_exit_is_reported_as_failed(thread_exceptions):
    class Exits(Step):
        name = "test.exits"
        Args = NoArgs

        def check(self, ctx: HostContext) -> Plan:
            raise SystemExit(3)

    transports = {"spark-1": StrictTransport("spark-1")}
    result, recorder = run(NAMES[:1], playbook(Play("p", "all", (StepCall(Exits, {}, 1),), gather_facts=False)),
                           transports)
    assert recorder.finished() == [("spark-1", "test.exits", "failed")]
    assert result.exit_code == 1


# ---- interrupt ------------------------------------------------------------------------------------------
@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt, as under a terminal: a run started in the background by a shell without job
    control inherits SIGINT ignored, and interrupt_main() then does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class Interrupt:
    """Commands that block until the runner closes their transport (as a real SSH command would until the
    connection drops); once every one of them is blocked, Ctrl-C reaches the main thread."""

    def __init__(self, blocked: int) -> None:
        self.waiting = threading.Semaphore(0)
        self.blocked = blocked
        self.returned = threading.Semaphore(0)
        self.transports: dict[str, StrictTransport] = {}
        self.sent = threading.Event()

    def hook(self, host: str):
        def block(command: Command) -> None:
            self.waiting.release()
            try:
                if not self.transports[host].closed.wait(timeout=10):
                    raise AssertionError(f"{host}: the runner never closed the connection after the interrupt")
            finally:
                self.returned.release()
        return block

    def start(self) -> None:
        """Once every blocking command is in flight, press Ctrl-C (from a helper thread, into the main thread)."""
        def press() -> None:
            for _ in range(self.blocked):
                if not self.waiting.acquire(timeout=10):
                    return
            self.sent.set()
            _thread.interrupt_main()
        threading.Thread(target=press, daemon=True).start()

    def join(self) -> None:
        for _ in range(self.blocked):
            assert self.returned.acquire(timeout=10), "a blocked command never returned"


def test_interrupt_mid_play_exits_130_with_the_partial_recap_as_events(thread_exceptions, ctrl_c_raises):
    interrupt = Interrupt(blocked=2)
    transports = {}
    for name in NAMES[:2]:
        transports[name] = (StrictTransport(name, ordered=True).expect_probe(PROBE_TEXT).expect("step-one")
                            .expect("step-two", unreachable=True, before=interrupt.hook(name)))
    interrupt.transports = transports
    book = playbook(
        Play("first", "all", (call("command.run", cmd="step-one"), call("command.run", cmd="step-two"),
                              call("command.run", cmd="step-three"))),
        Play("second", "all", (call("command.run", cmd="never"),)),
    )
    interrupt.start()
    result, recorder = run(NAMES[:2], book, transports)
    interrupt.join()  # the blocked commands have returned (the runner's threads are done with them)

    assert interrupt.sent.is_set()
    assert result.interrupted and result.exit_code == 130
    # the partial recap: what finished before Ctrl-C, and nothing after
    assert recorder.finished() == [("spark-1", "command.run", "changed"), ("spark-2", "command.run", "changed")]
    assert result.recap == recorder.recap_at_finish == {"spark-1": HostRecap(changed=1), "spark-2": HostRecap(changed=1)}
    assert result.failures == {}
    assert recorder.events[-1] is result  # a thread finishing late added no event after the recap
    kinds = [type(e) for e in recorder.events]
    assert kinds[:2] == [RunStarted, PlayStarted] and PlayFinished not in kinds
    assert [e.play for e in recorder.events if isinstance(e, PlayStarted)] == ["first"]
    assert sorted(e.host for e in recorder.events if isinstance(e, StepStarted) and e.step == "command.run") == [
        "spark-1", "spark-1", "spark-2", "spark-2"]  # step-one and step-two; step-three never started
    assert all(t.closed.is_set() for t in transports.values())
    verify_all(transports)  # step-three and the second play never ran
    assert thread_exceptions == []


def test_interrupt_while_gathering_facts_exits_130_with_an_empty_recap(thread_exceptions, ctrl_c_raises):
    interrupt = Interrupt(blocked=2)
    transports = {name: StrictTransport(name).expect(re.compile("@@sparkcluster@@"), unreachable=True,
                                                     before=interrupt.hook(name)) for name in NAMES[:2]}
    interrupt.transports = transports
    interrupt.start()
    result, recorder = run(NAMES[:2], playbook(Play("p", "all", (call("command.run", cmd="never"),))), transports)
    interrupt.join()

    assert result.exit_code == 130 and result.interrupted
    assert result.recap == recorder.recap_at_finish == {name: HostRecap() for name in NAMES[:2]}
    assert [type(e) for e in recorder.events] == [RunStarted, PlayStarted, RunFinished]
    verify_all(transports)
    assert thread_exceptions == []


# ---- a peer that is gone -------------------------------------------------------------------------------
def test_a_peer_that_dropped_off_is_blamed_instead_of_the_node_that_reached_for_it(thread_exceptions):
    """A cross-node step on the head (as ssh.mesh and preflight.fabric are) reaches for a worker that died
    between plays: the worker is the unreachable one, and the head's step runs again without it."""
    class TouchEveryPeer(Step):
        name = "test.peers"
        Args = NoArgs

        def check(self, ctx: HostContext) -> Plan:
            peers = [n for n in ctx.all_facts if n != ctx.host.name]
            ctx.probe_peers(peers)
            return Plan(f"reached {', '.join(peers)}")

    transports = {name: StrictTransport(name).expect_probe(PROBE_TEXT).expect("echo alive") for name in NAMES}
    transports["spark-2"].expect("true", times=2)  # asked once, then again when the step runs without spark-3
    transports["spark-3"].expect("true", unreachable=True)  # it died after the first play
    book = playbook(Play("first", "all", (call("command.run", cmd="echo alive"),)),
                    Play("mesh", "head", (StepCall(TouchEveryPeer, {}, 1),)))
    result, recorder = run(NAMES, book, transports)
    assert ("spark-1", "test.peers", "ok") in recorder.finished()
    assert [e.reason for e in recorder.of("spark-1") if e.step == "test.peers"] == ["reached spark-2"]
    assert [(e.step, e.status) for e in recorder.of("spark-3")] == [("command.run", "changed"),
                                                                     ("test.peers", "unreachable")]
    assert set(result.failures) == {"spark-3"} and result.exit_code == 1
    assert not thread_exceptions
    verify_all(transports)
