"""`sparkcluster stage`: wiring from parsed flags to the stager, and its output (a line per blob on stderr,
a table per node, or one JSON document with --json, whatever happened)."""

from __future__ import annotations

import argparse
import dataclasses

from ..engine import flags
from ..engine.cliapp import App, Connect
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.console import print_error, print_unreachable
from ..engine.errors import EXIT_FAILED, EXIT_OK, SparkclusterError
from ..engine.modelref import ModelRef
from ..engine.report import print_json
from . import render
from .stager import stage, stage_status
from .wire import TRANSPORTS


def cmd_stage(args: argparse.Namespace, connect: Connect) -> int:
    try:
        return _stage(args, connect)
    except SparkclusterError as e:
        if not args.json:
            raise
        # A script reading --json gets a document whatever happened, never an empty stdout.
        print_json({"model": args.model, "error": e.message, "fix": e.fix})
        print_error(e.message)
        return e.exit_code


def _stage(args: argparse.Namespace, connect: Connect) -> int:
    model = ModelRef.parse(args.model)  # bad input fails before any connection
    with connect(args, require_all=False) as session:
        for h in session.hosts:
            if h.name in session.unreachable:
                print_unreachable(err_console, h.name, h.address, session.unreachable[h.name])
        if session.unreachable:
            if args.json:
                print_json({"model": str(model), "unreachable": {
                    name: {"error": e.message, "fix": e.fix} for name, e in session.unreachable.items()}})
            return EXIT_FAILED
        if args.status:
            statuses = stage_status(session, model, args.verify)
            if args.json:
                print_json(statuses)
            else:
                render.status_table(console, str(model), statuses)
            return EXIT_OK if all(s["state"] == "complete" for s in statuses["nodes"].values()) else EXIT_FAILED
        progress = (lambda event: None) if args.json else render.progress_printer(err_console)
        result = stage(session, model, source=args.source, verify=args.verify, streams=args.streams,
                       data_plane=args.transport, over_lan=args.over_lan, progress=progress)
    if args.json:
        print_json(dataclasses.asdict(result))
    else:
        render.result_table(console, result)
    return EXIT_OK if result.ok else EXIT_FAILED


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    stg = app.connecting(commands.add_parser("stage", help="put a model's snapshot on every node, over the fabric"),
                         inventory_positional=False)
    stg.add_argument("model", help="ORG/NAME[@REVISION]")
    stg.add_argument("--source", default="auto",
                     help="auto (a node that holds it, else download on the head), head, local (this machine's "
                          "HF cache), or a host name")
    stg.add_argument("--verify", choices=("size", "full"), default="size",
                     help="check existing copies by size (default) or by hashing every blob")
    stg.add_argument("--status", action="store_true", help="report each node's copy; change nothing")
    stg.add_argument("--streams", type=flags.count, default=2, help="files in flight per destination (default 2)")
    stg.add_argument("--transport", choices=TRANSPORTS, default="tcp",
                     help="tcp: plain TCP between the fabric addresses, each blob hashed as it arrives (default); "
                          "ssh: rsync over ssh, for encryption on the wire")
    stg.add_argument("--over-lan", action="store_true", help=argparse.SUPPRESS)  # benchmarks only
    app.wire(stg, cmd_stage)
