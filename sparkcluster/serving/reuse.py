"""When `serve` or `up` may keep what already runs: a Ray cluster is reused only if it was started by the same
commands (image, docker arguments, cache mount, recipe env) on nodes whose comm env file has not changed since,
which a fingerprint recorded on the head tells; a running container alone cannot (its env file was read when it
started)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from ..engine.command import Command
from ..engine.session import Session
from ..engine.transport import remote_path
from ..node.network import comm_env_path


def ray_fingerprint(session: Session, commands: Mapping[str, Command]) -> str:
    """A digest of every node's Ray start command and comm env file, in the inventory's order."""
    digest = hashlib.sha256()
    for host in session.hosts:
        env = session.transport(host).read_file(remote_path(comm_env_path(host))) or b""
        for part in (host.name.encode(), commands[host.name].script.encode(), env):
            digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:32]
