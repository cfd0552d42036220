"""A llama-benchy session from start to the last cell, cell by cell: what `bench --method llama-benchy` and
`bench --profile` share. Finished cells are handed to `done` as they finish, so a failure or Ctrl-C later
loses none of them; a progress line per step says which cell, which run and the time left (estimated from
the cells so far, weighted by the tokens each cell moves)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import aiohttp

from ...endpoint import requests_failed, resolve_model
from ...endpoint import session as request_pool
from ...receipt_metrics import Snapshot, around
from .arithmetic import BenchmarkRun
from .chat import Client, Tally
from .corpus import Corpus
from .schedule import BenchyOptions, Cell, Session, http_session, run_cell, start


@dataclass
class Outcome:
    """What the session produced so far: every finished cell's entries, in the order they ran."""
    session: Session | None = None
    runs: list[BenchmarkRun] = field(default_factory=list)
    cells_done: int = 0
    tally: Tally | None = None  # the client's token tally, once a session started
    # /metrics after the session's warm-up and after the last cell: the receipt's deltas
    metrics_before: Snapshot | None = None
    metrics_after: Snapshot | None = None


Say = Callable[[str], None]
Done = Callable[[Cell, list[BenchmarkRun]], None]


def _weight(cell: Cell) -> float:
    """How long a cell takes, relatively: its prompt tokens plus its output tokens (a decoded token costs
    about as much as a few dozen prefilled ones), times the requests."""
    return cell.concurrency * (cell.depth + cell.pp + 30 * cell.tg)


def _eta(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


async def served_model(base_url: str, wanted: str | None, timeout: float,
                       api_key: str | None = None) -> tuple[str, int | None]:
    """The model to measure (the server's first, as llama-benchy picks one when none is `wanted`) and its served
    context (None where not listed), read as every method reads /v1/models (endpoint.resolve_model: the same bounds,
    refusals and words)."""
    async with request_pool(1, timeout, api_key) as client:
        return await resolve_model(client, base_url, wanted)


async def session_run(client: Client, corpus: Corpus, opts: BenchyOptions, plan: Sequence[Cell], outcome: Outcome,
                      say: Say, done: Done, *, session_warmup: bool = True, skipped: int = 0,
                      warm_first_cell_only: bool = False, context: int | None = None,
                      engine_metrics: Sequence[str] = ()) -> None:
    """The session start, then each cell of `plan` in order. `skipped` cells were measured before (a resumed
    profile) and count in the progress numbering only. `warm_first_cell_only`: as sparkrun runs a profile
    (llama-benchy once per cell, the later ones with --no-warmup), only the first cell gets a warm-up run.
    `context`: the served context (max_model_len), which the session start's probes fit. `engine_metrics`: each
    replica's own /metrics behind a router (the receipt's deltas sum them); none: the endpoint's own."""
    outcome.tally = client.tally
    async with http_session(max((c.concurrency for c in plan), default=1)) as http:
        say("warm-up, coherence question and latency probe")
        outcome.session = session = await start(client, http, corpus, opts, session_warmup, context)
        say(f"latency {session.latency_s * 1000:.2f} ms ({opts.latency_mode})"
            + (f"; the model answered {session.answer!r}" if opts.coherence else ""))
        await around(http, client.base_url, engine_metrics, outcome, lambda: _cells(
            client, http, corpus, opts, session, plan, outcome, say, done, skipped, warm_first_cell_only))


async def _cells(client: Client, http: aiohttp.ClientSession, corpus: Corpus, opts: BenchyOptions, session: Session,
                 plan: Sequence[Cell], outcome: Outcome, say: Say, done: Done, skipped: int,
                 warm_first_cell_only: bool) -> None:
    total = len(plan) + skipped
    began, weight_done = time.monotonic(), 0.0
    weight_all = sum(_weight(c) for c in plan)
    for index, cell in enumerate(plan):
        left = ""
        if weight_done:
            rate = (time.monotonic() - began) / weight_done
            left = f", about {_eta(rate * (weight_all - weight_done))} left"
        number = f"[{skipped + index + 1}/{total}] {cell.label}"

        def step(text: str, number: str = number, left: str = left) -> None:
            say(f"{number}: {text}{left}")
        cell_opts = replace(opts, warmup=False) if warm_first_cell_only and index > 0 else opts
        entries, errors = await run_cell(client, http, corpus, cell_opts, session, cell, step)
        outcome.runs += entries
        weight_done += _weight(cell)
        if errors:  # a cell's requests: each measured run's burst, and its context load's where split
            sent = cell_opts.runs * cell.concurrency * (2 if cell_opts.prefix_caching and cell.depth > 0 else 1)
            raise requests_failed(f"cell {cell.label}", len(errors), sent, errors[0],
                                  "the cells before it are kept; check the server's log, or raise --timeout")
        outcome.cells_done += 1
        done(cell, entries)  # only a cell whose every request succeeded counts as measured
