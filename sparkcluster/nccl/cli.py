"""`sparkcluster verify` (the probe across the nodes) and `sparkcluster nccl-report` (logs a user already has):
wiring from parsed flags, and their output."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable

from ..engine import flags
from ..engine.cliapp import App, Connect
from ..engine.console import out as console
from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError
from ..engine.inventory import Inventory
from ..engine.report import print_json
from ..engine.session import Session
from ..node.modelconfig import is_repo_id, staged_shape
from . import report, thresholds, tunerun
from .latency import Latency
from .verdict import VerdictStatus
from .verify import run_verify


def two_nodes_or_more(inventory: Inventory) -> None:
    """The probe judges the traffic between nodes: one node alone has none, and its lone rank's run failed with "no
    connection between the ranks was seen", as if something were broken. Bad input, before connecting."""
    if len(inventory.hosts) == 1:
        raise UsageError(f"verify probes the links between nodes: {inventory.hosts[0].name} alone has none",
                         "verify two nodes or more (--limit NODE1,NODE2); a one-node serve needs no probe")


def tune_flags(args: argparse.Namespace) -> list[int] | None:
    """verify --tune's flags checked before connecting: the concurrencies, or None where no tuning is asked."""
    if not (getattr(args, "tune", False) or getattr(args, "reset", False)):  # callers that build args bare
        if getattr(args, "check", False):
            raise UsageError("--check goes with --tune or --reset", "add --tune (or --reset) to see what it would set")
        for flag in ("model", "hidden_size", "dtype_bytes"):
            if getattr(args, flag, None) is not None:
                name = "--" + flag.replace("_", "-")
                raise UsageError(f"{name} goes with --tune", f"add --tune to time NCCL's settings at its decode sizes, "
                                                             f"or leave {name} out")
        return None
    if args.tune and args.reset:
        raise UsageError("--tune and --reset together", "run one: --tune measures and sets, --reset goes back")
    try:
        concurrencies = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        concurrencies = []
    if not concurrencies or min(concurrencies) < 1:
        raise UsageError(f"--concurrency {args.concurrency!r}: not a list of positive whole numbers",
                         "e.g. --concurrency 1,8 (the streams decoding at once)")
    if args.tune and args.model is None and args.hidden_size is None:
        raise UsageError("verify --tune needs the model it tunes for: the decode all-reduce carries hidden size x "
                         "concurrency x dtype bytes",
                         "name the staged model (--model ORG/NAME: its config.json on the head gives both), or give "
                         "--hidden-size (e.g. 4096 for Llama-3-8B; --dtype-bytes 2 for bf16, the default)")
    if args.model is not None and not is_repo_id(args.model):
        raise UsageError(f"--model {args.model!r}: not a model id of the HF cache",
                         "give ORG/NAME as staged (e.g. --model meta-llama/Meta-Llama-3-8B)")
    for flag, value in (("--hidden-size", args.hidden_size), ("--dtype-bytes", args.dtype_bytes)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value}: not a positive whole number", f"e.g. {flag} "
                             + ("4096" if flag == "--hidden-size" else "2"))
    return concurrencies


def tune_shape(session: Session, args: argparse.Namespace) -> tuple[int, int]:
    """(hidden size, bytes per activation) verify --tune sizes the decode all-reduces with: the flags where given,
    else the staged model's config.json on the head."""
    if args.hidden_size is not None:
        return args.hidden_size, args.dtype_bytes or 2
    shape = staged_shape(session, args.model)
    return shape.hidden, args.dtype_bytes or shape.activation_bytes


def cmd_tune(args: argparse.Namespace, connect: Connect, concurrencies: list[int]) -> int:
    with connect(args, two_nodes_or_more) as session:
        if args.reset:
            result = tunerun.run_reset(session, check=args.check)
        else:
            hidden, dtype_bytes = tune_shape(session, args)
            result = tunerun.run_tune(session, hidden_size=hidden, concurrencies=concurrencies,
                                      dtype_bytes=dtype_bytes, backend=args.backend, check=args.check,
                                      model=args.model)
    return shown(lambda: print_json(result.to_json()) if args.json else print(tunerun.render(result)), EXIT_OK)


