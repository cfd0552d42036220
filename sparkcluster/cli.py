"""The `sparkcluster` command line: which wing owns each command, and the one entry point.

A command's flags and handler live in its wing's `cli.py` (`register(commands, app)`). This module imports none of
them up front: the parser lists every command from the table below, and only the wing that owns the command on the
command line is imported and registers its real sub-commands. `sparkcluster --help` thus costs no paramiko, aiohttp
or matplotlib, and `bootstrap` imports the engine and the node's steps, not the bench's HTTP client.

Adding a command: register it in its wing's `cli.py` and add its name and help line to that wing's row below
(tests/unit/test_cli.py checks that every row says what its wing registers)."""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Iterable

from . import __version__
from .engine.cliapp import App, Parser
from .engine.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, SparkclusterError

# typing.TYPE_CHECKING without importing typing: `--help` imports neither typing nor dataclasses (with inspect).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn


class Wing:
    __slots__ = ("module", "commands")

    def __init__(self, module: str, commands: tuple[tuple[str, str], ...]) -> None:
        self.module = module  # its `register(commands, app)` adds exactly these commands
        self.commands = commands  # (name, the help line `sparkcluster --help` shows), in --help's order

    def __repr__(self) -> str:
        return f"Wing({self.module!r})"


WINGS: tuple[Wing, ...] = (
    Wing("sparkcluster.bootstrap.cli", (
        ("facts", "gather and show each host's facts"),
        ("bootstrap", "preflight and provision every node (idempotent)"),
        ("run", "run a playbook"),
    )),
    Wing("sparkcluster.node.cli", (
        ("topology", "the QSFP fabric as cabled: who is cabled to whom, on which port and twin"),
    )),
    Wing("sparkcluster.staging.cli", (
        ("stage", "put a model's snapshot on every node, over the fabric"),
    )),
    Wing("sparkcluster.nccl.cli", (
        ("verify", "prove which network NCCL (or gloo) traffic really takes"),
        ("nccl-report", "read NCCL_DEBUG=INFO logs: transports, devices, a verdict"),
    )),
    Wing("sparkcluster.serving.cli", (
        ("up", "bring the Ray cluster up on the QSFP addresses"),
        ("serve", "serve a model with TP = N across the nodes"),
        ("status", "per node: processes, Ray membership; vLLM health"),
        ("logs", "Ray and vLLM logs of the nodes"),
        ("down", "stop vLLM and Ray on every node (idempotent)"),
        ("top", "live view: per node GPU and memory, Ray and vLLM; the endpoint's /metrics"),
        ("recipes", "bundled and registry recipes (eugr v1, sparkrun v2, sparkcluster's own)"),
        ("image", "container images across the nodes"),
    )),
    Wing("sparkcluster.supervise.cli", (
        ("supervise", "the supervisor on the head: turn it off or on, its state"),
        ("events", "the supervisor's incidents: what it saw, did, and how long"),
    )),
    Wing("sparkcluster.doctor.cli", (
        ("doctor", "every check that needs no serving: preflight, nodes compared, known-bad values"),
    )),
    Wing("sparkcluster.bench.cli", (
        ("bench", "measure what the served cluster delivers: throughput and latency at each concurrency"),
    )),
    Wing("sparkcluster.monitor.cli", (
        ("monitor", "Prometheus on the head: every node's metrics, the engines', alert and recording rules"),
    )),
    Wing("sparkcluster.sim.cli", (
        ("sim", "a simulated Spark cluster on this machine (needs root)"),
    )),
    Wing("sparkcluster.completion", (
        ("completion", "print a shell completion script (bash, zsh or fish)"),
    )),
)

DESCRIPTION = "Take DGX Sparks from cabled to serving one model across all of them, with NCCL proven on RDMA."


def build_parser(commands_to_load: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the real sub-commands of the wings owning `commands_to_load` (None: every wing, for
    completion scripts and tests); every other command is listed by its name and help line only."""
    parser = Parser(prog="sparkcluster", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"sparkcluster {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if commands_to_load is None else set(commands_to_load)
    app = App()
    for wing in WINGS:
        if wanted is None or wanted & {name for name, _ in wing.commands}:
            importlib.import_module(wing.module).register(commands, app)
        else:
            for name, help_line in wing.commands:
                commands.add_parser(name, help=help_line)
    return parser


def command_named(argv: list[str]) -> str | None:
    """The command on a command line: its first word that is not an option (the top level's only options,
    -h and --version, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Everything after `--` is a command for a remote host, never options of ours.
    remote = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: len(argv) - len(remote) - 1] if "--" in argv else argv
    command = command_named(own)
    parser = build_parser([command] if command else [])
    if not own:  # `sparkcluster` alone: the commands, as --help lists them, and the usage error's exit code
        parser.print_help()
        return EXIT_USAGE
    args = parser.parse_args(own)
    args.remote = remote
    args.own_argv = own  # as given: what the supervisor serves again on the head (serving/supervision.py)
    try:
        code: int = args.func(args)
        return code
    except SparkclusterError as e:
        from .engine.console import print_error

        message = e.message
        host = getattr(e, "host", None)  # Unreachable: the transport names the address; the user knows the name
        if host and host not in message:
            message = f"{host}: {message}"
        print_error(message, e.fix)
        return e.exit_code
    except KeyboardInterrupt:
        from .engine.console import err

        err.print("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stderr.close()
        return EXIT_OK


def run() -> NoReturn:
    """The `sparkcluster` command: main(), then the exit. gc.freeze() first, so that the interpreter's shutdown
    does not walk every object the run made in a last collection of cycles: 0.13 s of a 1 s bootstrap here.
    Nothing is lost by it: output is flushed at exit as always, and files are closed where they are written.
    (Not in main(), which the tests call many times in one process.)"""
    code = main()
    gc.freeze()
    sys.exit(code)


def __getattr__(name: str) -> Any:
    # `cli.err_console`: the one stderr console every wing prints through (tests widen it), without importing rich
    # when this module is.
    if name == "err_console":
        from .engine.console import err

        return err
    raise AttributeError(name)


if __name__ == "__main__":
    sys.exit(main())
