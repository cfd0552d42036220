"""`sparkcluster bench`: flags checked before anything connects, the target found, the sweep run with a progress
bar per concurrency, then the results (table or --json on stdout, --csv, --plot, --compare). A failure or Ctrl-C
still prints the rows measured so far (exit 1 or 130)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import importlib.util
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .. import __version__
from ..engine import flags
from ..engine.cliapp import App, Connect
from ..engine.console import err as err_console
from ..engine.console import out as console
from ..engine.console import print_error
from ..engine.errors import EXIT_INTERRUPTED, EXIT_OK, UsageError
from ..engine.report import print_json
from ..engine.session import Session
from ..recipes.load import Reference
from . import alongside, ceiling, decode_budget
from .context import DoesNotFit
from .endpoint import BenchFailed
from .explain import lineup as explain_lineup
from .explain import sides as explain_sides
from .layouts import cli as layouts_cli
from .methods.closed_loop import plot as sweep_plot
from .methods.closed_loop import reference as compare
from .methods.closed_loop import table
from .methods.closed_loop.receipt import sustained_parameters, sweep_receipt
from .methods.closed_loop.sweep import (
    BenchEvent,
    Emit,
    Level,
    LevelStarted,
    Prepared,
    RequestDone,
    SweepOptions,
    ignore,
    sweep,
)
from .methods.llama_benchy import cli as llama_benchy_cli
from .methods.llama_benchy import head_tokenizer, published
from .receipts import write_beside
from .target import Target, from_cluster, from_url

METHOD = """method: one warm-up request first (the JIT warms on it, as the published recipes do); then, at each
concurrency C, --runs runs of C x --requests-per-stream streamed /v1/completions requests with C kept in flight
(each stream sends its next request when its last one ends). Token counts are the server's
(stream_options.include_usage), every request produces exactly --output-tokens (ignore_eos), and prompts of
--prompt-tokens (learnt from the server's usage, no tokenizer needed) differ from their first token on, so the
prefix cache finds nothing unless --prefix-cache. Per row: prefill tok/s (prompt tokens over the time some
request waited for its first token), generation tok/s (output tokens while all C streams were busy, over that
time), peak tok/s (the best 1 s of output), TTFT / ITL / E2E mean, p50, p90, p99 per request; the median of the
runs (counts are totals). vLLM's /metrics is sampled once a second beside each run."""


def concurrency_list(text: str) -> tuple[int, ...]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 or v > 4096 for v in values):
        raise UsageError(f"--concurrency {text!r} is not a list of concurrencies", "e.g. --concurrency 1,2,4,8,16")
    return tuple(dict.fromkeys(values))  # each once, in the order given


def sweep_options(args: argparse.Namespace) -> SweepOptions:
    """The flags as the sweep's options; a prompt or output size not given is the default, which the sweep fits to
    the served context."""
    prompt_tokens = DEFAULT_PROMPT_TOKENS if args.prompt_tokens is None else args.prompt_tokens
    output_tokens = DEFAULT_OUTPUT_TOKENS if args.output_tokens is None else args.output_tokens
    for flag, value, least in (("--prompt-tokens", prompt_tokens, 1), ("--output-tokens", output_tokens, 1),
                               ("--runs", 3 if args.runs is None else args.runs, 1), ("--warmup", args.warmup, 0),
                               ("--requests-per-stream", args.requests_per_stream, 1)):
        if value < least:
            raise UsageError(f"{flag} {value} is below {least}", f"give {flag} {max(least, 1)} or more")
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g} is not a duration", "give seconds, e.g. --timeout 600")
    concurrency = ",".join(args.concurrency) if args.concurrency else "1,2,4,8,16,32,64"
    runs = 3 if args.runs is None else args.runs
    return SweepOptions(concurrency_list(concurrency), prompt_tokens, output_tokens, runs,
                        args.warmup, args.requests_per_stream, args.prefix_cache, args.timeout,
                        prompt_given=args.prompt_tokens is not None, output_given=args.output_tokens is not None)


def check_outputs(args: argparse.Namespace) -> None:
    """Output paths and the plotting library, before any request is sent."""
    for flag, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: its directory does not exist", "create it, or write elsewhere")
    if args.plot:
        if not args.plot.lower().endswith(".png"):
            raise UsageError(f"--plot {args.plot} is not a .png file", "e.g. --plot bench.png")
        if importlib.util.find_spec("matplotlib") is None:
            raise UsageError("--plot needs matplotlib", "pip install matplotlib (sparkcluster depends on it)")


def document(target: Target, opts: SweepOptions, prepared: Prepared, levels: list[Level], started: str) -> dict[str, Any]:
    config = {
        **target.config, "model": prepared.model or target.model, "server_version": prepared.server_version,
        "method": sustained_parameters(opts, prepared),
        "client": f"sparkcluster {__version__}, aiohttp {version('aiohttp')}", "started": started,
    }
    return {"config": config, "rows": [level.row.to_json() for level in levels],
            "server": [table.server_doc(level.server) for level in levels]}


