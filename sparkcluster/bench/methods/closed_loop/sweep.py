"""The method, in order: find the model; learn the prompt length from the server's usage (short probes); warm up
(the first requests pay JIT and graph capture, as the published recipes say); then at each concurrency C,
`--runs` runs of C x `--requests-per-stream` requests with C kept in flight, /metrics sampled beside them.
Rows are appended to the caller's list as they complete, so a failure or Ctrl-C still leaves what was measured."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import aiohttp

from ...context import TOKENS_PER_WORD_AT_MOST, Sizes, fit
from ...endpoint import FIX, BenchFailed, requests_failed, resolve_model, session
from ...metrics import Sampler, ServerSide, summarize
from ...receipt_metrics import Snapshot, around, engines_of
from ...receipts import endpoint_version
from ...timeline import RequestTimeline
from . import prompts
from .arithmetic import Row, combine, summarize_run
from .schedule import Endpoint, run_concurrency, stream_completion


@dataclass(frozen=True)
class SweepOptions:
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prompt_tokens: int = 512
    output_tokens: int = 128
    runs: int = 3
    warmup: int = 1
    requests_per_stream: int = 4
    prefix_cache: bool = False
    timeout_s: float = 600.0
    prompt_given: bool = True  # False: prompt_tokens is the default, which the sweep fits to the served context
    output_given: bool = True


@dataclass(frozen=True)
class Level:
    row: Row
    server: ServerSide | None


@dataclass
class Prepared:
    """What the sweep learnt before measuring; recorded in the output's config."""

    model: str = ""
    server_version: str | None = None
    prompt_words: int = 0
    prompt_tokens: int = 0  # what the calibrated prompt measured, by the server's count
    usage: bool = True  # False when the server sent no usage (token counts are then chunk counts)
    max_model_len: int | None = None  # the served context, as /v1/models lists it
    options: SweepOptions | None = None  # what was measured: the options, their default sizes fitted to the context
    # /metrics just before the first measured request and after the last: the receipt's deltas (warm-up excluded)
    metrics_before: Snapshot | None = None
    metrics_after: Snapshot | None = None


@dataclass(frozen=True)
class Note:
    """Progress: what the sweep is doing before it measures (calibrating, warming up)."""

    text: str


@dataclass(frozen=True)
class LevelStarted:
    concurrency: int
    requests: int  # over every run of this level


@dataclass(frozen=True)
class RequestDone:
    concurrency: int


BenchEvent = Note | LevelStarted | RequestDone
Emit = Callable[[BenchEvent], None]


def ignore(event: BenchEvent) -> None:
    """The emit of a run whose output is one JSON document at the end."""


def fitted(opts: SweepOptions, context: int | None, emit: Emit) -> SweepOptions:
    """The options with their default sizes fitted to the served context (said when changed); DoesNotFit names the
    numbers when the sizes given cannot fit."""
    sizes = fit(Sizes(opts.prompt_tokens, opts.output_tokens, opts.prompt_given, opts.output_given), context)
    if (sizes.prompt_tokens, sizes.output_tokens) == (opts.prompt_tokens, opts.output_tokens):
        return opts
    emit(Note(f"the served context is {context} tokens (max_model_len): prompt {sizes.prompt_tokens} and output "
              f"{sizes.output_tokens} tokens, the defaults {opts.prompt_tokens} and {opts.output_tokens} halved to "
              "fit; --prompt-tokens and --output-tokens set them"))
    return replace(opts, prompt_tokens=sizes.prompt_tokens, output_tokens=sizes.output_tokens)


REFUSED_FIX = ("the server refused the request as sent, for the reason it gives: a prompt and output within its "
               "context (--prompt-tokens, --output-tokens) and a served --model; its log tells more "
               "(`sparkcluster logs`)")


def fix_for(result: RequestTimeline) -> str:
    """A request the server refused (HTTP 4xx) is not a server that is down: its own message says why."""
    return REFUSED_FIX if 400 <= result.status < 500 and result.status != 401 else FIX


def _failed(result: RequestTimeline, what: str) -> BenchFailed:
    return BenchFailed(f"{what} failed: {result.error}", fix_for(result))


