"""What every wing says to a node's shell, stated once: where the HF cache is (resolved by the node's own
shell, never copied from this machine), the OpenSSH options that never trust an unknown host key, how an env
file is sourced, and how a Python script runs on a node (with the inventory's `python`)."""

from __future__ import annotations

import shlex

from .command import DEFAULT_TIMEOUT_S, Command, shell_path
from .inventory import Host

# The HF cache root as the node's shell expands it (huggingface_hub's own default); use it inside double quotes.
HF_HOME = "${HF_HOME:-$HOME/.cache/huggingface}"

# Options for OpenSSH between nodes and from this machine: no prompt ever (a prompt would hang a run), and a host
# key must already be known (bootstrap's ssh.mesh records the verified ones): never trust on first use.
STRICT_SSH = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes")


def source_env(path: str) -> str:
    """The shell line that exports every KEY=value of the env file at `path` (relative paths: from the home
    directory, where the line must run), or ends the shell when it cannot be read. `.` searches $PATH for a bare
    name, so a relative path gets its ./"""
    shown = path if path.startswith(("/", "~")) else "./" + path
    return f"set -a; . {shell_path(shown)} || exit 1; set +a"


def python_of(host: Host) -> str:
    """The interpreter the inventory names for the node (`python:`), else the node's python3."""
    return str(host.vars.get("python", "python3"))


def python_line(python: str, script: str, *args: str) -> str:
    """The shell line that runs `script` (the text of a standalone module) with `args`: it travels in the line
    itself, so nothing is installed or left on the node, and stdin stays free for data and secrets."""
    return shlex.join([python, "-c", script, *args])


def python_command(python: str, script: str, *args: str, stdin: str | None = None,
                   timeout: float = DEFAULT_TIMEOUT_S, secrets: tuple[str, ...] = (), name: str = "") -> Command:
    """`name`: what messages call it (Command.name), since its line holds the whole script."""
    return Command(python_line(python, script, *args), stdin=stdin, timeout=timeout, secrets=secrets, name=name)
