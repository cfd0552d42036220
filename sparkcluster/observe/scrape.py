"""What vLLM's /metrics says about the endpoint, as the figures owners watch: requests running and waiting,
KV-cache use, the prefix-cache hit rate, prompt and generation tokens per second over the last interval, TTFT
and inter-token latency p50/p90 from the histograms, preemptions. Read-only: one GET of /metrics per sample.

Rates and quantiles come from the difference of two scrapes, so they describe the last interval, not the
server's lifetime; with one scrape only (or nothing new in the interval) they fall back to what the scrape holds
since the server started, and say so (`since_start`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .bounded import request
from .prometheus import MAX_TEXT_CHARS, Histogram, Scrape, parse, rate

SCRAPE_TIMEOUT_S = 5.0  # the whole GET's, body included (observe/bounded.py)
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the older name before vLLM V1
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
PREEMPTIONS = ("vllm:num_preemptions_total",)
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")  # newer name first


@dataclass(frozen=True)
class Reading:
    """One GET of /metrics: the scrape, when it was taken, or why there is none."""

    at: float  # time.monotonic()
    scrape: Scrape | None
    error: str | None = None


@dataclass(frozen=True)
class EndpointFigures:
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # fraction, 0..1
    prefix_cache_hit_rate: float | None = None  # fraction of queried prompt tokens found in the cache
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    preemptions: float | None = None  # since the server started
    interval_s: float | None = None  # the window the rates and quantiles cover; None: since the server started
    since_start: bool = False  # quantiles or hit rate are the server's lifetime figures (nothing newer)
    skipped_lines: int = 0  # lines of the scrape that were not Prometheus text

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line, as `status` prints it."""
        def num(v: float | None, fmt: str = "{:g}") -> str:
            return "-" if v is None else fmt.format(v)

        def ms(p50: float | None, p90: float | None) -> str:
            return "-" if p50 is None else f"{p50 * 1000:.0f}/{num(p90 and p90 * 1000, '{:.0f}')} ms"
        return (f"running {num(self.running)}, waiting {num(self.waiting)}, "
                f"KV cache {num(self.kv_cache_usage, '{:.1%}')}, prefix hits {num(self.prefix_cache_hit_rate, '{:.0%}')}, "
                f"prompt {num(self.prompt_tokens_per_s, '{:.1f}')} tok/s, "
                f"generation {num(self.generation_tokens_per_s, '{:.1f}')} tok/s, "
                f"TTFT p50/p90 {ms(self.ttft_p50_s, self.ttft_p90_s)}, ITL p50/p90 {ms(self.itl_p50_s, self.itl_p90_s)}, "
                f"preemptions {num(self.preemptions)}")


def fetch(metrics_url: str, timeout: float = SCRAPE_TIMEOUT_S) -> Reading:
    """GET /metrics, whole within `timeout` and MAX_TEXT_CHARS bytes (a vLLM scrape is 10-60 KB); any failure is the
    reading's error, never an exception."""
    at = time.monotonic()
    answer = request(metrics_url, timeout_s=timeout, limit_bytes=MAX_TEXT_CHARS)
    if answer.error is not None:
        return Reading(at, None, f"/metrics {answer.error}")
    if answer.status != 200:
        return Reading(at, None, f"/metrics answered HTTP {answer.status}")
    return Reading(at, parse(answer.text))


def figures(now: Scrape, before: Reading | None = None, now_at: float | None = None) -> EndpointFigures:
    """The figures from `now`, with rates and quantiles over the interval since `before` where there is one."""
    earlier = before.scrape if before is not None else None
    seconds = (now_at - before.at) if before is not None and now_at is not None else 0.0
    since_start = False

    def hist(names: tuple[str, ...]) -> Histogram | None:
        nonlocal since_start
        for name in names:
            h = now.histogram(name)
            if h is None:
                continue
            window = h.minus(earlier.histogram(name) if earlier else None)
            if earlier is not None and window.count <= 0:
                since_start = True  # nothing new in the interval: the lifetime figures
                return h
            if earlier is None:
                since_start = True
            return window
        return None

    ttft, itl = hist(TTFT), hist(ITL)
    hit_rate = _hit_rate(now, earlier)
    if hit_rate is None and earlier is not None:
        hit_rate = _hit_rate(now, None)
        since_start = since_start or hit_rate is not None
    return EndpointFigures(
        running=now.first(*RUNNING), waiting=now.first(*WAITING), kv_cache_usage=now.first(*KV_USAGE),
        prefix_cache_hit_rate=hit_rate,
        prompt_tokens_per_s=rate(now, earlier, PROMPT_TOKENS, seconds),
        generation_tokens_per_s=rate(now, earlier, GENERATION_TOKENS, seconds),
        ttft_p50_s=ttft.quantile(0.5) if ttft else None, ttft_p90_s=ttft.quantile(0.9) if ttft else None,
        itl_p50_s=itl.quantile(0.5) if itl else None, itl_p90_s=itl.quantile(0.9) if itl else None,
        preemptions=now.first(*PREEMPTIONS), interval_s=round(seconds, 3) if seconds > 0 else None,
        since_start=since_start, skipped_lines=now.skipped)


def summed(engines: Sequence[EndpointFigures]) -> EndpointFigures:
    """Several engines' figures as the one endpoint they answer behind a router: requests running and waiting, token
    rates and preemptions add up. KV-cache use, the prefix-cache hit rate and latency quantiles stay each engine's
    own (a mean of quantiles is no quantile of the whole), so the sum leaves them out. A figure one engine lacks
    (its first reading since it came back, a counter reset) leaves the sum unknown: a part is not the whole."""
    def add(values: Iterable[float | None]) -> float | None:
        known = list(values)
        return None if not known or any(v is None for v in known) else sum(v for v in known if v is not None)

    intervals = [e.interval_s for e in engines if e.interval_s is not None]
    return EndpointFigures(
        running=add(e.running for e in engines), waiting=add(e.waiting for e in engines),
        prompt_tokens_per_s=add(e.prompt_tokens_per_s for e in engines),
        generation_tokens_per_s=add(e.generation_tokens_per_s for e in engines),
        preemptions=add(e.preemptions for e in engines), interval_s=max(intervals, default=None),
        skipped_lines=sum(e.skipped_lines for e in engines))


def _hit_rate(now: Scrape, earlier: Scrape | None) -> float | None:
    for hits_name, queries_name in zip(PREFIX_HITS, PREFIX_QUERIES):
        hits, queries = now.total(hits_name), now.total(queries_name)
        if hits is None or queries is None:
            continue
        if earlier is not None:
            h0, q0 = earlier.total(hits_name), earlier.total(queries_name)
            if h0 is None or q0 is None:
                return None
            hits, queries = hits - h0, queries - q0
        return hits / queries if queries > 0 and 0 <= hits <= queries else None
    return None


def metrics_url(base: str) -> str:
    """`http://host:8000/v1` (or without /v1) -> `http://host:8000/metrics`."""
    return base.rstrip("/").removesuffix("/v1") + "/metrics"
