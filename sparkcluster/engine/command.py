"""Remote commands as values: what runs, as whom, with which environment, and what may be shown.

Tests compare Command values; the shell line is built in one place, and inventory strings only ever
enter it through shlex.quote, so they cannot inject shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Variable names whose values are secrets (HF_TOKEN, WANDB_API_KEY, ...): never in a command line, an output
# or a record; they travel on stdin and are shown masked. One rule, the support bundle's too.
from .secret_names import is_secret_name as is_secret_name  # re-exported: serving reads it from here

DEFAULT_TIMEOUT_S = 120.0
# What a POSIX shell accepts as a variable name: anything else in `export NAME=...` would run as shell.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MASK = "********"
LABEL_CHARS = 100  # the most of an unnamed command's line that a message quotes


def masked_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` as it may be shown: the values of secret-like names masked."""
    return {k: MASK if is_secret_name(k) else v for k, v in env.items()}


def read_env_from_stdin() -> str:
    """The shell line that exports every `NAME=value` line of stdin up to the first empty one, literally (no
    expansion), so secret values reach the environment without passing through any command line."""
    return 'while IFS= read -r kv && [ -n "$kv" ]; do export "$kv"; done'


def env_on_stdin(env: Mapping[str, str]) -> str:
    """What read_env_from_stdin() reads: one `NAME=value` line each, then an empty line."""
    bad = [k for k, v in env.items() if not ENV_NAME.fullmatch(k) or "\n" in v or "\0" in v]
    if bad:
        raise ValueError(f"{bad[0]!r}: a secret's name must be a variable name and its value one line")
    return "".join(f"{k}={v}\n" for k, v in sorted(env.items())) + "\n"


def exports(env: Mapping[str, str]) -> str:
    """`NAME='value' ...` for an `export` line: values quoted, names checked (a name is never quoted by the
    shell, so one holding `;` would run as a command)."""
    bad = [k for k in env if not ENV_NAME.fullmatch(k)]
    if bad:
        raise ValueError(f"not an environment variable name: {bad[0]!r}")
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))


def shell_path(path: str) -> str:
    """A path as one quoted shell word; `~/x` stays relative to the remote user's $HOME, which only the
    remote shell knows: a remote path is resolved on the remote host, never copied from this machine."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def _plain_argv(script: str) -> bool:
    """Whether the shell line is one command of plain words (no `;`, `|`, `$`, redirection, ...): then it is
    exactly its words joined, as shlex.join would quote them."""
    try:
        return shlex.join(shlex.split(script)) == script
    except ValueError:
        return False


@dataclass(frozen=True)
class Command:
    script: str  # a POSIX shell line; build it with Command.argv() for anything holding user input
    sudo: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT_S
    stdin: str | None = None
    secrets: tuple[str, ...] = ()  # strings that must never be shown (masked in display())
    # What a message calls a command that carries a script (`blobwire fetch <blob>`, `the facts probe`): its line
    # holds the script whole, hundreds of lines that would bury the message they are quoted in.
    name: str = ""

    @classmethod
    def argv(cls, args: Sequence[str], *, sudo: bool = False, env: Mapping[str, str] | None = None,
             timeout: float = DEFAULT_TIMEOUT_S, stdin: str | None = None, secrets: tuple[str, ...] = (),
             name: str = "") -> Command:
        return cls(shlex.join(args), sudo, dict(env or {}), timeout, stdin, secrets, name)

    def line(self, sudo_password: bool = False) -> str:
        """The exact line sent to the remote shell. Only `env` reaches the remote environment."""
        body = self.script
        if self.env:
            body = f"export {exports(self.env)}; {body}"
        if not self.sudo:
            return body
        # -n: never hang on a prompt. With a password, the remote shell reads it (the first stdin line) and
        # hands it to `sudo -v` alone, so it is never in argv and never reaches the command's own stdin,
        # even where sudo does not ask for it.
        run = f"sudo -n -H -- sh -c {shlex.quote(body)}"
        if not sudo_password:
            return run
        # The remote shell reads the password (the first stdin line): never in argv. Where sudo asks for
        # it, it goes to sudo ahead of the command's own stdin; where sudo does not ask (NOPASSWD, cached
        # credentials), it is dropped, so it can never reach the command.
        return ("IFS= read -r p\n"
                f"if sudo -n true 2>/dev/null; then unset p; {run}; exit $?; fi\n"
                f"{{ printf '%s\\n' \"$p\"; unset p; cat; }} | sudo -S -p '' -H -- sh -c {shlex.quote(body)}")

    def display(self) -> str:
        """The command as a line that does what it shows when pasted into a shell: a root script that is more than
        one plain command is `sudo sh -c '...'` (`sudo set -e; umask 077; ...` would run only `set -e` as root)."""
        shown = self.script
        if self.sudo:
            shown = f"sudo {shown}" if _plain_argv(shown) else f"sudo sh -c {shlex.quote(shown)}"
        for secret in self.secrets:
            if secret:
                shown = shown.replace(secret, MASK)
        return shown

    def label(self) -> str:
        """The command as a message names it: its name, else its line in backquotes, cut to its first line and
        LABEL_CHARS (an unnamed script must not fill the screen either)."""
        if self.name:
            return self.name
        shown = self.display()
        first = shown.split("\n", 1)[0]
        if len(first) > LABEL_CHARS or first != shown:
            first = first[:LABEL_CHARS].rstrip() + " ..."
        return f"`{first}`"
