"""`bench` with the closed loop (--method sustained, the default): its flags turned into a plan before anything
connects, the sweep run with a progress bar per concurrency, and its panels: the table (with the decode ceiling, the
speedup over an earlier run and the published reference under it), the JSON document, the CSV and the plot."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from .... import __version__
from ....engine.console import err as err_console
from ....engine.console import out as console
from ....engine.errors import EXIT_OK, SparkclusterError, UsageError
from ....recipes.load import Reference
from ... import ceiling, method
from ...alongside import Alongside
from ...compare import is_results_file
from ...context import DoesNotFit
from ...endpoint import BenchFailed
from ...method import check_timeout, ending
from ...receipt import Receipt
from ...target import Target
from . import plot, reference, table
from .receipt import sustained_parameters, sweep_receipt
from .sweep import (
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

METHOD = """method: one warm-up request first (the JIT warms on it, as the published recipes do); then, at each
concurrency C, --runs runs of C x --requests-per-stream streamed /v1/completions requests with C kept in flight
(each stream sends its next request when its last one ends). Token counts are the server's
(stream_options.include_usage), every request produces exactly --output-tokens (ignore_eos), and prompts of
--prompt-tokens (learnt from the server's usage, no tokenizer needed) differ from their first token on, so the
prefix cache finds nothing unless --prefix-cache. Per row: prefill tok/s (prompt tokens over the time some
request waited for its first token), generation tok/s (output tokens while all C streams were busy, over that
time), peak tok/s (the best 1 s of output), TTFT / ITL / E2E mean, p50, p90, p99 per request; the median of the
runs (counts are totals). vLLM's /metrics is sampled once a second beside each run."""

DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS = 512, 128  # fitted to a smaller served context; a size given is kept


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
    check_timeout(args)
    concurrency = ",".join(args.concurrency) if args.concurrency else "1,2,4,8,16,32,64"
    runs = 3 if args.runs is None else args.runs
    return SweepOptions(concurrency_list(concurrency), prompt_tokens, output_tokens, runs,
                        args.warmup, args.requests_per_stream, args.prefix_cache, args.timeout,
                        prompt_given=args.prompt_tokens is not None, output_given=args.output_tokens is not None)


def check_outputs(args: argparse.Namespace) -> None:
    """Output paths and the plotting library, before any request is sent."""
    method.check_outputs(args)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib", "pip install matplotlib (sparkcluster depends on it)")


def document(target: Target, opts: SweepOptions, prepared: Prepared, levels: list[Level], started: str) -> dict[str, Any]:
    config = {
        **target.config, "model": prepared.model or target.model, "server_version": prepared.server_version,
        "method": sustained_parameters(opts, prepared),
        "client": f"sparkcluster {__version__}, aiohttp {version('aiohttp')}", "started": started,
    }
    return {"config": config, "rows": [level.row.to_json() for level in levels],
            "server": [table.server_doc(level.server) for level in levels]}


def progress(enabled: bool) -> tuple[Progress | None, Emit]:
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


@dataclass(frozen=True)
class Plan:
    opts: SweepOptions
    baseline: dict[str, Any] | None  # an earlier bench --json, e.g. one node's: the speedup over it
    reference: Reference | None  # a recipe's published rows


def plan(args: argparse.Namespace) -> Plan:
    opts = sweep_options(args)
    check_outputs(args)
    if args.compare and is_results_file(args.compare):
        raise UsageError(f"--compare {args.compare}: llama-benchy rows (bursts of chat requests, pp/tg at a depth) "
                         "are not comparable with --method sustained's closed loop of completions",
                         f"measure the same way: --method llama-benchy --compare {args.compare}")
    baseline = ceiling.load_run(args.compare) if args.compare else None  # an earlier bench --json, e.g. one node
    found: Reference | None = (reference.load_reference(args.compare) if args.compare and baseline is None
                               else None)
    return Plan(opts, baseline, found)


@dataclass
class Measured:
    """The sweep's levels so far, and how it ended."""

    plan: Plan
    target: Target
    started: str
    levels: list[Level] = field(default_factory=list)
    prepared: Prepared = field(default_factory=Prepared)
    code: int = EXIT_OK
    failure: SparkclusterError | None = None  # BenchFailed or DoesNotFit
    receipt: Receipt = field(init=False)

    @property
    def opts(self) -> SweepOptions:
        return self.prepared.options or self.plan.opts  # what was measured: the default sizes fitted to the context

    def any(self) -> bool:
        return bool(self.levels)

    def itl(self) -> Sequence[tuple[int, float | None]]:
        return [(level.row.concurrency, level.row.itl_s.p50) for level in self.levels]

    def ratios(self) -> list[reference.Ratio]:
        found = self.plan.reference
        return reference.ratios([level.row for level in self.levels], found) if found else []

    def document(self) -> tuple[dict[str, Any], dict[str, Any]]:
        doc = document(self.target, self.opts, self.prepared, self.levels, self.started)
        doc["receipt"] = self.receipt.to_json()
        if self.plan.reference:
            doc["compare"] = {"reference": dataclasses.asdict(self.plan.reference), "ratios": [
                {**dataclasses.asdict(r), "ratio": r.ratio} for r in self.ratios()]}
        if self.plan.baseline:
            doc["speedup"] = ceiling.speedups(self.levels, self.plan.baseline)
        if self.failure:
            doc["error"] = {"message": self.failure.message, "fix": self.failure.fix}
        return doc, doc

    def table(self, extra: Alongside) -> None:
        opts, prepared, target = self.opts, self.prepared, self.target
        title = (f"{prepared.model} at {target.base_url}: prompt {prepared.prompt_tokens or opts.prompt_tokens} "
                 f"tok, output {opts.output_tokens} tok, median of {opts.runs} run{'s' if opts.runs > 1 else ''}")
        limit = target.config.get("decode_ceiling")
        console.print(table.render(self.levels, escape(title), limit["tokens_per_s"] if limit else None))
        if limit:
            console.print(ceiling.describe(limit), highlight=False)
        budget = extra.budget_text()
        if budget:
            console.print(budget, highlight=False, markup=False)
        if self.plan.baseline:
            console.print(ceiling.speedup_lines(self.levels, self.plan.baseline), highlight=False)
        if self.plan.reference:
            console.print(reference.render(self.ratios(), self.plan.reference))

    def csv(self, path: Path) -> None:
        table.save_csv(self.levels, path)

    def plot(self, path: Path) -> None:
        opts = self.opts
        plot.save([level.row for level in self.levels], path,
                  f"{self.prepared.model} at {self.target.base_url} (prompt {opts.prompt_tokens}, output "
                  f"{opts.output_tokens})\n{self.receipt.caption()}", self.plan.reference)

    def finish(self) -> None:
        """No files of its own."""

    def done(self) -> str:
        return f"{len(self.levels)} of {len(self.opts.concurrency)} concurrencies"


class ClosedLoop:
    tokenizer = False

    def plan(self, args: argparse.Namespace) -> Plan:
        return plan(args)

    def run(self, plan_: Plan, args: argparse.Namespace, target: Target, head_tokenizer: Path | None) -> Measured:
        opts = plan_.opts
        if not args.json:
            err_console.print(f"bench: {escape(target.base_url)} ({', '.join(map(str, opts.concurrency))} "
                              "concurrent)", highlight=False)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        measured = Measured(plan_, target, started)
        bar, emit = progress(not args.json)
        try:
            with ending(measured, (BenchFailed, DoesNotFit)):
                if bar:
                    bar.start()
                asyncio.run(sweep(target.base_url, target.model, opts, measured.levels, measured.prepared, emit,
                                  target.api_key, target.engine_metrics))
        finally:
            if bar:
                bar.stop()
        measured.receipt = sweep_receipt(target, measured.prepared,
                                         sustained_parameters(measured.opts, measured.prepared))
        return measured
