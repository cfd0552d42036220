"""ssh.mesh: every node reaches every other node's fabric addresses without a password, with strict host
keys (never StrictHostKeyChecking=no): the head to start workers, and node to node for staging's chain.
Run on the head; it works through every node's own connection.

Host keys come from our own verified connections to the nodes, so nothing is trusted on first use.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import shlex
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...engine.command import Command
from ...engine.remote import STRICT_SSH
from ...engine.steps.base import HostContext, NoArgs, Plan, Step, StepFailed, register
from .preflight import qsfp_of, ring_of

KEY = "~/.ssh/id_ed25519"
# The login proof offers curve25519 key exchange first. OpenSSH's default, sntrup761x25519, makes the client generate
# a post-quantum key pair per login: 0.12 s of the head's CPU per worker on a simulated node (OpenSSH 9.2), against
# 0.01 s. The proof sends no data, so a post-quantum exchange protects nothing here; a server that does not offer
# curve25519 still negotiates one of the defaults that follow it (`^`: put first, keep the rest).
PROBE_OPTS = shlex.join([*STRICT_SSH, "-o", "ConnectTimeout=10",
                         "-o", "KexAlgorithms=^curve25519-sha256,curve25519-sha256@libssh.org"])


def _logins(nodes: dict[str, Node], head: str) -> str:
    """Shell that tries one login from the head to each worker, all at once, and prints `@proved NAME` for each
    that let it in, before the reads print anything (so no line of theirs is cut by one of these). A head without
    its key (a cold run) tries none: no login could succeed, and each failed handshake would hold the read up."""
    tries = "".join(f"(ssh {PROBE_OPTS} {shlex.quote(f'{t.user}@{t.ip}')} true </dev/null >/dev/null 2>&1 "
                    f"&& echo @proved {shlex.quote(name)}) & " for name, t in nodes.items() if name != head)
    return f"[ -f {KEY} ] && ( {tries}wait ); "


@dataclass(frozen=True)
class Node:
    user: str
    ip: str  # the QSFP address peers use
    addresses: tuple[str, ...]  # every address of its QSFP twins (all go into known_hosts)


@dataclass(frozen=True)
class Link:
    """One login that does not work yet: `source`'s key goes into `target`'s authorized_keys, and `target`'s
    verified host key into `source`'s known_hosts, once for each of `target`'s addresses."""

    source: str
    target: str
    addresses: tuple[str, ...]
    # Those of `addresses` that source's known_hosts already has an entry for (a stale key, or a partial record):
    # dropped before the verified key goes in. None: all of them. A fresh node has none, so it runs no ssh-keygen -R.
    recorded: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MeshPlan(Plan):
    """The links check() found missing: apply() sets up exactly these, reading no node's files again."""

    links: tuple[Link, ...] = ()


