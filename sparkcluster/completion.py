"""`sparkcluster completion bash|zsh|fish`: a shell completion script written from the full parser.

Static scripts, not argcomplete's call back into Python at every TAB: a TAB would otherwise pay the CLI's start
and, to know every command's flags, the import of every wing. bash and zsh come from shtab (which reads the
argparse parser); shtab writes no fish, so the fish script is written here, from the same parser."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator

from .engine.cliapp import App
from .engine.errors import EXIT_OK

SHELLS = ("bash", "zsh", "fish")
PROG = "sparkcluster"


def script(shell: str) -> str:
    from .cli import build_parser  # the full parser: every wing's flags

    parser = build_parser()
    if shell == "fish":
        return fish(parser)
    import shtab

    return str(shtab.complete(parser, shell=shell))


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for name, sub in _subcommands(parser).items():
        yield from _walk(sub, (*path, name))


def _condition(path: tuple[str, ...], parent: argparse.ArgumentParser | None) -> str:
    """fish's test that the command line is at `path` (each word seen; not yet past one of its sub-commands)."""
    tests = [f"__fish_seen_subcommand_from {shlex.quote(word)}" for word in path] or ["__fish_use_subcommand"]
    if path and parent is not None and _subcommands(parent):
        tests.append("not __fish_seen_subcommand_from " + " ".join(shlex.quote(n) for n in _subcommands(parent)))
    return "; and ".join(tests)


def fish(parser: argparse.ArgumentParser) -> str:
    lines = [f"# fish completion for {PROG} (sparkcluster completion fish > ~/.config/fish/completions/{PROG}.fish)",
             f"complete -c {PROG} -f"]
    for path, sub in _walk(parser):
        where = _condition(path, sub)
        for name, child in _subcommands(sub).items():
            lines.append(f"complete -c {PROG} -n {shlex.quote(where)} -a {shlex.quote(name)} "
                         f"-d {shlex.quote(_help_of(sub, name))}")
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            parts = [f"complete -c {PROG} -n {shlex.quote(where)}"]
            for option in action.option_strings:
                parts.append(f"-l {shlex.quote(option[2:])}" if option.startswith("--") else
                             f"-s {shlex.quote(option[1:])}")
            if action.nargs != 0:
                parts.append("-r")
                parts.append(f"-a {shlex.quote(' '.join(str(c) for c in action.choices))}" if action.choices
                             else "-F")
            if action.help:
                parts.append(f"-d {shlex.quote(action.help.split(';')[0][:80])}")
            lines.append(" ".join(parts))
        if not _subcommands(sub) and any(not a.option_strings for a in sub._actions):
            lines.append(f"complete -c {PROG} -n {shlex.quote(where)} -F")  # positionals: files
    return "\n".join(lines) + "\n"


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(script(args.shell))
    return EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    p = commands.add_parser(
        "completion", help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for the shell. Load it now with `source <(sparkcluster completion "
                    "bash)`, or keep it (each folder made first with mkdir -p): bash: > ~/.local/share/"
                    "bash-completion/completions/sparkcluster; zsh: > ~/.zfunc/_sparkcluster, with "
                    "fpath=(~/.zfunc $fpath) before compinit in ~/.zshrc; fish: > "
                    "~/.config/fish/completions/sparkcluster.fish (the README has the lines to paste)")
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=cmd_completion)
