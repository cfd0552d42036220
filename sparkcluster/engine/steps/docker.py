"""docker.group: the login user may talk to the Docker daemon without sudo (docs/failure-modes.md F12)."""

from __future__ import annotations

from dataclasses import dataclass

from ..command import Command
from .base import HostContext, Plan, Step, StepFailed, register


@dataclass(frozen=True)
class DockerGroupArgs:
    group: str = "docker"
    needed: bool = True  # false for `--runtime host`


@register
class DockerGroup(Step):
    name = "docker.group"
    Args = DockerGroupArgs
    fix = "run `sudo usermod -aG docker $USER` on the node, or re-run bootstrap with --ask-become-pass"

    def _user(self, ctx: HostContext) -> str:
        facts = ctx.facts
        return facts.user if facts and facts.user else (ctx.host.user or "")

    def check(self, ctx: HostContext) -> Plan:
        if not self.args.needed:
            return Plan("the host runtime needs no Docker", skip=True)
        user, group = self._user(ctx), self.args.group
        entry = ctx.run(Command.argv(["getent", "group", group]))
        if not entry.ok:
            raise StepFailed(f"there is no {group} group: Docker is not installed",
                             "install Docker (DGX OS ships it; else sudo apt-get install docker.io)")
        members = entry.stdout.strip().split(":")[3].split(",") if entry.stdout.count(":") >= 3 else []
        if user in members:
            return Plan(f"{user} is in group {group}")
        return Plan(f"add {user} to group {group}", (Command.argv(["usermod", "-aG", group, user], sudo=True),))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        super().apply(ctx, plan)
        # The group only reaches new login sessions: prove it with one.
        ctx.transport.reconnect()
        probe = ctx.run(Command("docker ps -q"))
        if not probe.ok:
            raise StepFailed(f"`docker ps` still fails in a new session: {probe.stderr_tail(3)}",
                             "check that the daemon runs (sudo systemctl status docker)", probe)
