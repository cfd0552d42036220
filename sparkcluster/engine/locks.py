"""Locks on the nodes that live exactly as long as the run that took them: one run of a kind at a time, however
the other one ends. A lock is an `flock` held by a shell whose stdin is this run's SSH channel (Transport.hold),
so it goes away with the run whatever happens to it (done, Ctrl-C, SIGKILL, the control machine powered off),
and no stale-lock rule is ever needed. A second run is refused at once with the first one's command, PID,
machine and start time (exit 1), never left to step on the first one's work.

Nodes are locked one by one in inventory order: of two runs started together, the one that gets the first node
gets them all, and the other is refused there, instead of both being refused half-way.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from .command import Command
from .errors import SparkclusterError
from .inventory import Host
from .secret_names import masked_argv
from .session import Session
from .transport import Held

LOCK_DIR = "${XDG_CACHE_HOME:-$HOME/.cache}/sparkcluster/locks"
LOCKED, BUSY = "locked", "busy"
_HOLDER = re.compile(r"\(pid (\d+) on (\S+), since ([^)]*)\)\s*$")
# The first line of stdin is who holds it; the lock file keeps it for the next run to read. `<>` opens the file
# without truncating it, so a refused run never wipes the holder's words; the holder rewrites them once it holds.
# Without flock, `flock -n` would fail as if the lock were held: say so instead.
# The folder 0700 and the file 0600 (umask, then chmod for files an older run made 0644): `flock` needs only a
# read-only open, so a file other users can read is a lock any of them can hold.
_HOLD = """command -v flock >/dev/null || {{ echo 'flock is not installed'; exit 0; }}
umask 077
d="{root}" && mkdir -p "$d" || exit 1
chmod 700 "$d" 2>/dev/null; exec 9<>"$d/{name}" || exit 1
chmod 600 "$d/{name}" 2>/dev/null
IFS= read -r holder
if flock -n 9; then : > "$d/{name}"; printf '%s\\n' "$holder" >&9; echo {locked}; exec cat >/dev/null
else printf '{busy} %s\\n' "$(head -c 400 "$d/{name}")"; fi"""


class Busy(SparkclusterError):
    """Another run holds the lock on a node (exit 1)."""


def this_run() -> str:
    """Who this run is, on one line: enough for another user to find it and decide. A secret on the command line
    (`serve -- --api-key KEY`) is masked: the lock file outlives the run, and a refused run prints it."""
    command = shlex.join(["sparkcluster", *masked_argv(sys.argv[1:])]).replace("\n", " ")[:200]
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"`{command}` (pid {os.getpid()} on {socket.gethostname()}, since {started})"


def hold_command(name: str, holder: str, root: str = LOCK_DIR) -> Command:
    return Command(_HOLD.format(root=root, name=f"{name}.lock", locked=LOCKED, busy=BUSY),
                   stdin=holder + "\n", timeout=30)


def busy(node: str, what: str, holder: str, fix: str, path: str) -> tuple[str, str]:
    """The refusal: the holder's words and `fix`; but a holder that was a run on this very machine whose process
    is gone left a stale lock (its SSH session outlived it on the node, e.g. across a partition): say so, and
    when it clears, rather than ask the user to stop a process that does not exist."""
    found = _HOLDER.search(holder)
    if not found or found[2] != socket.gethostname() or _alive(int(found[1])):
        return f"{node}: {what} is already running there: {holder}", fix
    return (f"{node}: a stale lock of {what}: its holder, pid {found[1]} on this machine (since {found[3]}), is "
            f"gone, but {node} has not yet seen its SSH session end; it clears when it does (when this machine's "
            "close of the connection reaches the node, often within minutes; at the latest at sshd's keepalive: "
            "ClientAliveInterval, else the kernel's, 2 hours)",
            f"run again in a minute; or end the orphaned session now: ssh {node} 'fuser -k \"{path}\"'; "
            f"`ClientAliveInterval 15` in {node}'s sshd_config bounds this to a minute")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


@contextmanager
def held(session: Session, name: str, what: str, fix: str, hosts: Iterable[Host] | None = None,
         root: str = LOCK_DIR) -> Iterator[None]:
    """Hold lock `name` (letters, digits, `.`, `_`, `-`) on each of `hosts` (every host of the session) while
    the block runs; `what` names the work in the refusal ("a stage of acme/x"), `fix` says what to do. `root`
    (as the node's shell expands it, in double quotes) is best a directory the guarded work needs writable anyway."""
    handles: list[Held] = []
    command = hold_command(name, this_run(), root)
    try:
        for host in session.hosts if hosts is None else hosts:  # in order: see the module's docstring
            answer, handle = session.transport(host).hold(command)
            handles.append(handle)
            if answer.startswith(BUSY):
                raise Busy(*busy(host.name, what, answer[len(BUSY):].strip(), fix, f"{root}/{name}.lock"))
            if answer != LOCKED:
                raise SparkclusterError(f"{host.name}: could not take the lock for {what}: {answer}",
                                        f"the node needs `flock` (util-linux) and a writable {root}")
        yield
    finally:
        for handle in reversed(handles):
            handle.release()
