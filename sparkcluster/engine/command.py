"""Remote commands as values: what runs, as whom, with which environment, and what may be shown.

Tests compare Command values; the shell line is built in one place, and inventory strings only ever
enter it through shlex.quote, so they cannot inject shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_TIMEOUT_S = 120.0


def shell_path(path: str) -> str:
    """A path as one quoted shell word; `~/x` stays relative to the remote user's $HOME, which only the
    remote shell knows (DESIGN.md §5: remote paths are resolved on the remote host)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class Command:
    script: str  # a POSIX shell line; build it with Command.argv() for anything holding user input
    sudo: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT_S
    stdin: str | None = None
    secrets: tuple[str, ...] = ()  # strings that must never be shown (masked in display())

    @classmethod
    def argv(cls, args: Sequence[str], **kwargs: object) -> Command:
        return cls(shlex.join(args), **kwargs)  # type: ignore[arg-type]

    def line(self, sudo_password: bool = False) -> str:
        """The exact line sent to the remote shell. Only `env` reaches the remote environment."""
        body = self.script
        if self.env:
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
            body = f"export {exports}; {body}"
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
        shown = ("sudo " if self.sudo else "") + self.script
        for secret in self.secrets:
            if secret:
                shown = shown.replace(secret, "********")
        return shown