async def calibrate(client: aiohttp.ClientSession, endpoint: Endpoint, target: int,
                    context: int | None = None) -> tuple[int, int]:
    """(words, tokens): the word count whose prompt the server counts as `target` tokens (or the closest seen). In a
    known `context` the first probe is short enough to fit even at several tokens a word (the simulator's tiny
    model counts 2.3), and the next ones follow the ratio it measured."""
    samples: list[tuple[int, int]] = []
    words = target if context is None else min(target, max(1, context // TOKENS_PER_WORD_AT_MOST))
    for _ in range(prompts.MAX_PROBES):
        result = await stream_completion(client, endpoint, prompts.prompt(words, prompts.SHARED_SEED), 1)
        if not result.ok:
            raise _failed(result, "the first request")
        if not result.usage:
            return words, 0  # no usage: the words stand for tokens, and the config says so
        samples.append((words, result.prompt_tokens))
        if prompts.close_enough(target, result.prompt_tokens):
            break
        words = prompts.next_guess(target, samples)
    return min(samples, key=lambda s: abs(s[1] - target))


async def sweep(base_url: str, model: str | None, opts: SweepOptions, levels: list[Level],
                prepared: Prepared, emit: Emit = ignore, api_key: str | None = None,
                engine_metrics: Sequence[str] = ()) -> None:
    """`engine_metrics`: each engine's own /metrics where the endpoint is a router in front of several (the
    receipt's deltas sum them); none: the endpoint's own."""
    async with session(max(opts.concurrency), opts.timeout_s, api_key) as client:
        prepared.model, prepared.max_model_len = await resolve_model(client, base_url, model)
        opts = prepared.options = fitted(opts, prepared.max_model_len, emit)
        # receipts.py's reader, the one bench has; called in the loop (nothing else is in flight yet, and it is
        # bounded to 5 s): a worker thread for it cost the timing test 5% of its generation tok/s on 2 cores
        prepared.server_version = endpoint_version(base_url, api_key)
        endpoint = Endpoint(base_url, prepared.model)
        emit(Note(f"calibrating a {opts.prompt_tokens}-token prompt from the server's usage ..."))
        prepared.prompt_words, prepared.prompt_tokens = await calibrate(client, endpoint, opts.prompt_tokens,
                                                                        prepared.max_model_len)
        prepared.usage = prepared.prompt_tokens > 0
        for i in range(opts.warmup):
            emit(Note(f"warm-up request {i + 1}/{opts.warmup} ..."))
            result = await stream_completion(client, endpoint, prompts.prompt(prepared.prompt_words, -1 - i),
                                             opts.output_tokens)
            if not result.ok:
                raise _failed(result, "the warm-up request")
        sampler = Sampler(client, engines_of(base_url, engine_metrics))
        await around(client, base_url, engine_metrics, prepared,
                     lambda: _levels(client, endpoint, opts, levels, prepared, sampler, emit))


async def _levels(client: aiohttp.ClientSession, endpoint: Endpoint, opts: SweepOptions, levels: list[Level],
                  prepared: Prepared, sampler: Sampler, emit: Emit) -> None:
    nonce = random.SystemRandom().getrandbits(48)  # a second bench must not hit the first one's cache
    for concurrency in opts.concurrency:
        count = concurrency * opts.requests_per_stream
        emit(LevelStarted(concurrency, count * opts.runs))
        rows: list[Row] = []
        windows = []
        for run in range(opts.runs):
            texts = [prompts.prompt(prepared.prompt_words, prompts.SHARED_SEED if opts.prefix_cache
                                    else hash((nonce, concurrency, run, i))) for i in range(count)]
            await sampler.start()
            # Called only while this level runs, so the loop's current concurrency is the one meant.
            timeline = await run_concurrency(client, endpoint, texts, concurrency, opts.output_tokens,
                                             lambda request: emit(RequestDone(concurrency)))
            windows.append(await sampler.stop())
            rows.append(summarize_run(timeline))
            prepared.usage = prepared.usage and all(r.usage for r in timeline.requests if r.ok)
            first_failed = next((r for r in timeline.requests if not r.ok), None)
            if first_failed:
                levels.append(Level(combine(rows), summarize(windows)))
                raise requests_failed(f"at concurrency {concurrency}, run {run + 1}", rows[-1].errors,
                                      rows[-1].requests, first_failed.error, fix_for(first_failed))
        levels.append(Level(combine(rows), summarize(windows)))
