"""packages.present: Debian packages installed with apt (needs sudo)."""

from __future__ import annotations

from dataclasses import dataclass

from ..command import Command
from .base import HostContext, Plan, Step, register


@dataclass(frozen=True)
class PackagesArgs:
    names: tuple[str, ...]


@register
class PackagesPresent(Step):
    name = "packages.present"
    Args = PackagesArgs
    fix = "check the node's apt sources and network, or install the packages by hand"

    def _query(self) -> Command:
        return Command.argv(["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *self.args.names])

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        return (self._query(),)

    def check(self, ctx: HostContext) -> Plan:
        out = ctx.read(self._query()).stdout
        # "hold ok installed" is installed too: a held package is the user's choice, not something to reinstall.
        installed = {line.split()[0] for line in out.splitlines() if line.endswith(" ok installed")}
        missing = [n for n in self.args.names if n not in installed]
        if not missing:
            return Plan(f"installed: {', '.join(self.args.names)}")
        install = Command.argv(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                               sudo=True, env={"DEBIAN_FRONTEND": "noninteractive"}, timeout=900)
        return Plan(f"missing: {', '.join(missing)}", (Command("apt-get update -q", sudo=True, timeout=600), install))
