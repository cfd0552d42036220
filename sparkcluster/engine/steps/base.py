"""The Step contract: check() only reads and returns a Plan; apply() carries it out;
afterwards check() must return a no-op, or the step failed to converge."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..batch import batchable, run_batch, types_sudo_password
from ..command import Command
from ..facts import HostFacts
from ..inventory import Host, Inventory
from ..session import Session
from ..transport import Result, Transport


@dataclass(frozen=True)
class Upload:
    """A file written whole (write_file: its content on the stdin of an atomic write, never on a command line), shown
    as what it is rather than as that shell line. The content stays out of the plan's output (it may be long);
    --diff shows the change."""

    path: str  # as the step was given it: `~/x` is relative to the login user's home
    mode: str  # octal, as in the step's args: "0644"
    size: int  # bytes

    def display(self) -> str:
        return f"{self.path} ({self.size} bytes, mode {self.mode})"


@dataclass(frozen=True)
class Plan:
    """What apply() does, as three kinds of values, so prose can never be shown (or run) as shell:
    `commands` run on this step's host (the only ones the default apply() runs), `uploads` are files written
    whole (write_file), and `notes` say in words what apply() does through other means (on other nodes, through
    staging), rendered as "would: ..." and never as commands."""

    reason: str  # why: "already in group docker", "spark is not in group docker"
    commands: tuple[Command, ...] = ()
    uploads: tuple[Upload, ...] = ()
    notes: tuple[str, ...] = ()
    skip: bool = False  # the step does not apply to this host
    diff: str | None = None  # for --diff: the file change this plan makes
    warnings: tuple[str, ...] = ()  # worth a person's attention, not a failure (e.g. MTU below 9000)
    # The host's facts as they will be once this plan is carried out (e.g. the fabric addresses it assigns). In
    # check mode nothing is carried out, so the runner hands these to the later steps instead of the facts read
    # from the host: they check against the planned state, and --check shows the whole plan.
    planned_facts: HostFacts | None = None

    @property
    def changes(self) -> bool:
        return bool(self.commands or self.uploads or self.notes) and not self.skip


@dataclass(frozen=True)
class NoArgs:
    """The Args of a step that takes none."""


class StepFailed(Exception):
    """A step could not do its job. Carries the command's result where there was one, and the fix."""

    def __init__(self, message: str, fix: str = "", result: Result | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.result = result


@dataclass
class HostContext:
    """What a step on `host` sees: its own connection and facts, and the session, whose facts are those of the
    hosts still in the run (a failed node is not a peer to set up), for steps on the head that also touch the
    workers (ssh.mesh, models.stage)."""

    host: Host
    session: Session
    check_mode: bool = False
    # Hosts whose facts are a plan's, not the host's (check mode: an earlier step would change them). What only
    # exists once applied (a planned address) cannot be probed on the wire yet: see is_planned().
    planned: frozenset[str] = frozenset()
    # The results of the play's reads, run in one exec before its steps (Step.reads), by command line. Each is
    # used once: the check after apply() reads afresh, and the runner empties it once anything was applied.
    prefetched: dict[str, Result] = field(default_factory=dict)

    def is_planned(self, name: str | None = None) -> bool:
        """Whether this host's (or `name`'s) facts are planned rather than read from it."""
        return (self.host.name if name is None else name) in self.planned

    @property
    def transport(self) -> Transport:
        return self.session.transports[self.host.name]

    @property
    def inventory(self) -> Inventory:
        return self.session.inventory

    @property
    def facts(self) -> HostFacts | None:
        return self.session.facts.get(self.host.name)

    @property
    def all_facts(self) -> Mapping[str, HostFacts]:
        return self.session.facts

    @property
    def transports(self) -> Mapping[str, Transport]:
        return self.session.transports

    def run(self, command: Command) -> Result:
        return self.transport.run(command)

    def probe_peers(self, names: Iterable[str]) -> None:
        """Before this node is blamed for not reaching `names`: each must answer over its own SSH connection.
        One that does not raises its own Unreachable, which the runner puts on that node, not on this one."""
        for name in names:
            if name in self.transports:
                self.transports[name].run(Command("true", timeout=15))

    def read(self, command: Command) -> Result:
        """A read-only command's Result: the one this play's batch already brought (when the step declared the
        command in reads()), else it runs now."""
        if command.stdin is None:
            result = self.prefetched.pop(command.line(), None)
            if result is not None:
                return result
        return self.transport.run(command)

    def must_read(self, command: Command, fix: str = "") -> Result:
        """read(), failing the step when the command fails."""
        return self._ok(command, self.read(command), fix)

    def must(self, command: Command, fix: str = "") -> Result:
        return self._ok(command, self.transport.run(command), fix)

    def apply_then_read(self, changes: Sequence[Command], reads: Sequence[Command], fix: str = "") -> None:
        """must() each of `changes` in order, then run `reads`, all in one exec where the batch allows (engine/batch.py):
        the reads' Results are kept for the check after apply(), which so sees what the changes made without a round
        trip of its own. Alone, command by command, where the batch does not allow it (a password typed to sudo)."""
        joined = [*changes, *reads]
        # One change may read stdin (the exec has one); none may need a password typed to sudo.
        if (len(joined) < 2 or sum(c.stdin is not None for c in changes) > 1
                or not all(batchable(c, self.transport) for c in reads)
                or any(c.sudo for c in changes) and types_sudo_password(self.transport)):
            for command in changes:
                self.must(command, fix)
            return
        results = run_batch(self.transport, joined, changes=len(changes))
        if results is None or len(results) < len(changes) and results[len(results) - 1].ok:
            raise StepFailed(f"the changes on {self.host.name} did not come back whole (cut off or timed out): "
                             "what they did is unknown", "run again: the check reads the node afresh")
        for i, command in enumerate(changes):
            self._ok(command, results[i], fix)
        for i, command in enumerate(reads, start=len(changes)):
            self.prefetched[command.line()] = results[i]

    @staticmethod
    def _ok(command: Command, result: Result, fix: str) -> Result:
        if not result.ok:
            what = "timed out" if result.timed_out else f"exited {result.exit_code}"
            raise StepFailed(f"`{command.display()}` {what}", fix, result)
        return result


class Step:
    """Subclasses set `name` ("domain.resource"), an `Args` dataclass, and implement check()."""

    name: ClassVar[str]
    Args: ClassVar[type]
    # Verbs such as command.run: whenever their plan has commands they change something, and check() after
    # apply() cannot prove convergence, so it is not asked to.
    always_changes: ClassVar[bool] = False
    fix: ClassVar[str] = ""  # the default advice when one of this step's commands fails

    def __init__(self, args: Any) -> None:
        self.args = args

    def check(self, ctx: HostContext) -> Plan:
        raise NotImplementedError

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        """The read-only commands check() will make through ctx.read(): the runner runs those of every step of a
        play in one exec per host, before the first check. A command listed here must change nothing on the node,
        and must not depend on what another command printed (it runs before check() sees anything)."""
        return ()

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        for command in plan.commands:
            ctx.must(command, self.fix)

    @classmethod
    def arg_fields(cls) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(cls.Args)}