@register
class SshMesh(Step):
    name = "ssh.mesh"
    Args = NoArgs
    fix = "check ~/.ssh on both nodes"

    def _nodes(self, ctx: HostContext) -> dict[str, Node]:
        out = {}
        ring = ring_of(ctx) is not None
        for h in ctx.inventory.hosts:
            facts = ctx.all_facts.get(h.name)
            if facts is None:
                continue
            q = qsfp_of(ctx, h.name)
            if ring:  # a link's address reaches one neighbour: every node reaches the control-plane address
                out[h.name] = Node(facts.user, h.address, (h.address,))
                continue
            addresses = tuple(str(a.ip) for twin in q.twins if (i := facts.interface(twin)) for a in i.ipv4)
            out[h.name] = Node(facts.user, q.ip, addresses or (q.ip,))
        return out

    def _missing(self, ctx: HostContext, nodes: dict[str, Node], prove: bool) -> tuple[list[Link], set[str]]:
        """The links (from, to) where `from`'s key is not authorized on `to`, or `to`'s verified host key is not
        what `from` has on record for each of its addresses. Read from the files, one round trip per node:
        probing every pair with ssh would cost N*(N-1) handshakes. With `prove`, the head's round trip also
        tries one real login to each worker, at the same time (a second round trip after the reads would only
        wait longer): the workers that let it in come back as the second value."""
        host_keys = {name: ctx.transports[name].host_key() for name in nodes}
        head = ctx.inventory.head.name
        proved: set[str] = set()

        def read(name: str) -> tuple[str, set[str], dict[str, set[tuple[str, str]]]]:
            others = [a for n, node in nodes.items() if n != name for a in node.addresses]
            logins = _logins(nodes, head) if prove and name == head else ""
            # known_hosts comes whole and is matched here (known_host_keys): an `ssh-keygen -F` per address was two
            # processes per address on every node (14 addresses a node at 8 nodes), twice in a cold run.
            out = ctx.transports[name].run(Command(
                f"{logins}sed 's/^/@pub /' {KEY}.pub 2>/dev/null; sed 's/^/@auth /' ~/.ssh/authorized_keys 2>/dev/null; "
                "sed 's/^/@kh /' ~/.ssh/known_hosts 2>/dev/null; true", timeout=30)).stdout
            public, authorized = "", set()
            recorded: list[str] = []
            for line in out.splitlines():
                tag, _, rest = line.partition(" ")
                if tag == "@proved":
                    proved.add(rest.strip())
                elif tag == "@pub":
                    public = " ".join(rest.split()[:2])
                elif tag == "@auth":
                    authorized.add(" ".join(rest.split()[:2]) if rest.startswith("ssh-") else rest)
                elif tag == "@kh":
                    recorded.append(rest)
            return public, authorized, known_host_keys(recorded, others)

        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            state = dict(zip(nodes, pool.map(read, nodes)))
        missing = []
        for source, (public, _, known) in state.items():
            for target, node in nodes.items():
                if target == source:
                    continue
                authorized = public and any(public in entry for entry in state[target][1])
                recorded = all(host_keys[target] in known.get(a, set()) for a in node.addresses)
                if not (authorized and recorded):
                    missing.append(Link(source, target, node.addresses, tuple(a for a in node.addresses if known.get(a))))
        return missing, proved

    def _proved_from_head(self, ctx: HostContext, nodes: dict[str, Node], answered: set[str]) -> None:
        """The files say yes; the real login from the head to each worker (_logins) proves sshd agrees."""
        head = ctx.inventory.head.name
        workers = {name for name in nodes if name != head}
        failed = sorted(workers - answered)
        if failed:
            ctx.probe_peers(failed)  # a worker that is down is named as such, not as an sshd problem of the head's
            raise StepFailed(f"keys and known_hosts are in place, yet {head} cannot ssh to {', '.join(sorted(failed))}",
                             "check sshd on those nodes (AllowUsers, StrictModes: ~/.ssh must not be group-writable)")

    def check(self, ctx: HostContext) -> Plan:
        nodes = self._nodes(ctx)
        if len(nodes) < 2:
            return Plan("a single node")
        # Check mode: a planned fabric address takes no login yet.
        missing, proved = self._missing(ctx, nodes, prove=not ctx.planned)
        if not missing:
            if ctx.planned:
                return Plan(f"keys and host keys in place on all {len(nodes)} nodes; the logins over the planned "
                            "fabric addresses are proven when bootstrap applies them")
            self._proved_from_head(ctx, nodes, proved)
            return Plan(f"all {len(nodes)} nodes reach each other over the fabric without a password")
        links = tuple(missing)
        # What apply() does runs on other nodes than this one, so the plan says it in words, not as commands.
        notes: list[str] = []
        for link in links:
            keygen = f"create {link.source}'s key {KEY} unless it has one"
            notes += [*([] if keygen in notes else [keygen]),
                      f"authorize {link.source}'s key on {link.target}",
                      f"record {link.target}'s host key for {', '.join(link.addresses)} on {link.source}"]
        pairs = ", ".join(f"{link.source}->{link.target}" for link in missing)
        return MeshPlan(f"set up passwordless ssh {pairs}", notes=tuple(notes), links=links)

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        if not isinstance(plan, MeshPlan):
            raise TypeError(f"ssh.mesh applies the MeshPlan its check() returned, not {type(plan).__name__}")
        # Two round trips per node, every node at once: each source's key (made unless it has one), then each
        # node's one write (the keys it authorizes, the host keys it records), rather than an exec per link.
        sources = sorted({link.source for link in plan.links})
        with ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
            keys = dict(zip(sources, pool.map(lambda source: self._key_of(ctx, source), sources)))
        host_keys = {link.target: " ".join(ctx.transports[link.target].host_key()) for link in plan.links}
        writes = mesh_writes(plan.links, keys, host_keys)
        with ThreadPoolExecutor(max_workers=max(1, len(writes))) as pool:
            list(pool.map(lambda item: self._write(ctx, *item), writes.items()))

    def _key_of(self, ctx: HostContext, source: str) -> str:
        made = ctx.transports[source].run(Command(f"umask 077; mkdir -p ~/.ssh; test -f {KEY} || "
                                                  f"ssh-keygen -q -t ed25519 -N '' -f {KEY}; cat {KEY}.pub"))
        if not made.ok or not made.stdout.strip():
            raise StepFailed(f"could not create an ssh key on {source}", self.fix, made)
        return made.stdout.strip().splitlines()[-1]

    def _write(self, ctx: HostContext, node: str, command: Command) -> None:
        done = ctx.transports[node].run(command)
        if not done.ok:
            raise StepFailed(f"could not authorize the other nodes' keys or record their host keys on {node}",
                             self.fix, done)