def _progress(enabled: bool) -> tuple[Progress | None, Emit]:
    """The sweep's events as a bar per concurrency and a line per note, on stderr."""
    if not enabled:
        return None, ignore
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=err_console, transient=False)
    tasks: dict[int, TaskID] = {}

    def show(event: BenchEvent) -> None:
        if isinstance(event, LevelStarted):
            tasks[event.concurrency] = bar.add_task(f"c={event.concurrency:<4}", total=event.requests)
        elif isinstance(event, RequestDone):
            bar.advance(tasks[event.concurrency])
        else:
            err_console.print(event.text, highlight=False)
    return bar, show


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
        hf_model = target.config.get("hf_model")
        if tokenizer and not args.tokenizer and isinstance(hf_model, str):
            fetched = head_tokenizer.fetch(session, hf_model)
    return (dataclasses.replace(target, model=args.model) if args.model else target), fetched


# Each method's own flags, with their defaults: a flag of the other method would be silently ignored.
DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS = 512, 128  # fitted to a smaller served context; a size given is kept
SUSTAINED_DEFAULTS: dict[str, object] = {"prompt_tokens": None, "output_tokens": None, "warmup": 1,
                                         "requests_per_stream": 4, "prefix_cache": False}
BENCHY_DEFAULTS: dict[str, object] = {"pp": None, "tg": None, "depth": None, "latency_mode": "api",
                                      "enable_prefix_caching": False, "no_cache": False, "skip_coherence": False,
                                      "no_warmup": False, "no_adapt_prompt": False, "tokenizer": None, "corpus": None,
                                      "book_url": None, "out": None}


