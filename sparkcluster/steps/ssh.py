"""ssh.mesh: the head reaches every worker over its fabric address without a password, with strict host
keys (never StrictHostKeyChecking=no). Run on the head; touches the workers through their own connections.

The workers' host keys come from our own verified connections to them, so nothing is trusted on first use.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from .base import HostContext, Plan, Step, StepFailed, register
from .preflight import qsfp_of
from ..command import Command

KEY = "~/.ssh/id_ed25519"
PROBE_OPTS = "-o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5"
AUTHORIZE = ('umask 077; mkdir -p ~/.ssh; k=$(cat); touch ~/.ssh/authorized_keys; '
             'grep -qxF "$k" ~/.ssh/authorized_keys || printf "%s\\n" "$k" >> ~/.ssh/authorized_keys')


@dataclass(frozen=True)
class MeshArgs:
    pass


@register
class SshMesh(Step):
    name = "ssh.mesh"
    Args = MeshArgs
    fix = "check ~/.ssh on the head and the workers"

    def _targets(self, ctx: HostContext) -> dict[str, tuple[str, str, tuple[str, ...]]]:
        """worker -> (login user, fabric ip, every QSFP address it has)."""
        out = {}
        for h in ctx.inventory.workers:
            facts = ctx.all_facts.get(h.name)
            if facts is None:
                continue
            q = qsfp_of(ctx, h.name)
            addresses = tuple(a.split("/")[0] for twin in q.twins
                              if (i := facts.interface(twin)) for a in i.ipv4)
            out[h.name] = (facts.user, q.ip, addresses or (q.ip,))
        return out

    def _unreachable(self, ctx: HostContext, targets: dict) -> list[str]:
        probes = " ".join(
            f"(ssh {PROBE_OPTS} {shlex.quote(f'{user}@{ip}')} true </dev/null >/dev/null 2>&1 "
            f"|| echo {shlex.quote(name)}) &" for name, (user, ip, _) in targets.items())
        return sorted(ctx.run(Command(f"{probes} wait", timeout=30)).stdout.split())

    def check(self, ctx: HostContext) -> Plan:
        targets = self._targets(ctx)
        if not targets:
            return Plan("no workers")
        failing = self._unreachable(ctx, targets)
        if not failing:
            return Plan(f"reaches {', '.join(f'{n} ({t[1]})' for n, t in targets.items())} without a password")
        shown = [Command(f"test -f {KEY} || ssh-keygen -q -t ed25519 -N '' -f {KEY}")]
        for name in failing:
            shown += [Command(f"authorize the head's key on {name}"),
                      Command(f"record {name}'s host key for {', '.join(targets[name][2])} in the head's known_hosts")]
        return Plan(f"set up passwordless ssh to {', '.join(failing)}", tuple(shown))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        targets = self._targets(ctx)
        failing = self._unreachable(ctx, targets)
        ctx.must(Command(f"umask 077; mkdir -p ~/.ssh; test -f {KEY} || ssh-keygen -q -t ed25519 -N '' -f {KEY}"))
        public = ctx.must(Command(f"cat {KEY}.pub")).stdout.strip()
        for name in failing:
            user, ip, addresses = targets[name]
            worker = ctx.transports[name]
            result = worker.run(Command(AUTHORIZE, stdin=public + "\n"))
            if not result.ok:
                raise StepFailed(f"could not add the head's key to {name}'s authorized_keys", self.fix, result)
            kind, key = worker.host_key()
            # Drop stale entries for these addresses (a re-imaged worker), then record the verified key.
            forget = "; ".join(f"ssh-keygen -R {shlex.quote(a)} >/dev/null 2>&1" for a in addresses)
            line = f"{','.join(addresses)} {kind} {key}"
            ctx.must(Command(f"umask 077; touch ~/.ssh/known_hosts; {forget}; "
                             f"printf '%s\\n' {shlex.quote(line)} >> ~/.ssh/known_hosts"))