def known_host_keys(lines: Iterable[str], addresses: Iterable[str]) -> dict[str, set[tuple[str, str]]]:
    """Per address, the (type, key) pairs that known_hosts `lines` record for it, as `ssh-keygen -F` finds them:
    a comma-separated host list (exact names, `*`/`?` patterns, a `!pattern` that excludes) or a hashed entry
    (`|1|salt|HMAC-SHA1(salt, host)`, Ubuntu's HashKnownHosts default). Comments, blank lines and marked lines
    (@cert-authority, @revoked: no host key of record) are not entries."""
    entries = []
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or fields[0].startswith(("#", "@")):
            continue
        entries.append((fields[0], (fields[1], fields[2])))
    known: dict[str, set[tuple[str, str]]] = {}
    for address in addresses:
        for hosts, key in entries:
            if _host_matches(hosts, address):
                known.setdefault(address, set()).add(key)
    return known


def _host_matches(hosts: str, address: str) -> bool:
    if hosts.startswith("|1|"):
        salt, _, digest = hosts[3:].partition("|")
        try:
            mac = hmac.new(base64.b64decode(salt), address.encode(), hashlib.sha1).digest()
            return hmac.compare_digest(mac, base64.b64decode(digest))
        except (ValueError, binascii.Error):
            return False
    matched = False
    for pattern in hosts.lower().split(","):
        negated = pattern.startswith("!")
        if fnmatch.fnmatchcase(address.lower(), pattern.lstrip("!")):
            if negated:
                return False
            matched = True
    return matched


def mesh_writes(links: tuple[Link, ...], keys: dict[str, str], host_keys: dict[str, str]) -> dict[str, Command]:
    """Per node, the one command that authorizes the keys of the sources that need it there and records, on a
    source, its targets' verified host keys (stale entries for those addresses dropped first: a re-imaged node).
    What it writes comes on stdin, tagged, so no key ever reaches a command line."""
    lines: dict[str, list[str]] = {}
    forget: dict[str, list[str]] = {}
    for link in links:
        lines.setdefault(link.target, []).append(f"@auth {keys[link.source]}")
        lines.setdefault(link.source, []).append(f"@known {','.join(link.addresses)} {host_keys[link.target]}")
        forget.setdefault(link.source, []).extend(f"ssh-keygen -R {shlex.quote(a)} -f ~/.ssh/known_hosts >/dev/null 2>&1; "
                                                  for a in (link.addresses if link.recorded is None else link.recorded))
    return {node: Command(WRITE.format(forget="".join(forget.get(node, []))),
                          stdin="\n".join(dict.fromkeys(tagged)) + "\n") for node, tagged in lines.items()}


# One node's write: authorized_keys gains each tagged key it lacks; known_hosts loses then regains its entries.
WRITE = ("umask 077; mkdir -p ~/.ssh; touch ~/.ssh/authorized_keys ~/.ssh/known_hosts; in=$(cat); {forget}"
         "printf '%s\\n' \"$in\" | sed -n 's/^@auth //p' | while IFS= read -r k; do "
         "grep -qxF \"$k\" ~/.ssh/authorized_keys || printf '%s\\n' \"$k\" >> ~/.ssh/authorized_keys; done; "
         "printf '%s\\n' \"$in\" | sed -n 's/^@known //p' >> ~/.ssh/known_hosts")