def check_method_flags(args: argparse.Namespace, benchy: bool, allowed: tuple[str, ...] = ()) -> None:
    """Refuse, before anything connects, a flag the chosen method does not read (`allowed`: read elsewhere)."""
    others = SUSTAINED_DEFAULTS if benchy else BENCHY_DEFAULTS
    given = ["--" + name.replace("_", "-") for name, default in others.items()
             if getattr(args, name) != default and name not in allowed]
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
    layouts_cli.check_flags(args)
    if args.layouts:  # each layout served in turn and measured the same way; --out DIR holds its resume state
        check_method_flags(args, benchy=False, allowed=("out",))
        return layouts_cli.cmd(args, connect, sweep_options(args), _progress)
    benchy = args.method == "llama-benchy" or bool(args.profile)
    check_method_flags(args, benchy)
    if benchy:
        plan = llama_benchy_cli.plan(args)
        target, fetched = find_target(args, connect, tokenizer=True)
        return llama_benchy_cli.cmd(args, target, plan, connect, fetched)
    opts = sweep_options(args)
    check_outputs(args)
    if args.compare and published.is_results_file(args.compare):
        raise UsageError(f"--compare {args.compare}: llama-benchy rows (bursts of chat requests, pp/tg at a depth) "
                         "are not comparable with --method sustained's closed loop of completions",
                         f"measure the same way: --method llama-benchy --compare {args.compare}")
    baseline = ceiling.load_run(args.compare) if args.compare else None  # an earlier bench --json, e.g. one node
    reference: Reference | None = (compare.load_reference(args.compare) if args.compare and baseline is None
                                   else None)
    target, _ = find_target(args, connect)
    if not args.json:
        err_console.print(f"bench: {escape(target.base_url)} ({', '.join(map(str, opts.concurrency))} concurrent)",
                          highlight=False)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    levels: list[Level] = []
    prepared = Prepared()
    bar, emit = _progress(not args.json)
    failure: BenchFailed | DoesNotFit | None = None
    code = EXIT_OK
    try:
        if bar:
            bar.start()
        asyncio.run(sweep(target.base_url, target.model, opts, levels, prepared, emit, target.api_key,
                          target.engine_metrics))
    except (BenchFailed, DoesNotFit) as e:
        failure, code = e, e.exit_code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    finally:
        if bar:
            bar.stop()
    opts = prepared.options or opts  # what was measured: the default sizes fitted to the served context
    doc = document(target, opts, prepared, levels, started)
    receipt = sweep_receipt(target, prepared, doc["config"]["method"])
    doc["receipt"] = receipt.to_json()
    found = compare.ratios([level.row for level in levels], reference) if reference else []
    if reference:
        doc["compare"] = {"reference": dataclasses.asdict(reference), "ratios": [
            {**dataclasses.asdict(r), "ratio": r.ratio} for r in found]}
    if baseline:
        doc["speedup"] = ceiling.speedups(levels, baseline)
    if failure:
        doc["error"] = {"message": failure.message, "fix": failure.fix}
    extra = alongside.gather(args, connect, target.config,
                             [(level.row.concurrency, level.row.itl_s.p50) for level in levels], code)
    doc.update(extra.to_json())
    if args.json:
        print_json(doc)
    elif levels:
        title = (f"{prepared.model} at {target.base_url}: prompt {prepared.prompt_tokens or opts.prompt_tokens} "
                 f"tok, output {opts.output_tokens} tok, median of {opts.runs} run{'s' if opts.runs > 1 else ''}")
        limit = target.config.get("decode_ceiling")
        console.print(table.render(levels, escape(title), limit["tokens_per_s"] if limit else None))
        if limit:
            console.print(ceiling.describe(limit), highlight=False)
        budget = extra.budget_text()
        if budget:
            console.print(budget, highlight=False, markup=False)
        if baseline:
            console.print(ceiling.speedup_lines(levels, baseline), highlight=False)
        if reference:
            console.print(compare.render(found, reference))
    gpus = extra.gpu_line()
    if gpus and not args.json:
        console.print(gpus, highlight=False, markup=False)
    if levels and args.csv:
        table.save_csv(levels, Path(args.csv))
        write_beside(Path(args.csv), receipt)
    if levels and args.plot:
        sweep_plot.save([level.row for level in levels], Path(args.plot),
                  f"{prepared.model} at {target.base_url} (prompt {opts.prompt_tokens}, output {opts.output_tokens})"
                  f"\n{receipt.caption()}", reference)
    if failure:
        print_error(failure.message, failure.fix)
    elif code == EXIT_INTERRUPTED:
        err_console.print(f"interrupted: {len(levels)} of {len(opts.concurrency)} concurrencies measured",
                          highlight=False)
    return code


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    p = app.connecting(commands.add_parser(
        "bench", help="measure what the served cluster delivers: throughput and latency at each concurrency",
        description="Throughput and latency of the served model at each concurrency, measured the way the "
                    "DGX Spark community publishes them.", epilog=METHOD + "\n\n" + llama_benchy_cli.METHOD,
        formatter_class=argparse.RawDescriptionHelpFormatter), inventory_positional=False)
    p.add_argument("--url", help="any OpenAI-compatible endpoint, e.g. http://HOST:8000/v1 (then no inventory is "
                                 "needed); default: the endpoint `serve` recorded on the inventory's head")
    p.add_argument("--model", help="the served model name (default: the one `serve` recorded, or the server's); "
                                   "with --layouts, the model to serve, as serve's --model")
    p.add_argument("--concurrency", nargs="+", metavar="C",
                   help="requests in flight, space- or comma-separated (default 1,2,4,8,16,32,64; llama-benchy: 1)")
    p.add_argument("--prompt-tokens", type=flags.count, default=None,
                   help=f"prompt length in tokens (default {DEFAULT_PROMPT_TOKENS}, halved with --output-tokens' "
                        "default until both fit the served context)")
    p.add_argument("--output-tokens", type=flags.count, default=None,
                   help=f"tokens each request generates (default {DEFAULT_OUTPUT_TOKENS}, halved likewise)")
    p.add_argument("--runs", type=flags.count, default=None,
                   help="runs per concurrency (llama-benchy: per cell); rows are their median (mean ± std) (default 3)")
    p.add_argument("--warmup", type=flags.non_negative, default=SUSTAINED_DEFAULTS["warmup"],
                   help="warm-up requests before measuring (default 1)")
    p.add_argument("--requests-per-stream", type=flags.count, default=SUSTAINED_DEFAULTS["requests_per_stream"],
                   help="requests each of the C streams sends per run (default 4)")
    p.add_argument("--prefix-cache", action="store_true",
                   help="send the same prompt every time, so the prefix cache serves it (default: unique prompts)")
    p.add_argument("--timeout", type=flags.seconds, default=600.0,
                   help="seconds one request may take in all before it counts as failed (default 600)")
    p.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="draw throughput and latency against concurrency")
    p.add_argument("--compare", metavar="RECIPE|FILE",
                   help="print each row beside published ones, with the ratio: a recipe's reference rows "
                        "(--method sustained), or a llama-benchy CSV/JSON or Arena benchmark.csv (--method "
                        "llama-benchy; rows of the same shape only); or an earlier `bench --json` file (e.g. of a "
                        "one-node serve): the speedup of this run over it at each concurrency")
    p.add_argument("--explain", nargs="+", metavar="RESULT",
                   help="why two results differ, measuring nothing: --explain A B (two `bench --json` files, or a "
                        "layout of a `bench --layouts` result: DIR/layouts.json:tp), or "
                        "--explain A --compare RECIPE (its published rows); their receipts and numbers lined up, "
                        "every difference named and ranked by what it can explain (acceptance, engine flags, "
                        "layout, versions, kernel/driver/firmware, load shape, memory ceiling)")
    p.add_argument("--bandwidth", type=flags.bandwidth, default=ceiling.GB10_BANDWIDTH_GBPS,
                   help="memory bandwidth per node in GB/s for the decode ceiling (default 273, a GB10's)")
    llama_benchy_cli.add_flags(p)
    layouts_cli.add_flags(p)
    app.wire(p, cmd_bench)
