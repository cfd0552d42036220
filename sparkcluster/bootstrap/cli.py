"""`sparkcluster facts`, `bootstrap` and `run`: the engine's playbooks over the node's steps, wired from parsed
flags. Imported only when one of these commands runs (cli.py lists them without importing this); what a command
runs on (the steps, yaml, jinja2, rich) is imported when it runs, so that `bootstrap --help` costs none of it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.cliapp import App, Connect, become_password, selected_inventory
from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError

if TYPE_CHECKING:
    from ..engine.events import RunFinished
    from ..engine.inventory import Inventory
    from ..engine.playbook import Playbook
    from ..serving.launch import RuntimeName


def cmd_facts(args: argparse.Namespace, connect_selected: Connect) -> int:
    from ..engine.console import out as console
    from ..engine.console import print_unreachable
    from ..engine.report import facts_table, print_json
    from ..node.cli import picture
    from ..node.discovery import discover

    with connect_selected(args, require_all=False) as session:
        hosts = session.inventory.hosts
        fabric = None if args.json else discover(session)  # the cabling, as `sparkcluster topology` shows it
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
        if fabric is not None:
            console.print(f"[bold]fabric[/bold]: {fabric.kind.value}", highlight=False)
            for line in picture(fabric):
                console.print("  " + line, highlight=False)
    return EXIT_FAILED if session.unreachable else EXIT_OK


def _extra_vars(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-e {pair!r} is not KEY=VALUE", "e.g. -e min_driver=590.44")
        out[key] = value
    if "min_driver" in out:
        _check_typed_driver_floor(f"-e min_driver={out['min_driver']}", str(out["min_driver"]))
    return out


def _clock_cap(text: str) -> int:
    """--gpu-clock-cap's MHz, bounded as the inventory's gpu_clock_cap is (node/gpuclock.py)."""
    from ..node.gpuclock import MAX_CAP_MHZ, MIN_CAP_MHZ

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a clock in MHz (a whole number, e.g. 2000)") from None
    if not MIN_CAP_MHZ <= value <= MAX_CAP_MHZ:
        raise argparse.ArgumentTypeError(f"{text} MHz is outside {MIN_CAP_MHZ}-{MAX_CAP_MHZ}: give the cap in MHz, "
                                         "e.g. 2000 (the field's)")
    return value


def _check_typed_driver_floor(given: str, version: str) -> None:
    """A floor typed on the command line is checked as the inventory's `min_driver` is, before connecting:
    otherwise every node would fail preflight with the same typo."""
    from ..engine.inventory.values import is_driver_version

    if not is_driver_version(version):
        raise UsageError(f"{given}: {version!r} is not an NVIDIA driver version", "give one such as 590.44 or 590.48.01")


def run_playbook(playbook: Playbook, inventory: Inventory, args: argparse.Namespace,
                 extra_vars: dict[str, object] | None = None) -> RunFinished:
    from ..engine.console import out as console
    from ..engine.report import make_reporter
    from ..engine.runner import Runner
    from ..engine.session import connect

    reporter = make_reporter(console, json_output=args.json, show_diff=args.diff, out=sys.stdout)
    with connect(inventory, forks=args.forks, trust_new_host_keys=args.trust_new_host_keys,
                 sudo_password=become_password(args)) as session:
        return Runner(session, playbook, reporter, check=args.check, extra_vars=extra_vars).run()


def cmd_run(args: argparse.Namespace, connect_selected: Connect) -> int:
    from . import stepcatalog

    playbook = stepcatalog.load(args.playbook)  # all input is validated before any connection
    extra = _extra_vars(args.extra_vars or [])
    inventory = selected_inventory(args)
    return run_playbook(playbook, inventory, args, extra).exit_code


def cmd_bootstrap(args: argparse.Namespace, connect_selected: Connect) -> int:
    from ..engine.inventory import record_last_used
    from . import stepcatalog

    playbook = stepcatalog.load_bundled("bootstrap")
    extra: dict[str, object] = {}
    if args.min_driver:
        _check_typed_driver_floor("--min-driver", args.min_driver)
        extra["min_driver"] = args.min_driver
    if args.driver_policy:
        extra["driver_policy"] = args.driver_policy
    if args.allow_other_gpu:
        extra["allow_other_gpu"] = True
    if args.runtime:
        extra["runtime"] = args.runtime
    if getattr(args, "gpu_clock_cap", None):
        extra["gpu_clock_cap"] = args.gpu_clock_cap
    inventory = selected_inventory(args)
    if args.runtime and not args.check:  # the cluster's from now on: every later command reads it there
        _remember_runtime(inventory, args.runtime, quiet=args.json)
    result = run_playbook(playbook, inventory, args, extra)
    if result.exit_code == 0 and not args.check and not args.limit:
        record_last_used(Path(inventory.path))  # what `serve` falls back to when no inventory is named
    return result.exit_code


def _remember_runtime(inventory: Inventory, runtime: RuntimeName, quiet: bool) -> None:
    """The runtime given is the cluster's from now on. An inventory that cannot take it (a read-only file, a host
    that sets its own) does not stop the bootstrap: the warning says what later commands then need."""
    from rich.markup import escape

    from ..engine.console import err
    from ..engine.inventory import InventoryError
    from ..serving.runtime import remember_runtime

    try:
        recorded = remember_runtime(inventory, runtime)
    except InventoryError as e:
        err.print(f"[bold yellow]warning:[/] runtime {runtime} not recorded: {escape(e.message)}\n  [bold]fix:[/] "
                  f"{escape(e.fix)}; until then, give later commands --runtime {runtime}", highlight=False)
        return
    if recorded and not quiet:
        err.print(f"runtime: {runtime}, recorded in {inventory.path} (vars: runtime: {runtime}); later commands "
                  "follow it, --runtime overrides", highlight=False)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    facts = app.connecting(commands.add_parser("facts", help="gather and show each host's facts"))
    app.wire(facts, cmd_facts)

    boot = app.changing(app.connecting(commands.add_parser(
        "bootstrap", help="preflight and provision every node (idempotent)")))
    boot.add_argument("--min-driver",
                      help="lowest acceptable NVIDIA driver (default 590.44, or min_driver: in the inventory)")
    boot.add_argument("--driver-policy", choices=("fail", "warn"), help="what an older driver does (default fail)")
    boot.add_argument("--allow-other-gpu", action="store_true", help="go on when a node's GPU is not a GB10")
    boot.add_argument("--runtime", choices=("docker", "host"),
                      help="host: Ray and vLLM will run from a Python environment, so Docker is not checked; "
                           "recorded as `runtime:` in the inventory's vars, which serve, status, logs, down, top "
                           "and doctor follow (default: the inventory's runtime, else docker)")
    boot.add_argument("--gpu-clock-cap", type=_clock_cap, metavar="MHZ",
                      help="cap every node's GPU clock at MHZ (nvidia-smi -lgc 0,MHZ; 2000 stopped GB10's hard "
                           "power-offs), now and at every boot through a oneshot systemd unit (default: the "
                           "inventory's gpu_clock_cap, else no cap)")
    app.wire(boot, cmd_bootstrap)

    run = app.changing(app.connecting(commands.add_parser("run", help="run a playbook"), inventory_positional=False))
    run.add_argument("playbook", help="playbook file")
    run.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE", help="a variable for templates")
    app.wire(run, cmd_run)
