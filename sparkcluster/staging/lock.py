"""One `stage` of a model at a time on a node: two runs that share a node's partial directory would step on each
other's partial blob, and each would tell its user that a copy failed. A run holds, on every node, a per-model
`flock` for as long as it lives: the lock is held by a shell whose stdin is this run's SSH channel, so it goes
away with the run however the run ends (done, Ctrl-C, SIGKILL, the control machine powered off), and never needs
a stale-lock rule. A second run is refused at once with the first one's command, PID and start time (exit 1).

Nodes are locked one by one in inventory order: of two runs started together, the one that gets the first node
gets them all, and the other is refused there instead of both being refused half-way.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.modelref import ModelRef
from ..engine.remote import HF_HOME
from ..engine.session import Session
from ..engine.transport import Held

LOCKED, BUSY = "locked", "busy"
# The first line of stdin is who holds it; the lock file keeps it for the next run to read. `<>` opens the file
# without truncating it, so a refused run never wipes the holder's words; the holder rewrites them once it holds.
_HOLD = """d="{root}/sparkcluster-locks" && mkdir -p "$d" && exec 9<>"$d/{name}" || exit 1
IFS= read -r holder
if flock -n 9; then : > "$d/{name}"; printf '%s\\n' "$holder" >&9; echo {locked}; exec cat >/dev/null
else printf '{busy} %s\\n' "$(head -c 400 "$d/{name}")"; fi"""


class StageBusy(SparkclusterError):
    """Another run is staging this model on a node (exit 1)."""


def holder_text(model: ModelRef) -> str:
    """Who this run is, on one line: enough for the other user to find it and decide."""
    command = shlex.join(["sparkcluster", *sys.argv[1:]]).replace("\n", " ")[:200]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"`{command}` (pid {os.getpid()} on {socket.gethostname()}, since {started})"


def hold_command(model: ModelRef, holder: str) -> Command:
    name = f"stage-{model.dir_name}.lock"
    return Command(_HOLD.format(root=HF_HOME, name=name, locked=LOCKED, busy=BUSY), stdin=holder + "\n",
                   timeout=30)


@contextmanager
def staging_lock(session: Session, model: ModelRef) -> Iterator[None]:
    """Hold `model`'s staging lock on every node of the session while the block runs."""
    held: list[Held] = []
    command = hold_command(model, holder_text(model))
    try:
        for host in session.hosts:  # in order: see the module's docstring
            answer, handle = session.transport(host).hold(command)
            held.append(handle)
            if answer.startswith(BUSY):
                raise StageBusy(f"{host.name}: another run is staging {model} there: {answer[len(BUSY):].strip()}",
                                "wait for it to finish (its result is the same copy), or stop it and run again")
            if answer != LOCKED:
                raise SparkclusterError(f"{host.name}: could not take the staging lock for {model}: {answer}",
                                        "staging needs `flock` (util-linux) and a writable HF cache on the node")
        yield
    finally:
        for handle in reversed(held):
            handle.release()
