"""A recipe's mods on the nodes: copied to every node, then run where vLLM will start (in the vllm_node container
with the docker runtime, in the host runtime's serving directory), before vLLM starts. A mod that fails stops the
serve with its output: a half-patched cluster must not serve."""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import remote_path
from ..recipes.mods import NODE_MODS_DIR, mod_files, run_mods_line
from ..recipes.types import Mod
from .launch import CONTAINER
from .nodes import node_env
from .runtime import RuntimeChoice

CONTAINER_MODS_DIR = "/tmp/sparkcluster-mods"
MOD_TIMEOUT_S = 600


def copy_mods(session: Session, mods: Sequence[Mod]) -> None:
    """Every mod's files to `~/.cache/sparkcluster/mods/<name>` on every node, replacing an older copy."""
    files = {mod.name: mod_files(mod) for mod in mods}

    def one(host: Host) -> None:
        dirs = sorted({posixpath.dirname(f"{NODE_MODS_DIR}/{name}/{rel}") for name, fs in files.items()
                       for rel, _, _ in fs})
        clear = " ".join(shlex.quote(f"{NODE_MODS_DIR}/{name}") for name in files)
        result = session.run(host, Command(f"cd && rm -rf {clear} && mkdir -p {' '.join(map(shlex.quote, dirs))}",
                                           timeout=60))
        if not result.ok:
            raise SparkclusterError(f"{host.name}: preparing {NODE_MODS_DIR} failed: {result.stderr_tail(2)}",
                                    "check the disk and the home directory's permissions on that node")
        transport = session.transport(host)
        for name, fs in files.items():
            for rel, content, mode in fs:
                transport.write_file_atomic(remote_path(f"~/{NODE_MODS_DIR}/{name}/{rel}"), content, mode)
    session.each(one)


def mods_command(runtime: RuntimeChoice, session: Session, host: Host, mods: Sequence[Mod]) -> Command:
    """The command that runs every mod on `host` in vLLM's start directory, stopping at the first failure."""
    if runtime.name == "docker":
        line = run_mods_line(mods, CONTAINER_MODS_DIR)
        copy = (f"docker exec {CONTAINER} mkdir -p {CONTAINER_MODS_DIR} && "
                f"docker cp \"$HOME/{NODE_MODS_DIR}/.\" {CONTAINER}:{CONTAINER_MODS_DIR}/")
        run = shlex.join(["docker", "exec", "-i", CONTAINER, "sh", "-c", line])
        return Command(f"{copy} && {run} 2>&1", timeout=MOD_TIMEOUT_S)
    line = run_mods_line(mods, f"\"$HOME\"/{NODE_MODS_DIR}")
    inner = runtime.on(host).run_in_env(["sh", "-c", line], node_env(session.inventory, host))
    return Command(f"{{ {inner.script}\n}} 2>&1", timeout=MOD_TIMEOUT_S)


def run_mods(session: Session, runtime: RuntimeChoice, mods: Sequence[Mod]) -> None:
    """Every mod on every node (in parallel); the first failure stops the serve with that node's mod output."""
    def one(host: Host) -> None:
        result = session.run(host, mods_command(runtime, session, host, mods))
        if not result.ok:
            tail = "\n    ".join((result.stdout + result.stderr).strip().splitlines()[-20:]) or "(no output)"
            raise SparkclusterError(f"a mod failed on {host.name} (exit {result.exit_code}); its output:\n    {tail}",
                                    "fix the mod (its run.sh runs with WORKSPACE_DIR set to vLLM's start "
                                    "directory), or serve without it")
    session.each(one)
