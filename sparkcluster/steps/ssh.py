"""ssh.mesh: every node reaches every other node's fabric addresses without a password, with strict host
keys (never StrictHostKeyChecking=no): the head to start workers, and node to node for staging's chain.
Run on the head; it works through every node's own connection.

Host keys come from our own verified connections to the nodes, so nothing is trusted on first use.
"""

from __future__ import annotations

import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .base import HostContext, Plan, Step, StepFailed, register
from .preflight import qsfp_of
from ..command import Command

KEY = "~/.ssh/id_ed25519"
PROBE_OPTS = "-o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=5"
AUTHORIZE = ('umask 077; mkdir -p ~/.ssh; k=$(cat); touch ~/.ssh/authorized_keys; '
             'grep -qxF "$k" ~/.ssh/authorized_keys || printf "%s\\n" "$k" >> ~/.ssh/authorized_keys')


@dataclass(frozen=True)
class Node:
    user: str
    ip: str  # the QSFP address peers use
    addresses: tuple[str, ...]  # every address of its QSFP twins (all go into known_hosts)


@dataclass(frozen=True)
class MeshArgs:
    pass


@register
class SshMesh(Step):
    name = "ssh.mesh"
    Args = MeshArgs
    fix = "check ~/.ssh on both nodes"

    def _nodes(self, ctx: HostContext) -> dict[str, Node]:
        out = {}
        for h in ctx.inventory.hosts:
            facts = ctx.all_facts.get(h.name)
            if facts is None:
                continue
            q = qsfp_of(ctx, h.name)
            addresses = tuple(a.split("/")[0] for twin in q.twins if (i := facts.interface(twin)) for a in i.ipv4)
            out[h.name] = Node(facts.user, q.ip, addresses or (q.ip,))
        return out

    def _missing(self, ctx: HostContext, nodes: dict[str, Node]) -> list[tuple[str, str]]:
        """(from, to) pairs where `from` cannot yet ssh to `to`'s fabric address."""
        def probe(source: str) -> list[tuple[str, str]]:
            targets = {n: node for n, node in nodes.items() if n != source}
            probes = " ".join(
                f"(ssh {PROBE_OPTS} {shlex.quote(f'{t.user}@{t.ip}')} true </dev/null >/dev/null 2>&1 "
                f"|| echo {shlex.quote(name)}) &" for name, t in targets.items())
            out = ctx.transports[source].run(Command(f"{probes} wait", timeout=30)).stdout
            return [(source, target) for target in sorted(out.split())]

        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            return [pair for pairs in pool.map(probe, nodes) for pair in pairs]

    def check(self, ctx: HostContext) -> Plan:
        nodes = self._nodes(ctx)
        if len(nodes) < 2:
            return Plan("a single node")
        missing = self._missing(ctx, nodes)
        if not missing:
            return Plan(f"all {len(nodes)} nodes reach each other over the fabric without a password")
        shown = []
        for source, target in missing:
            shown += [Command(f"on {source}: test -f {KEY} || ssh-keygen -q -t ed25519 -N '' -f {KEY}"),
                      Command(f"authorize {source}'s key on {target}"),
                      Command(f"record {target}'s host key for {', '.join(nodes[target].addresses)} on {source}")]
        pairs = ", ".join(f"{s}->{t}" for s, t in missing)
        return Plan(f"set up passwordless ssh {pairs}", tuple(shown))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        nodes = self._nodes(ctx)
        for source, target in self._missing(ctx, nodes):
            sender, receiver = ctx.transports[source], ctx.transports[target]
            keygen = sender.run(Command(f"umask 077; mkdir -p ~/.ssh; test -f {KEY} || "
                                        f"ssh-keygen -q -t ed25519 -N '' -f {KEY}; cat {KEY}.pub"))
            if not keygen.ok:
                raise StepFailed(f"could not create an ssh key on {source}", self.fix, keygen)
            authorized = receiver.run(Command(AUTHORIZE, stdin=keygen.stdout.strip() + "\n"))
            if not authorized.ok:
                raise StepFailed(f"could not authorize {source}'s key on {target}", self.fix, authorized)
            kind, key = receiver.host_key()
            addresses = nodes[target].addresses
            # Drop stale entries for these addresses (a re-imaged node), then record the verified key.
            forget = "; ".join(f"ssh-keygen -R {shlex.quote(a)} >/dev/null 2>&1" for a in addresses)
            line = f"{','.join(addresses)} {kind} {key}"
            recorded = sender.run(Command(f"umask 077; touch ~/.ssh/known_hosts; {forget}; "
                                          f"printf '%s\\n' {shlex.quote(line)} >> ~/.ssh/known_hosts"))
            if not recorded.ok:
                raise StepFailed(f"could not record {target}'s host key on {source}", self.fix, recorded)
