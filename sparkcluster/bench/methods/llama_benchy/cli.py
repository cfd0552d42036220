"""`bench --method llama-benchy` and `bench --profile`: llama-benchy's flags (each of --pp --tg --depth
--concurrency takes several values, space- or comma-separated), checked before anything connects; the grid fitted
to the served context (fit.py) before any request; the session run; then llama-benchy's outputs (its markdown
table, --json its document with ours under `sparkcluster`, --csv FILE its columns, --plot), what bench reports
alongside either method (the decode budget, the GPUs at the end: under the table, and under `sparkcluster`) and,
for a profile, the Arena's files in --out DIR, rewritten after every cell so an interruption keeps every finished
one and a re-run measures only the rest."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from .... import __version__
from ....engine.console import err as err_console
from ....engine.console import out as console
from ....engine.errors import EXIT_OK, SparkclusterError, UsageError
from ... import ceiling
from ...alongside import Alongside
from ...compare import is_results_file
from ...method import check_outputs, check_timeout, ending
from ...receipt import Receipt
from ...receipts import save
from ...target import Target
from . import arena, formats, plot, published
from .arithmetic import BenchmarkRun, itl_by_concurrency
from .chat import Client
from .corpus import BOOK_URL, Corpus, book_text, find_tokenizer, read_corpus
from .fit import fit_grid
from .profile import Profile, load_profile
from .receipt import ARENA_RECEIPT, benchy_receipt
from .run import Outcome, served_model, session_run
from .schedule import BenchyOptions, Cell, cells

METHOD = """llama-benchy (0.4.0's requests, timing and arithmetic): streamed chat completions, the depth as a
system message and the prompt as the user's, cut from a book with the model's tokenizer; per cell a warm-up
run and --runs runs, each a burst of C requests at once; pp = prompt tokens / (time to first response - the
measured latency), tg = tokens after the first / (last token - first token), peak = most tokens in 1 s; mean and
population std of the runs, latencies in ms. Unlike llama-benchy, a grid whose depth + pp + tg passes the served
context (max_model_len) is refused before any request, naming the largest that fits (the default --pp is fitted)."""


@dataclass(frozen=True)
class Plan:
    opts: BenchyOptions
    cells: tuple[Cell, ...]
    profile: Profile | None
    out: Path | None
    published: published.Published | None = None
    pp_given: bool = True  # False: --pp's default, which is fitted to the served context


def with_compare(args: argparse.Namespace, plan_: Plan) -> Plan:
    """--compare for llama-benchy rows: a llama-benchy or Arena results file whose shapes this run measures."""
    if not args.compare:
        return plan_
    if not is_results_file(args.compare):
        raise UsageError(f"--compare {args.compare}: a recipe's reference rows are by concurrency alone, as "
                         "--method sustained measures them, not llama-benchy's pp/tg at a depth",
                         "compare a recipe's reference with --method sustained, or give a llama-benchy CSV/JSON "
                         "(or an Arena benchmark.csv) here")
    found = published.load(Path(args.compare))
    published.check(found, published.planned_shapes(plan_.cells, plan_.opts.prefix_caching))
    return dataclasses.replace(plan_, published=found)


def ints(values: list[str] | None, flag: str, default: tuple[int, ...], least: int) -> tuple[int, ...]:
    """`--pp 512 1024`, `--pp 512,1024` or both: each value once, in the order given."""
    if not values:
        return default
    try:
        found = [int(v) for text in values for v in text.split(",") if v.strip()]
    except ValueError:
        found = []
    if not found or any(v < least for v in found):
        raise UsageError(f"{flag} {' '.join(values)} is not a list of whole numbers >= {least}",
                         f"e.g. {flag} {max(least, 1)} or {flag} 1,2,4")
    return tuple(dict.fromkeys(found))


def plan(args: argparse.Namespace, own_out: bool = True) -> Plan:
    """Every flag checked, the cells in the order they will run; UsageError (exit 2) before any connection.
    `own_out`: --out is this method's folder (False under --layouts, whose folder it is)."""
    check_timeout(args)
    if args.corpus and not Path(args.corpus).is_file():
        raise UsageError(f"--corpus {args.corpus}: no such file", "give a text file (a book)")
    if args.tokenizer and not Path(args.tokenizer).exists():
        raise UsageError(f"--tokenizer {args.tokenizer}: no such file or directory",
                         "give the model's tokenizer.json, or its snapshot directory")
    profile = load_profile(args.profile) if args.profile else None
    out = Path(args.out) if args.out and own_out else None
    if profile is not None:
        if out is None:
            raise UsageError("--profile needs --out DIR", "the Arena's files (and each finished cell) go there")
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file", "give a directory (it is created)")
        if not out.resolve().parent.is_dir():
            raise UsageError(f"--out {out}: its parent directory does not exist", "create it, or write elsewhere")
        for flag in ("pp", "tg", "depth"):
            if getattr(args, flag):
                raise UsageError(f"--{flag} with --profile: the profile sets the grid", f"leave --{flag} out")
    elif out is not None:
        raise UsageError("--out is for --profile", "write the results with --json, --csv FILE or --plot FILE")
    check_outputs(args)
    if profile is not None:
        opts = BenchyOptions(runs=profile.runs if args.runs is None else args.runs, latency_mode=profile.latency_mode,
                             prefix_caching=profile.prefix_caching, no_cache=args.no_cache,
                             warmup=not args.no_warmup, coherence=not args.skip_coherence,
                             adapt_prompt=not args.no_adapt_prompt)
        grid = tuple(Cell(d, p, t, c) for d, c in profile.order() for p in profile.pp for t in profile.tg)
        return with_compare(args, Plan(opts, grid, profile, out))
    opts = BenchyOptions(runs=3 if args.runs is None else args.runs, latency_mode=args.latency_mode,
                         prefix_caching=args.enable_prefix_caching, no_cache=args.no_cache,
                         warmup=not args.no_warmup, coherence=not args.skip_coherence,
                         adapt_prompt=not args.no_adapt_prompt)
    return with_compare(args, Plan(opts, tuple(cells(
        ints(args.depth, "--depth", (0,), 0), ints(args.pp, "--pp", (2048,), 1), ints(args.tg, "--tg", (32,), 1),
        ints(args.concurrency, "--concurrency", (1,), 1))), None, None, pp_given=bool(args.pp)))


def corpus_for(args: argparse.Namespace, model: str, hf_model: str | None, from_head: Path | None) -> Corpus:
    text = read_corpus(Path(args.corpus)) if args.corpus else book_text(args.book_url or BOOK_URL)
    return Corpus(text, find_tokenizer(args.tokenizer or (str(from_head) if from_head else None), hf_model or model))


def header(plan_: Plan, model: str, outcome: Outcome, started: datetime.datetime) -> formats.Header:
    latency = outcome.session.latency_s if outcome.session else 0.0
    return formats.Header(started.strftime("%Y-%m-%d %H:%M:%SZ"), plan_.opts.latency_mode, latency * 1000,
                                model, plan_.opts.prefix_caching, max(c.concurrency for c in plan_.cells))


def ours(target: Target, plan_: Plan, corpus: Corpus | None, outcome: Outcome,
         failure: SparkclusterError | None, context: int | None) -> dict[str, Any]:
    """What sparkcluster adds to llama-benchy's document, under one key."""
    doc: dict[str, Any] = {
        "version": __version__, "method": "llama-benchy", "target": target.config, "max_model_len": context,
        "runs": plan_.opts.runs, "warmup_run_per_cell": plan_.opts.warmup, "no_cache": plan_.opts.no_cache,
        "adapt_prompt": plan_.opts.adapt_prompt, "cells_planned": len(plan_.cells),
        "cells_measured": outcome.cells_done,
        "tokenizer": corpus.tokenizer.name if corpus else None,
        "coherence_answer": outcome.session.answer if outcome.session else None,
        "profile": plan_.profile.name if plan_.profile else None,
        "tokens": outcome.tally.to_json() if outcome.tally else None,
    }
    if failure:
        doc["error"] = {"message": failure.message, "fix": failure.fix}
    return doc


# Under the decode budget: where its ITL comes from, as llama-benchy's table has no ITL column.
ITL_SOURCE = "  ITL here: 1 / llama-benchy's tg per request (t/s (req)), at each concurrency's shallowest depth"


@dataclass
class Measured:
    """The session's cells so far (with those measured before, for a resumed profile), and how it ended."""

    plan: Plan
    target: Target
    started: datetime.datetime
    done_before: list[dict[str, Any]]
    say: Callable[[str], None]
    outcome: Outcome = field(default_factory=Outcome)
    corpus: Corpus | None = None
    context: int | None = None
    code: int = EXIT_OK
    failure: SparkclusterError | None = None
    receipt: Receipt = field(init=False)

    @property
    def model(self) -> str:
        return self.target.model or ""

    @property
    def runs(self) -> list[BenchmarkRun]:
        return [BenchmarkRun.from_json(b) for d in self.done_before for b in d["benchmarks"]] + self.outcome.runs

    def header(self) -> formats.Header:
        return header(self.plan, self.model, self.outcome, self.started)

    def any(self) -> bool:
        return bool(self.runs)

    def itl(self) -> Sequence[tuple[int, float | None]]:
        return itl_by_concurrency(self.runs)

    def ratios(self) -> list[published.Pair]:
        return published.pairs(published.rows_of_runs(self.runs), self.plan.published) if self.plan.published else []

    def document(self) -> tuple[dict[str, Any], dict[str, Any]]:
        doc = formats.document(self.header(), self.runs)
        doc["sparkcluster"] = ours(self.target, self.plan, self.corpus, self.outcome, self.failure, self.context)
        doc["sparkcluster"]["receipt"] = self.receipt.to_json()
        if self.plan.published:
            doc["sparkcluster"]["compare"] = {"source": self.plan.published.source, "ratios": [
                {"test": str(p.shape), "figure": p.figure, "measured": p.measured, "published": p.published,
                 "ratio": p.ratio} for p in self.ratios()]}
        return doc, doc["sparkcluster"]

    def table(self, extra: Alongside) -> None:
        runs = self.runs
        print(formats.markdown(self.model, runs, self.header().max_concurrency))
        limit = self.target.config.get("decode_ceiling")
        if limit:  # under llama-benchy's own table, which stays as it prints it
            console.print("\n".join([ceiling.describe(limit), *ceiling.benchy_shares(runs, limit)]), highlight=False)
        budget = extra.budget_text()
        if budget:
            console.print(f"{budget}\n{ITL_SOURCE}", highlight=False, markup=False)
        if self.plan.published:
            console.print(published.render(self.ratios(), self.plan.published.source))

    def csv(self, path: Path) -> None:  # llama-benchy's columns exactly
        path.write_text(formats.csv_text(self.model, self.runs, self.header().max_concurrency), encoding="utf-8")

    def plot(self, path: Path) -> None:
        plot.save(self.runs, path, f"{self.model} at {self.target.base_url} (llama-benchy)\n{self.receipt.caption()}")

    def finish(self) -> None:
        """A profile's Arena files and its receipt in --out DIR."""
        plan_ = self.plan
        if plan_.out is not None and plan_.profile is not None:
            arena.write(plan_.out, plan_.profile, self.target, plan_.opts, self.started, plan_.cells,
                        bool(self.done_before))
            save(plan_.out / ARENA_RECEIPT, self.receipt)
            self.say(f"{plan_.out}: benchmark.json, benchmark.csv, metadata.json, recipe.yaml "
                     f"({len(self.done_before) + self.outcome.cells_done} of {len(plan_.cells)} cells) and "
                     f"{ARENA_RECEIPT}")

    def done(self) -> str:
        return f"{len(self.done_before) + self.outcome.cells_done} of {len(self.plan.cells)} cells"


class LlamaBenchy:
    tokenizer = True

    def plan(self, args: argparse.Namespace) -> Plan:
        return plan(args)

    def run(self, plan_: Plan, args: argparse.Namespace, target: Target, head_tokenizer: Path | None) -> Measured:
        started = datetime.datetime.now(datetime.timezone.utc)
        quiet = bool(args.json)

        def say(text: str) -> None:
            if not quiet:
                err_console.print(escape(text), highlight=False)
        todo: list[Cell] = list(plan_.cells)
        done_before: list[dict[str, Any]] = []
        if plan_.out is not None:
            done_before, todo = arena.resume(plan_.out, todo)
            if done_before:
                say(f"resuming in {plan_.out}: {len(done_before)} of {len(plan_.cells)} cells are measured already")
        measured = Measured(plan_, target, started, done_before, say)

        def done(cell: Cell, entries: list[BenchmarkRun]) -> None:
            p = measured.plan
            if p.out is not None and p.profile is not None:
                arena.save_cell(p.out, cell, formats.document(measured.header(), entries))
                arena.write(p.out, p.profile, measured.target, p.opts, measured.started, p.cells, bool(done_before))
        with ending(measured):  # a SparkclusterError: 2 for a grid that cannot fit the context
            model, measured.context = asyncio.run(served_model(target.base_url, target.model or None, args.timeout,
                                                               target.api_key))
            measured.target = target = dataclasses.replace(target, model=model)
            fitted = fit_grid(plan_.cells, measured.context, plan_.pp_given,
                              plan_.profile.name if plan_.profile else None)
            if fitted.note:  # only --pp's default changes, never a profile's grid (whose cells resume by name)
                say(fitted.note)
                measured.plan = plan_ = dataclasses.replace(plan_, cells=fitted.cells)
                todo = list(fitted.cells)
            measured.corpus = corpus = corpus_for(args, model, target.config.get("hf_model"), head_tokenizer)
            say(f"bench --method llama-benchy: {target.base_url}, model {model}, tokenizer {corpus.tokenizer.name}, "
                f"{len(todo)} cell(s)")
            client = Client(target.base_url, model, args.timeout, target.api_key)
            if todo:
                asyncio.run(session_run(client, corpus, plan_.opts, todo, measured.outcome, say, done,
                                        session_warmup=not args.no_warmup, skipped=len(done_before),
                                        warm_first_cell_only=plan_.profile is not None, context=measured.context,
                                        engine_metrics=target.engine_metrics))
        plan_ = measured.plan
        measured.receipt = benchy_receipt(
            measured.target, {**dataclasses.asdict(plan_.opts), "cells": [c.label for c in plan_.cells]},
            measured.corpus, measured.outcome.metrics_before, measured.outcome.metrics_after)
        return measured


def add_flags(p: argparse.ArgumentParser) -> tuple[argparse.Action, argparse.Action, list[argparse.Action]]:
    """--method, --profile, and llama-benchy's own flags (the closed loop would ignore them): their declarations
    are where their defaults live (flagset.py reads them there)."""
    g = p.add_argument_group("--method llama-benchy and --profile (llama-benchy 0.4.0's flags)")
    method = g.add_argument(
        "--method", choices=("sustained", "llama-benchy"), default="sustained",
        help="sustained: our closed loop of completions (default); llama-benchy: its bursts of chat requests, its "
             "arithmetic and formats (what the Spark Arena and the recipes publish)")
    own = [
        g.add_argument("--pp", nargs="+", metavar="N",
                       help="prompt tokens per request (default 2048, halved until the grid fits the served context)"),
        g.add_argument("--tg", nargs="+", metavar="N", help="tokens to generate per request (default 32)"),
        g.add_argument("--depth", nargs="+", metavar="N", help="context tokens before the prompt (default 0)"),
        g.add_argument("--latency-mode", choices=("api", "generation", "none"), default="api",
                       help="how the round trip subtracted from TTFR is measured (default api: GET /models)"),
        g.add_argument("--enable-prefix-caching", action="store_true",
                       help="with depth > 0: load the context first (ctx_pp/ctx_tg), then measure on the cached "
                            "prefix"),
        g.add_argument("--no-cache", action="store_true", help="a unique suffix and cache_prompt=false per request"),
        g.add_argument("--skip-coherence", action="store_true",
                       help="do not ask the model the capital of France first"),
        g.add_argument("--no-warmup", action="store_true", help="no warm-up run per cell (nor at session start)"),
        g.add_argument("--no-adapt-prompt", action="store_true",
                       help="do not subtract the chat template's tokens (learnt at warm-up) from pp/depth"),
        g.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json or a snapshot directory (default: the "
                                                           "model's in the HF cache; else words, calibrated)"),
        g.add_argument("--corpus", metavar="FILE", help="text to cut prompts from (default: llama-benchy's book)"),
        g.add_argument("--book-url", help=f"the book to download when --corpus is not given (default {BOOK_URL})"),
    ]
    profile = g.add_argument("--profile", metavar="NAME|FILE",
                             help="run a benchmark profile: arena-v2 (the Spark Arena v2 grid) or a profile YAML")
    own.append(g.add_argument("--out", metavar="DIR", help="with --profile: where the Arena's files and each cell go "
                                                           "(a re-run resumes, measuring only the missing cells)"))
    return method, profile, own
