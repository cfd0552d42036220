"""command.run: run a command (a verb, always 'changed'), unless `creates` already exists."""

from __future__ import annotations

from dataclasses import dataclass

from ..command import Command, shell_path
from .base import HostContext, Plan, Step, register


@dataclass(frozen=True)
class CommandRunArgs:
    cmd: str
    sudo: bool = False
    creates: str = ""  # a path whose existence means the work was already done
    fix: str = ""


@register
class CommandRun(Step):
    name = "command.run"
    Args = CommandRunArgs
    always_changes = True

    def check(self, ctx: HostContext) -> Plan:
        if self.args.creates:
            exists = ctx.run(Command(f"test -e {shell_path(self.args.creates)}")).ok
            if exists:
                return Plan(f"{self.args.creates} exists")
        return Plan(f"run {self.args.cmd}", (Command(self.args.cmd, sudo=self.args.sudo),))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        for command in plan.commands:
            ctx.must(command, self.args.fix)
