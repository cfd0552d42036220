"""`sparkcluster bench`: its flags, the method they choose (the closed loop or llama-benchy's, each a Method of
methods/), run in the one shell (shell.py): the plan checked before anything connects, the target found, the run,
then the results (table or --json on stdout, --csv, --plot, --compare). A failure or Ctrl-C still prints the rows
measured so far (exit 1 or 130). `--layouts` serves each layout and measures it the same way; `--explain` compares
two results."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine import flags
from ..engine.cliapp import App, Connect
from ..engine.console import out as console
from ..engine.errors import EXIT_OK, UsageError
from ..engine.report import print_json
from ..engine.session import Session
from . import ceiling, decode_budget, shell
from .explain import lineup as explain_lineup
from .explain import sides as explain_sides
from .flagset import FlagSet
from .layouts import cli as layouts_cli
from .layouts import methods as layouts_methods
from .method import Method
from .methods.closed_loop import cli as closed_loop_cli
from .methods.llama_benchy import cli as llama_benchy_cli
from .methods.llama_benchy import head_tokenizer
from .target import Target, from_cluster, from_url


def served_figures(session: Session, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """The served model's decode ceiling and its decode budget's inputs (verify's latency among them), read from
    the head once; they ride in the config, where the JSON document and the table both read them."""
    served = ceiling.served_model(session, target.config)
    if served is None:
        return {}
    found = ceiling.for_served(served, target.config, args.bandwidth)
    step = decode_budget.for_served(served, target.config, decode_budget.last_verify_record(session))
    return {**({"decode_ceiling": found.to_json()} if found else {}),
            **({"decode_step": step.to_json()} if step else {})}


def find_target(args: argparse.Namespace, connect: Connect, tokenizer: bool = False) -> tuple[Target, Path | None]:
    """The endpoint (and, for `tokenizer`, the served model's tokenizer.json from the head when this machine
    has none and --tokenizer gave none)."""
    if args.url:
        return from_url(args.url, args.model), None
    fetched = None
    with connect(args, lambda inventory: None) as session:
        target = from_cluster(session)
        target = dataclasses.replace(target, config={**target.config, **served_figures(session, target, args)})
        if tokenizer:
            fetched = head_tokenizer.for_target(session, target.config, args.tokenizer)
    return (dataclasses.replace(target, model=args.model) if args.model else target), fetched


@dataclass(frozen=True)
class Modes:
    """The flags each mode alone reads, their defaults as declared (flagset.py)."""

    sustained: FlagSet  # the closed loop's own
    benchy: FlagSet  # llama-benchy's own
    one_endpoint: FlagSet  # what measures one served endpoint, which --layouts serves and measures itself


def modes() -> Modes:
    """Read off bench's declarations, on a parser of their own."""
    return add_flags(argparse.ArgumentParser(add_help=False))


def check_method_flags(args: argparse.Namespace, benchy: bool, allowed: tuple[str, ...] = ()) -> None:
    """Refuse, before anything connects, a flag the chosen method does not read (`allowed`: read elsewhere)."""
    found = modes()
    given = (found.sustained if benchy else found.benchy).given(args, allowed)
    if given:
        method = "llama-benchy" if benchy else "sustained"
        raise UsageError(f"{', '.join(given)}: not a flag of --method {method}, which would ignore it",
                         f"leave it out, or measure with --method {'sustained' if benchy else 'llama-benchy'}")


def cmd_explain(args: argparse.Namespace) -> int:
    """`--explain A B`: two results' receipts and numbers lined up, the differences ranked; nothing connects."""
    found = explain_lineup.explain(*explain_sides.sides(args.explain, args.compare))
    if args.json:
        print_json(found.to_json())
    else:
        console.print(explain_lineup.render(found), markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK


def cmd_bench(args: argparse.Namespace, connect: Connect) -> int:
    if args.explain:
        return cmd_explain(args)
    layouts_cli.check_flags(args, modes().one_endpoint)
    benchy = args.method == "llama-benchy" or bool(args.profile)
    if args.layouts:  # each layout served in turn and measured the same way; --out DIR holds its resume state
        check_method_flags(args, benchy, allowed=("out",))
        return layouts_cli.cmd(args, connect, layouts_methods.for_flags(args))
    check_method_flags(args, benchy)
    method: Method[Any] = llama_benchy_cli.LlamaBenchy() if benchy else closed_loop_cli.ClosedLoop()
    return shell.bench(method, args, connect, find_target)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    p = app.connecting(commands.add_parser(
        "bench", help="measure what the served cluster delivers: throughput and latency at each concurrency",
        description="Throughput and latency of the served model at each concurrency, measured the way the "
                    "DGX Spark community publishes them.",
        epilog=closed_loop_cli.METHOD + "\n\n" + llama_benchy_cli.METHOD,
        formatter_class=argparse.RawDescriptionHelpFormatter), inventory_positional=False)
    add_flags(p)
    app.wire(p, cmd_bench)


def add_flags(p: argparse.ArgumentParser) -> Modes:
    """bench's flags, each declared once with its default; which mode reads which, for the refusals."""
    url = p.add_argument("--url", help="any OpenAI-compatible endpoint, e.g. http://HOST:8000/v1 (then no "
                                       "inventory is needed); default: the endpoint `serve` recorded on the "
                                       "inventory's head")
    p.add_argument("--model", help="the served model name (default: the one `serve` recorded, or the server's); "
                                   "with --layouts, the model to serve, as serve's --model")
    p.add_argument("--concurrency", nargs="+", metavar="C",
                   help="requests in flight, space- or comma-separated (default 1,2,4,8,16,32,64; llama-benchy: 1)")
    sustained = [  # the closed loop's own
        p.add_argument("--prompt-tokens", type=flags.count, default=None,
                       help=f"prompt length in tokens (default {closed_loop_cli.DEFAULT_PROMPT_TOKENS}, halved with "
                            "--output-tokens' default until both fit the served context)"),
        p.add_argument("--output-tokens", type=flags.count, default=None,
                       help=f"tokens each request generates (default {closed_loop_cli.DEFAULT_OUTPUT_TOKENS}, "
                            "halved likewise)")]
    p.add_argument("--runs", type=flags.count, default=None,
                   help="runs per concurrency (llama-benchy: per cell); rows are their median (mean ± std) (default 3)")
    sustained += [
        p.add_argument("--warmup", type=flags.non_negative, default=1,
                       help="warm-up requests before measuring (default 1)"),
        p.add_argument("--requests-per-stream", type=flags.count, default=4,
                       help="requests each of the C streams sends per run (default 4)"),
        p.add_argument("--prefix-cache", action="store_true",
                       help="send the same prompt every time, so the prefix cache serves it (default: unique "
                            "prompts)")]
    p.add_argument("--timeout", type=flags.seconds, default=600.0,
                   help="seconds one request may take in all before it counts as failed (default 600)")
    csv = p.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    plot = p.add_argument("--plot", metavar="FILE.png", help="draw throughput and latency against concurrency")
    compare = p.add_argument(
        "--compare", metavar="RECIPE|FILE",
        help="print each row beside published ones, with the ratio: a recipe's reference rows (--method sustained), "
             "or a llama-benchy CSV/JSON or Arena benchmark.csv (--method llama-benchy; rows of the same shape only); "
             "or an earlier `bench --json` file (e.g. of a one-node serve): the speedup of this run over it at each "
             "concurrency")
    p.add_argument("--explain", nargs="+", metavar="RESULT",
                   help="why two results differ, measuring nothing: --explain A B (two `bench --json` files, or a "
                        "layout of a `bench --layouts` result: DIR/layouts.json:tp), or "
                        "--explain A --compare RECIPE (its published rows); their receipts and numbers lined up, "
                        "every difference named and ranked by what it can explain (acceptance, engine flags, "
                        "layout, versions, kernel/driver/firmware, load shape, memory ceiling)")
    p.add_argument("--bandwidth", type=flags.bandwidth, default=ceiling.GB10_BANDWIDTH_GBPS,
                   help="memory bandwidth per node in GB/s for the decode ceiling (default 273, a GB10's)")
    _, profile, benchy = llama_benchy_cli.add_flags(p)
    layouts_cli.add_flags(p)
    return Modes(FlagSet.of(sustained), FlagSet.of(benchy), FlagSet.of((url, compare, csv, plot, profile)))
