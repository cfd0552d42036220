"""`sparkcluster supervise run|on|off|status` and `sparkcluster events`: the supervisor's loop where the unit runs
it (on the head), turning it off and on for a running serve, and its incident history, read from the head."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ..engine.cliapp import App, Connect, no_check
from ..engine.console import out as console
from ..engine.errors import EXIT_FAILED, EXIT_OK, SparkclusterError, UsageError
from ..engine.inventory import load_inventory
from ..engine.report import print_json
from ..serving.incidents import SUPERVISOR_DIR, Incident
from ..serving.supervisor_unit import (
    INVENTORY_FILE,
    SPEC_FILE,
    SupervisorSpec,
    read_events,
    read_view,
    start_command,
    stop_command,
)
from .loop import Supervisor, policy_from


def cmd_run(args: argparse.Namespace) -> int:
    """The loop itself, where the unit starts it: on the head, as the login user, from its private folder."""
    folder = Path.home() / SUPERVISOR_DIR
    spec_file, inventory_file = Path.home() / SPEC_FILE, Path.home() / INVENTORY_FILE
    if not spec_file.is_file() or not inventory_file.is_file():
        raise SparkclusterError(f"no serve to supervise: {spec_file} or {inventory_file} is missing",
                                "`sparkcluster serve` installs them (and this unit) on the head")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    spec = SupervisorSpec.from_json(json.loads(spec_file.read_text()))
    policy = policy_from(spec, load_inventory(inventory_file))
    Supervisor(folder, spec, inventory_file, policy).forever()
    return EXIT_OK


def cmd_switch(args: argparse.Namespace, connect: Connect) -> int:
    # The head alone is asked: a node that is off (what the supervisor may be working around) is no error here.
    with connect(args, no_check, require_all=False) as session:
        if args.supervise_command == "off":
            stopped = "supervisor" in session.run(session.head, stop_command()).stdout
            said = "stopped" if stopped else "was not running"
        elif args.supervise_command == "on":
            started = session.run(session.head, start_command())
            if not started.ok:
                raise UsageError(f"{session.head.name}: no supervised serve to watch ({started.stderr_tail(2) or 'no unit'})",
                                 "serve first: `sparkcluster serve` installs the supervisor")
            said = "watching"
        view = read_view(session)
    if args.json:
        print_json({"supervisor": None if view is None else view.to_json(), **({"said": said} if args.supervise_command
                                                                                != "status" else {})})
        return EXIT_OK
    if args.supervise_command != "status":
        console.print(f"supervisor: {said}", highlight=False)
    if view is None:
        console.print("supervisor: the head cannot be reached", highlight=False)
        return EXIT_FAILED
    state = view.state
    active = "running" if view.active else ("stopped" if view.installed else "not installed")
    console.print(f"supervisor: {active}" + (f", {state.state} since {state.since}" if state else "")
                  + (f" ({state.reason})" if state and state.reason else ""), highlight=False, markup=False)
    for incident in view.incidents:
        console.print(f"  {incident.line()}", highlight=False, markup=False)
    return EXIT_OK


def since_bound(text: str) -> datetime:
    """--since: a duration back from now (90s, 30m, 2h, 1d) or an ISO-8601 time."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC) - timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a duration (30m, 2h, 1d) nor an ISO time "
                                         "(2026-12-01T10:00:00+00:00)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def cmd_events(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args, no_check, require_all=False) as session:
        incidents = read_events(session)
    if args.since is not None:
        incidents = [i for i in incidents if _when(i) >= args.since]
    if args.json:
        print_json({"events": [i.to_json() for i in incidents]})
        return EXIT_OK
    if not incidents:
        console.print("no incidents recorded", highlight=False)
    for incident in incidents:
        console.print(incident.line(), highlight=False, markup=False)
    return EXIT_OK


def _when(incident: Incident) -> datetime:
    try:
        when = datetime.fromisoformat(incident.at)
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    sup = commands.add_parser("supervise", help="the supervisor on the head: turn it off or on, its state")
    sub = sup.add_subparsers(dest="supervise_command", metavar="SUPERVISE_COMMAND", required=True)
    for name, line in (("status", "its state and last incidents"), ("off", "stop it (the serve keeps running)"),
                       ("on", "start it again for the recorded serve")):
        app.wire(app.connecting(sub.add_parser(name, help=line)), cmd_switch)
    run = sub.add_parser("run", help="run the loop here (what the unit on the head starts)")
    run.set_defaults(func=cmd_run)
    ev = app.connecting(commands.add_parser("events", help="the supervisor's incidents: what it saw, did, and how long"))
    ev.add_argument("--since", type=since_bound, help="only those since a duration ago (30m, 2h, 1d) or an ISO time")
    app.wire(ev, cmd_events)
