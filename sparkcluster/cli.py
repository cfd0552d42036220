"""The `sparkcluster` command line: commands and flags only, wired to the modules that do the work."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from . import __version__, stepcatalog
from .bench import cli as bench_cli
from .engine import flags
from .engine.cliapp import App
from .engine.console import err as err_console
from .engine.console import out as console
from .engine.console import print_error, print_unreachable
from .engine.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, SparkclusterError, UsageError
from .engine.events import RunFinished
from .engine.inventory import Inventory, find_inventory, load_inventory, record_last_used
from .engine.playbook import Playbook
from .engine.report import facts_table, make_reporter, print_json
from .engine.runner import Runner
from .engine.session import DEFAULT_FORKS, Session, connect, connected
from .engine.transport import Unreachable
from .nccl import cli as nccl_cli
from .serving import cli as serving_cli
from .sim import cli as sim_cli
from .staging import cli as staging_cli


# ---- inventory, transports ------------------------------------------------------------------------
def _inventory(args: argparse.Namespace) -> Inventory:
    positional = getattr(args, "inventory_arg", None)
    path, reason = find_inventory(positional or args.inventory)
    reason = "as given" if positional else reason
    if not getattr(args, "json", False):
        err_console.print(f"inventory: {path} ({reason})", highlight=False)
    inventory = load_inventory(path)
    if args.limit:
        inventory = inventory.limit([n.strip() for n in args.limit.split(",") if n.strip()])
    return inventory


def _become_password(args: argparse.Namespace) -> str | None:
    # Asked once, fed to sudo on stdin; never in argv, logs or --json.
    return getpass.getpass("BECOME (sudo) password: ") if getattr(args, "ask_become_pass", False) else None


def _connect(args: argparse.Namespace, check: Callable[[Inventory], None] = lambda inventory: None,
             require_all: bool = True) -> AbstractContextManager[Session]:
    """The selected inventory (`check` sees it before anything connects), connected, with every node's facts."""
    inventory = _inventory(args)
    check(inventory)
    return connected(inventory, forks=args.forks, trust_new_host_keys=args.trust_new_host_keys,
                     sudo_password=_become_password(args), require_all=require_all)


# ---- facts, bootstrap, run -------------------------------------------------------------------------
def cmd_facts(args: argparse.Namespace) -> int:
    with _connect(args, require_all=False) as session:
        hosts = session.inventory.hosts
    if args.json:
        print_json({h.name: ({"unreachable": session.unreachable[h.name].message,
                              "fix": session.unreachable[h.name].fix} if h.name in session.unreachable
                             else session.facts[h.name].to_json()) for h in hosts})
    else:
        for h in hosts:
            if h.name in session.unreachable:
                print_unreachable(console, h.name, h.address, session.unreachable[h.name])
            else:
                facts_table(console, h.name, h.address, session.facts[h.name])
    return EXIT_FAILED if session.unreachable else EXIT_OK


def _extra_vars(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-e {pair!r} is not KEY=VALUE", "e.g. -e min_driver=590.44")
        out[key] = value
    return out


def run_playbook(playbook: Playbook, inventory: Inventory, args: argparse.Namespace,
                 extra_vars: dict[str, object] | None = None) -> RunFinished:
    reporter = make_reporter(console, json_output=args.json, show_diff=args.diff, out=sys.stdout)
    with connect(inventory, forks=args.forks, trust_new_host_keys=args.trust_new_host_keys,
                 sudo_password=_become_password(args)) as session:
        return Runner(session, playbook, reporter, check=args.check, extra_vars=extra_vars).run()


def cmd_run(args: argparse.Namespace) -> int:
    playbook = stepcatalog.load(args.playbook)  # all input is validated before any connection
    extra = _extra_vars(args.extra_vars or [])
    inventory = _inventory(args)
    return run_playbook(playbook, inventory, args, extra).exit_code


def cmd_bootstrap(args: argparse.Namespace) -> int:
    playbook = stepcatalog.load_bundled("bootstrap")
    extra: dict[str, object] = {}
    if args.min_driver:
        extra["min_driver"] = args.min_driver
    if args.driver_policy:
        extra["driver_policy"] = args.driver_policy
    if args.allow_other_gpu:
        extra["allow_other_gpu"] = True
    if args.runtime:
        extra["runtime"] = args.runtime
    inventory = _inventory(args)
    result = run_playbook(playbook, inventory, args, extra)
    if result.exit_code == 0 and not args.check and not args.limit:
        record_last_used(Path(inventory.path))  # what `serve` falls back to when no inventory is named
    return result.exit_code


# ---- parser ---------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkcluster",
        description="Take DGX Sparks from cabled to serving one model across all of them, with NCCL proven on RDMA.",
    )
    parser.add_argument("--version", action="version", version=f"sparkcluster {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def connecting(p: argparse.ArgumentParser, inventory_positional: bool = True) -> argparse.ArgumentParser:
        if inventory_positional:
            p.add_argument("inventory_arg", nargs="?", metavar="INVENTORY", help="inventory file")
        p.add_argument("-i", "--inventory", help="inventory file (else $SPARKCLUSTER_INVENTORY, ./inventory.yml, "
                                                  "then the one the last bootstrap used)")
        p.add_argument("--limit", type=flags.names, help="comma-separated hosts or groups to act on")
        p.add_argument("--forks", type=flags.count, default=DEFAULT_FORKS,
                       help=f"hosts in parallel (default {DEFAULT_FORKS})")
        p.add_argument("--trust-new-host-keys", action="store_true",
                       help="accept and record host keys not yet in known_hosts (never a changed key)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    def changing(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--check", action="store_true", help="show what would change; change nothing")
        p.add_argument("--diff", action="store_true", help="show the changes made to files")
        p.add_argument("--ask-become-pass", "-K", action="store_true", help="ask once for the sudo password")
        return p

    facts = connecting(commands.add_parser("facts", help="gather and show each host's facts"))
    facts.set_defaults(func=cmd_facts)

    boot = changing(connecting(commands.add_parser(
        "bootstrap", help="preflight and provision every node (idempotent)")))
    boot.add_argument("--min-driver", help="lowest acceptable NVIDIA driver (default 590.44, or min_driver: in the inventory)")
    boot.add_argument("--driver-policy", choices=("fail", "warn"), help="what an older driver does (default fail)")
    boot.add_argument("--allow-other-gpu", action="store_true", help="go on when a node's GPU is not a GB10")
    boot.add_argument("--runtime", choices=("docker", "host"),
                      help="host: Ray and vLLM will run from a Python environment, so Docker is not checked "
                           "(default docker, or runtime: in the inventory)")
    boot.set_defaults(func=cmd_bootstrap)

    run = changing(connecting(commands.add_parser("run", help="run a playbook"), inventory_positional=False))
    run.add_argument("playbook", help="playbook file")
    run.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE", help="a variable for templates")
    run.set_defaults(func=cmd_run)

    app = App(_connect, connecting, changing)
    for wing in (staging_cli, nccl_cli, serving_cli, bench_cli, sim_cli):
        wing.register(commands, app)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Everything after `--` is a command for a remote host, never options of ours.
    remote = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = build_parser().parse_args(argv[: len(argv) - len(remote) - 1] if "--" in argv else argv)
    args.remote = remote
    try:
        code: int = args.func(args)
        return code
    except SparkclusterError as e:
        message = e.message
        if isinstance(e, Unreachable) and e.host and e.host not in message:
            message = f"{e.host}: {message}"  # the transport names the address; the user knows the node's name
        print_error(message, e.fix)
        return e.exit_code
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
