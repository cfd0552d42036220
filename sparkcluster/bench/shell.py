"""The one shell every bench method runs in, written once: the plan (flags checked before anything connects), the
target, the run, the receipt and the comparison (the method's), what bench reports alongside either method (the
decode budget, the GPUs at the end), then the table or --json on stdout, --csv with its receipt beside it, --plot,
and the exit code: a failure or Ctrl-C still prints the rows measured so far (exit 1 or 130)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from ..engine.cliapp import Connect
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.console import print_error
from ..engine.errors import EXIT_INTERRUPTED
from ..engine.report import print_json
from . import alongside
from .method import Method, PlanT
from .receipts import write_beside
from .target import Target

FindTarget = Callable[..., tuple[Target, Path | None]]


def bench(method: Method[PlanT], args: argparse.Namespace, connect: Connect, find_target: FindTarget) -> int:
    plan = method.plan(args)
    target, head_tokenizer = find_target(args, connect, tokenizer=method.tokenizer)
    started = time.monotonic()
    measured = method.run(plan, args, target, head_tokenizer)
    run_s = time.monotonic() - started  # Prometheus' range over the run, where `monitor up` runs it
    doc, ours = measured.document()
    extra = alongside.gather(args, connect, measured.target.config, measured.itl(), measured.code, run_s)
    ours.update(extra.to_json())  # beside the method's keys, never inside them
    if args.json:
        print_json(doc)
    elif measured.any():
        measured.table(extra)
    gpus = extra.gpu_line()
    if gpus and not args.json:
        console.print(gpus, highlight=False, markup=False)
    seen = extra.prometheus_line()
    if seen and not args.json:
        console.print(seen, highlight=False, markup=False)
    if measured.any() and args.csv:  # the receipt beside it (FILE.receipt.json)
        measured.csv(Path(args.csv))
        write_beside(Path(args.csv), measured.receipt)
    if measured.any() and args.plot:
        measured.plot(Path(args.plot))
    measured.finish()
    if measured.failure:
        print_error(measured.failure.message, measured.failure.fix)
    elif measured.code == EXIT_INTERRUPTED:
        err_console.print(f"interrupted: {measured.done()} measured", highlight=False)
    return measured.code
