"""Many read-only commands in one SSH exec: the round trips of a play's checks, paid once per host.

A command costs a channel, sshd's session set-up and a shell on the node (about 50 ms on a Spark-like node,
more under load) whatever it does; a play's checks are mostly reads of a few milliseconds each. The runner asks
every step of a play for the reads its check() will make (Step.reads), runs them here as one script, and hands
each step its own Result, as if the command had run alone: its stdout, its stderr, its exit code.

The commands run one after the other, each in its own subshell with stdin from /dev/null; each one's stderr is
held in a shell variable and printed after its stdout, so the two streams come back apart. The sections are
framed by lines holding a random marker, which no command's output can forge.

A step's apply() uses the same exec for its changes and the reads its check after apply() makes (apply_then_read):
the changes run first, in order, and the batch ends at the first that fails, as a script under `set -e` would; one
of them may read the exec's stdin (a file's content). The check after apply() then costs no round trip of its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .command import Command
from .transport import Result, Transport

MAX_BATCH_TIMEOUT_S = 300.0


def types_sudo_password(transport: Transport) -> bool:
    """Whether sudo on `transport`'s host is handed a typed password, on the exec's stdin."""
    return getattr(transport, "sudo_password", None) is not None


def batchable(command: Command, transport: Transport) -> bool:
    """A command that reads no stdin and needs no password typed to sudo runs the same inside the batch."""
    return command.stdin is None and not (command.sudo and types_sudo_password(transport))


def batch_script(commands: Sequence[Command], marker: str, changes: int = 0) -> str:
    """The script that runs `commands`; the first `changes` of them are changes: the script ends after the first of
    those that fails. The one command with stdin (there may be one) reads the script's."""
    # Each command's stdout goes straight out (fd 3, the script's stdout); its stderr, then its exit code, are
    # caught in a variable and printed after it. No temporary file: a check must not touch the node's disk.
    lines = ["exec 3>&1", "nl='\n'"]
    for i, command in enumerate(commands):
        stdin = "" if command.stdin is not None else " </dev/null"
        lines.append(f"printf '\\n{marker} {i} out\\n'")
        lines.append(f"e=$( ( {command.line()}\n){stdin} 2>&1 1>&3 3>&-; printf '\\n%s' \"$?\" )")
        lines.append(f"printf '\\n{marker} {i} err %s\\n%s' \"${{e##*\"$nl\"}}\" \"${{e%\"$nl\"*}}\"")
        if i < changes:
            lines.append(f"[ \"${{e##*\"$nl\"}}\" = 0 ] || {{ printf '\\n{marker} end\\n'; exit 0; }}")
    lines.append(f"printf '\\n{marker} end\\n'")
    return "\n".join(lines) + "\n"


def split_output(text: str, commands: Sequence[Command], marker: str, duration: float) -> dict[int, Result] | None:
    """The batch's output, cut back into one Result per command that ran (all of them, unless a change failed);
    None when it is not whole (then every step runs its own command, as without the batch)."""
    # Each section was preceded by a newline the script added: it is dropped with the marker line.
    parts = re.split(rf"\n{re.escape(marker)} ([^\n]*)\n", text)
    ran = (len(parts) - 3) // 4
    if len(parts) != 4 * ran + 3 or not 0 < ran <= len(commands) or parts[-2] != "end":
        return None
    results: dict[int, Result] = {}
    for i, command in enumerate(commands[:ran]):
        out_head, stdout, err_head, stderr = parts[1 + 4 * i: 5 + 4 * i]
        err = err_head.split()
        if out_head != f"{i} out" or len(err) != 3 or err[:2] != [str(i), "err"] or not err[2].isdigit():
            return None
        results[i] = Result(command, int(err[2]), stdout, stderr, duration)
    return results


@dataclass(frozen=True)
class Batch(Command):
    """The one exec of a batch. It keeps the commands it runs, for whoever stands in for a node's shell in a test."""

    parts: tuple[Command, ...] = ()
    marker: str = ""
    changes: int = 0


def run_batch(transport: Transport, commands: Sequence[Command], changes: int = 0) -> dict[int, Result] | None:
    """Run `commands` in one exec on `transport`'s host (the first `changes` of them changes, see batch_script):
    index -> the Result of each that ran, or None when the batch did not come back whole (timed out, cut off), so
    that each read runs alone instead."""
    if not commands:
        return {}
    if sum(c.stdin is not None for c in commands) > 1:
        raise ValueError("a batch has one stdin: at most one of its commands may read it")
    # os.urandom is what secrets.token_hex reads; secrets itself would import hmac and hashlib into every start.
    marker = f"@@sc-batch-{os.urandom(8).hex()}@@"
    timeout = min(MAX_BATCH_TIMEOUT_S, sum(c.timeout for c in commands))
    stdin = next((c.stdin for c in commands if c.stdin is not None), None)
    result = transport.run(Batch(batch_script(commands, marker, changes), timeout=timeout, stdin=stdin,
                                 parts=tuple(commands), marker=marker, changes=changes))
    if not result.ok:
        return None
    return split_output(result.stdout, commands, marker, result.duration)
