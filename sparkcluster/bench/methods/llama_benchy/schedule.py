"""llama-benchy 0.4.0's session, cell by cell: once per session a warm-up (which also learns the chat template's
overhead, so prompts are cut to land on pp and depth at the server), the coherence question and the latency
probe; then per cell (depth, pp, tg, concurrency) a warm-up run unless --no-warmup and --runs runs, each a burst
of C requests at once. With prefix caching and depth > 0 a run first loads the context (system = context,
user = ".") and then sends the same context with the prompt: two entries, `ctx_*` and `pp/tg @ dD`.

Cells are yielded one at a time, so a caller keeps every finished cell when a later one fails or is
interrupted, and a profile can run its cells in its own order and skip the ones already measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from ....engine.errors import SparkclusterError
from ...client import pool
from ...context import TOKENS_PER_WORD_AT_MOST
from ...sse import BadResponse
from .arithmetic import BenchmarkRun, summarize
from .chat import (
    CONTEXT_LOAD_USER_MESSAGE,
    WARMUP_TEXT,
    Client,
    RequestResult,
    coherence,
    latency,
    probe_prompt,
)
from .corpus import Corpus, WordTokenizer

CALIBRATION_TOKENS = 1000  # corpus words sent once to learn the server's tokens per word (fallback only)


def calibration_words(context: int | None) -> int:
    """The calibration sample's words: fewer in a known served context, so that it fits even at several tokens a
    word (the closed loop's first probe follows the same rule)."""
    return CALIBRATION_TOKENS if context is None else min(CALIBRATION_TOKENS, max(1, context // TOKENS_PER_WORD_AT_MOST))


@dataclass(frozen=True)
class Cell:
    depth: int
    pp: int
    tg: int
    concurrency: int

    @property
    def label(self) -> str:
        return f"d={self.depth} pp={self.pp} tg={self.tg} c={self.concurrency}"


@dataclass(frozen=True)
class BenchyOptions:
    runs: int = 3
    latency_mode: str = "api"  # api | generation | none
    prefix_caching: bool = False
    no_cache: bool = False
    warmup: bool = True  # a warm-up run per cell (--no-warmup: none)
    coherence: bool = True  # --skip-coherence: False
    adapt_prompt: bool = True


@dataclass(frozen=True)
class Session:
    """What the session start learnt: the latency and the prompt adaptation, and the coherence answer."""
    latency_s: float
    delta_user: int
    delta_context: int
    answer: str


class Incoherent(SparkclusterError):
    """The model did not answer the coherence question with Paris: its numbers would mean nothing."""


Progress = Callable[[str], None]  # one line per step of a cell ("run 2/3 (inference, 5 requests)")


def cells(depths: Sequence[int], pps: Sequence[int], tgs: Sequence[int], concurrencies: Sequence[int]) -> list[Cell]:
    """llama-benchy's order: depth, then pp, then tg, then concurrency."""
    return [Cell(d, p, t, c) for d in depths for p in pps for t in tgs for c in concurrencies]


def http_session(max_concurrency: int) -> aiohttp.ClientSession:
    """One pool for the session, as llama-benchy keeps one (limit C + 5, keep-alive); the per-request deadline
    is the client's own."""
    return pool(max_concurrency, spare=5, keepalive_s=600, timeout=aiohttp.ClientTimeout(total=None, connect=30))


async def start(client: Client, session: aiohttp.ClientSession, corpus: Corpus, opts: BenchyOptions,
                session_warmup: bool, context: int | None = None) -> Session:
    """Warm-up (always when prompts are adapted, as llama-benchy does), coherence question, latency. `context`: the
    served context, which the word fallback's calibration sample must fit."""
    delta_user = delta_context = 0
    try:
        if session_warmup or opts.adapt_prompt:
            delta_user, delta_context = await _warmup(client, session, corpus, context)
        answer = ""
        if opts.coherence:
            passed, answer = await coherence(client, session)
            if not passed:
                raise Incoherent(f"the model failed the coherence question (the capital of France): it answered "
                                 f"{answer!r}", "the served model is broken or is not the one you meant; check "
                                 "its chat template and weights (or --skip-coherence to measure it anyway)")
    except (BadResponse, TimeoutError, aiohttp.ClientError) as e:
        detail = f"took longer than --timeout {client.timeout:g} s" if isinstance(e, TimeoutError) else str(e)
        raise SparkclusterError(f"the warm-up at {client.base_url} failed: {detail}",
                                "check that the server answers chat completions for this model") from None
    return Session(await latency(client, session, opts.latency_mode), delta_user, delta_context, answer)


async def _warmup(client: Client, session: aiohttp.ClientSession, corpus: Corpus,
                  context: int | None) -> tuple[int, int]:
    """The chat template's overhead in tokens, for a user turn and for a system turn plus the "." probe."""
    tokenizer = corpus.tokenizer
    server_user = await probe_prompt(client, session, None, WARMUP_TEXT)
    if isinstance(tokenizer, WordTokenizer) and server_user is not None:
        sample = corpus.sample(calibration_words(context))
        server_sample = await probe_prompt(client, session, None, sample)
        words = len(sample.split()) - len(WARMUP_TEXT.split())
        if server_sample is not None and server_sample > server_user and words > 0:
            tokenizer.tokens_per_word = (server_sample - server_user) / words
    per_token = tokenizer.tokens_per_word if isinstance(tokenizer, WordTokenizer) else 1.0
    local_warmup = round(len(tokenizer.encode(WARMUP_TEXT)) * per_token)
    local_probe = round(len(tokenizer.encode(CONTEXT_LOAD_USER_MESSAGE)) * per_token)
    delta_user = server_user - local_warmup if server_user is not None else 0
    server_context = await probe_prompt(client, session, WARMUP_TEXT, CONTEXT_LOAD_USER_MESSAGE)
    delta_context = server_context - local_warmup - local_probe if server_context is not None else delta_user
    return delta_user, delta_context


async def _burst(client: Client, session: aiohttp.ClientSession, prompts: Sequence[tuple[str, str]], tg: int,
                 no_cache: bool) -> list[RequestResult]:
    return list(await asyncio.gather(*(client.generate(session, context, prompt, tg, no_cache)
                                       for context, prompt in prompts)))


async def run_cell(client: Client, session: aiohttp.ClientSession, corpus: Corpus, opts: BenchyOptions,
                   started: Session, cell: Cell, progress: Progress) -> tuple[list[BenchmarkRun], list[str]]:
    """One cell's entries (the context load's first when there is one) and the errors its requests met."""
    context_runs: list[list[RequestResult]] = []
    runs: list[list[RequestResult]] = []
    errors: list[str] = []
    pp, depth = cell.pp, cell.depth
    if opts.adapt_prompt:
        if cell.depth == 0:
            pp = max(1, cell.pp - started.delta_user)
        else:
            depth = max(1, cell.depth - started.delta_context)
    split = opts.prefix_caching and cell.depth > 0
    total = opts.runs + (1 if opts.warmup else 0)
    for index in range(total):
        warmup = opts.warmup and index == 0
        label = "warm-up" if warmup else f"run {index if opts.warmup else index + 1}/{opts.runs}"
        prompts = corpus.batch(cell.concurrency, pp, depth, opts.no_cache)
        if split:
            progress(f"{label} (context load, {cell.concurrency} at once)")
            loads = await _burst(client, session, [(c, CONTEXT_LOAD_USER_MESSAGE) for c, _ in prompts],
                                 cell.tg, opts.no_cache)
            if not warmup:
                context_runs.append(loads)
                errors += [r.error for r in loads if r.error]
        progress(f"{label} ({'inference, ' if split else ''}{cell.concurrency} at once)")
        results = await _burst(client, session, prompts, cell.tg, opts.no_cache)
        if not warmup:
            runs.append(results)
            errors += [r.error for r in results if r.error]
    def entry(results: list[list[RequestResult]], expected: int, context_phase: bool) -> BenchmarkRun:
        return summarize(results, pp=cell.pp, tg=cell.tg, depth=cell.depth, concurrency=cell.concurrency,
                         latency=started.latency_s, expected_prompt=expected, context_phase=context_phase)
    if split:
        return [entry(context_runs, depth, True), entry(runs, pp, False)], errors
    return [entry(runs, pp + (depth if cell.depth > 0 else 0), False)], errors
