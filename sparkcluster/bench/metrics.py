"""vLLM's own view while the load runs: /metrics (Prometheus text) sampled once a second, and read exactly at the
start and end of every run so counter deltas belong to that run. Reported beside each row: the peak KV-cache
usage, the prefix-cache hit rate, preemptions, and the server's own token counters (a cross-check of usage).
A server without /metrics (not vLLM) simply gives no such figures."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from ..observe import prometheus

SAMPLE_EVERY_S = 1.0
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the older name before vLLM V1
COUNTERS = {
    "prefix_hits": "vllm:prefix_cache_hits_total", "prefix_queries": "vllm:prefix_cache_queries_total",
    "preemptions": "vllm:num_preemptions_total", "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
}


MAX_SCRAPE_BYTES = prometheus.MAX_TEXT_CHARS  # a server that sends more is cut off, not held in memory


def parse(text: str) -> dict[str, float]:
    """Each metric's finite value summed over its label sets (one per engine or model): NaN, ±Inf and lines
    that are not Prometheus text are left out (the shared reader never raises)."""
    return prometheus.parse(text).totals()


def _count(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else round(value)


@dataclass(frozen=True)
class ServerSide:
    """What the server reports for a concurrency (all its runs)."""

    kv_cache_peak: float | None  # fraction, 0..1
    prefix_cache_hit_rate: float | None  # fraction of queried prompt tokens found in the cache
    preemptions: int | None
    generation_tokens: int | None
    prompt_tokens: int | None


def summarize(windows: Sequence[tuple[Mapping[str, float], Mapping[str, float], Sequence[Mapping[str, float]]]]
              ) -> ServerSide | None:
    """From (first sample, last sample, every sample) per run."""
    if not windows or not any(first for first, _, _ in windows):
        return None

    def delta(key: str) -> float | None:
        name = COUNTERS[key]
        if not all(name in first and name in last for first, last, _ in windows):
            return None
        return sum(last[name] - first[name] for first, last, _ in windows)

    kv = [s[name] for _, _, samples in windows for s in samples for name in KV_USAGE
          if name in s and math.isfinite(s[name])]
    hits, queries, preempted = delta("prefix_hits"), delta("prefix_queries"), delta("preemptions")
    generated, prompted = delta("generation_tokens"), delta("prompt_tokens")
    hit_rate = hits / queries if hits is not None and queries else None
    return ServerSide(max(kv) if kv else None, hit_rate if hit_rate is None or math.isfinite(hit_rate) else None,
                      _count(preempted), _count(generated), _count(prompted))


def merged(engines: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Several engines' samples taken at once as the one endpoint they answer behind a router: counters add up, the
    KV-cache usage is the fullest engine's (each has its own cache). Empty when any engine gave nothing, so a
    counter's delta never spans a different set of engines."""
    if not engines or not all(engines):
        return {}
    total: dict[str, float] = {}
    for sample in engines:
        for name, value in sample.items():
            total[name] = max(total[name], value) if name in KV_USAGE and name in total else total.get(name, 0) + value
    return total


class Sampler:
    """Polls /metrics in the background of one run; `stop()` returns (first, last, all samples). Behind a router,
    each replica's own /metrics at once (`metrics_urls`), merged: the router hands its own to one replica in turn."""

    def __init__(self, client: aiohttp.ClientSession, metrics_urls: Sequence[str]) -> None:
        self.client, self.urls = client, tuple(metrics_urls)
        self.samples: list[dict[str, float]] = []
        self.available = True
        self._task: asyncio.Task[None] | None = None

    async def read(self) -> dict[str, float]:
        if not self.available:
            return {}
        return merged(await asyncio.gather(*(self._read(url) for url in self.urls)))

    async def _read(self, url: str) -> dict[str, float]:
        try:
            async with self.client.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status != 200:
                    self.available = False  # not vLLM, or metrics turned off: stop asking
                    return {}
                body = await response.content.read(MAX_SCRAPE_BYTES)
                return parse(body.decode("utf-8", errors="replace"))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return {}

    async def start(self) -> None:
        self.samples = [await self.read()]
        self._task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while self.available:
            await asyncio.sleep(SAMPLE_EVERY_S)
            self.samples.append(await self.read())

    async def stop(self) -> tuple[dict[str, float], dict[str, float], list[dict[str, float]]]:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.samples.append(await self.read())
        return self.samples[0], self.samples[-1], [s for s in self.samples if s]
