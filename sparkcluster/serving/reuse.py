"""When `serve` or `up` may keep what already runs: a Ray cluster is reused only if it was started by the same
commands (image, docker arguments, cache mount, recipe env) on nodes whose comm env file has not changed since,
which a fingerprint recorded on the head tells; a running container alone cannot (its env file was read when it
started). Mods patch the running container: a cluster a recipe's mods were applied to is never reused."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from ..engine.command import Command
from ..engine.session import Session
from ..engine.transport import remote_path
from ..node.network import comm_env_path
from ..recipes.mods import mod_files
from ..recipes.types import Mod


def ray_fingerprint(session: Session, commands: Mapping[str, Command], mods: Sequence[Mod] = ()) -> str:
    """A digest of every node's Ray start command and comm env file, in the inventory's order, then of every mod
    applied (its name and files): mods patch the running container, so a cluster patched by other mods (or by
    any, when none are asked for now) is not the one to serve from."""
    digest = hashlib.sha256()
    for host in session.hosts:
        env = session.transport(host).read_file(remote_path(comm_env_path(host))) or b""
        # stdin: the secrets a start command carries off its line (a changed HF_TOKEN is a changed start)
        command = commands[host.name]
        for part in (host.name.encode(), command.script.encode(), (command.stdin or "").encode(), env):
            digest.update(len(part).to_bytes(8, "big") + part)
    for mod in mods:
        for rel, content, mode in [(".", mod.name.encode(), 0), *mod_files(mod)]:
            for part in (rel.encode(), content, str(mode).encode()):
                digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:32]


def may_reuse(recorded: str | None, fingerprint: str, mods: Sequence[Mod]) -> bool:
    """Reuse only a cluster started by the same commands and left unpatched: mods about to run would patch a
    container they (or others) already patched, and a patch applied twice fails or doubles."""
    return not mods and recorded == fingerprint