def cmd_verify(args: argparse.Namespace, connect: Connect) -> int:
    concurrencies = tune_flags(args)
    if concurrencies is not None:
        return cmd_tune(args, connect, concurrencies)
    with connect(args, two_nodes_or_more) as session:
        result = run_verify(session, backend=args.backend, sizes=args.sizes, min_busbw=args.min_busbw,
                            per_twin=args.twins)
    failing = (VerdictStatus.FAIL, VerdictStatus.WARN) if args.strict else (VerdictStatus.FAIL,)

    def render() -> None:
        if not args.json:
            report.render_verify(console, result)
            return
        print_json({"backend": result.backend, "verdict": dataclasses.asdict(result.verdict),
                    "rows": [dataclasses.asdict(r) for r in result.rows], "carried_by": result.carried_by,
                    "twins": result.twins, "topology": result.topology,
                    "links": [m.to_json() for m in result.links], "skipped_links": result.skipped_links,
                    "control_plane": [a.to_json() for a in result.control_plane],
                    **(result.latency or Latency(())).to_json()})
    return shown(render, EXIT_FAILED if result.verdict.status in failing else EXIT_OK)


def cmd_nccl_report(args: argparse.Namespace) -> int:
    code, text = report.report(args.logfiles, json_output=args.json, min_busbw=args.min_busbw)
    return shown(lambda: print(text), code)


def shown(render: Callable[[], None], code: int) -> int:
    """The verdict's exit code, also where the reader left early (`nccl-report ... | head -1`): a script under
    `set -o pipefail` must not read a FAIL as a pass. The closed pipe is no error of ours (no traceback), and
    stdout then points at /dev/null, so that the interpreter's last flush at exit finds nowhere to fail."""
    try:
        render()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    ver = app.connecting(commands.add_parser("verify", help="prove which network NCCL (or gloo) traffic really takes"))
    ver.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                     help="nccl on GPUs (auto when the head's torch sees CUDA), gloo on CPU-only nodes")
    ver.add_argument("--sizes", help="bytes per collective, e.g. 1M,64M,1G (at most 1 GiB)")
    ver.add_argument("--min-busbw", type=flags.bandwidth,
                     help="bus bandwidth the whole collective needs on GPUs, GB/s. Default per topology, from field "
                          f"figures: {thresholds.help_text()} (each link alone: the twin's). On CPU (gloo, the "
                          "simulator) links are compared with each other instead: one more than 2x slower fails")
    ver.add_argument("--twins", "--links", dest="twins", action=argparse.BooleanOptionalAction, default=True,
                     help="also measure each link of the fabric alone (each twin of each cable; on a switch, each "
                          "node's link), shown as a matrix and naming a slow or dead link (default: on; --no-links: "
                          "one run)")
    ver.add_argument("--strict", action="store_true",
                     help="exit 1 on a WARN too (e.g. a link much slower than its peers for small messages)")
    ver.add_argument("--tune", action="store_true",
                     help="measure candidate NCCL settings at the decode sizes of --model (hidden size x "
                          "--concurrency x dtype bytes) and 64 MiB+, each all-reduce's sum checked, never LL128; keep "
                          "the fastest beyond noise within 10%% busbw in every node's comm env and last-verify record")
    ver.add_argument("--reset", action="store_true", help="remove verify --tune's settings from every comm env")
    ver.add_argument("--check", action="store_true", help="with --tune or --reset: show what it would set; no comm "
                                                          "env or record changes")
    ver.add_argument("--concurrency", default="1,8", help="--tune: the concurrencies decode runs at (default 1,8)")
    ver.add_argument("--model", metavar="ORG/NAME", help="--tune: the model served, as staged: its config.json on the "
                                                         "head gives the hidden size and dtype")
    ver.add_argument("--hidden-size", type=int, help="--tune: the hidden size, where no staged --model gives it")
    ver.add_argument("--dtype-bytes", type=int, help="--tune: bytes per activation (default: the model's dtype's, "
                                                     "else 2, bf16)")
    app.wire(ver, cmd_verify)

    rep = commands.add_parser("nccl-report", help="read NCCL_DEBUG=INFO logs: transports, devices, a verdict")
    rep.add_argument("logfiles", nargs="+", metavar="LOGFILE")
    rep.add_argument("--min-busbw", type=flags.bandwidth,
                     help="bus bandwidth a pass needs at 64 MiB and above, GB/s (nccl-tests tables and the probe's "
                          "rows). Default by the node count the log shows: 2 nodes the pair's floor, 3 or more the "
                          f"ring's (behind a switch, pass the switch's): {thresholds.help_text()}")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_nccl_report)