class StepRegistry(MutableMapping[str, type[Step]]):
    """Every step a playbook may name, by name. A package declares its steps' names and the module that defines each
    (declare()); that module is imported the first time a playbook names one of them, and registers its classes as
    it loads (@register). So loading a playbook imports only the steps it names: `preflight.disk` costs neither
    Docker's step module nor staging's. Iterating (a "known steps" list, a test over every step) loads them all."""

    def __init__(self) -> None:
        self._loaded: dict[str, type[Step]] = {}
        self._declared: dict[str, str] = {}  # name -> the module that registers it

    def declare(self, module: str, names: Iterable[str]) -> None:
        for name in names:
            if self._declared.get(name, module) != module:
                raise RuntimeError(f"step {name} declared by {self._declared[name]} and {module}")
            self._declared[name] = module

    def add(self, cls: type[Step]) -> None:
        if cls.name in self._loaded:
            raise RuntimeError(f"step {cls.name} registered twice")
        self._loaded[cls.name] = cls

    def __getitem__(self, name: str) -> type[Step]:
        if name not in self._loaded and name in self._declared:
            importlib.import_module(self._declared[name])
            if name not in self._loaded:  # the table and the module disagree: a packaging bug, not bad input
                raise RuntimeError(f"{self._declared[name]} was declared to register step {name} but did not")
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._declared

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._loaded.keys() | self._declared.keys()))

    def __len__(self) -> int:
        return len(self._loaded.keys() | self._declared.keys())

    def __setitem__(self, name: str, cls: type[Step]) -> None:
        self._loaded[name] = cls

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self._loaded.pop(name, None)
        self._declared.pop(name, None)


REGISTRY = StepRegistry()


def register(cls: type[Step]) -> type[Step]:
    REGISTRY.add(cls)
    return cls


def declare(module: str, *names: str) -> None:
    """`names` are steps that `module` registers when imported (see StepRegistry)."""
    REGISTRY.declare(module, names)
