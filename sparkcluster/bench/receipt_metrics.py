"""What the engine's own /metrics says happened during the measurement, and only then: vLLM's counters read once
before the first measured request and once after the last, as deltas. Speculative decoding's acceptance (the one
number that explains most of the gap between two published decode figures), the prefix cache's hit rate and the
preemptions.

vLLM 0.32 (vllm/v1/spec_decode/metrics.py) exports the counters `vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens` (a `_total` suffix in the text, one series per engine) and `..._num_accepted_tokens_per_pos`
with a `position` label (0 .. num_speculative_tokens - 1); its own Grafana board derives the same figures as below:
acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts (the bonus token each
verification step yields), acceptance at position i = accepted at i / drafts.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import aiohttp

from ..observe.prometheus import MAX_TEXT_CHARS, Scrape, parse
from ..observe.scrape import SCRAPE_TIMEOUT_S, metrics_url
from .endpoint import BenchFailed

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
POSITION_LABEL = "position"
REPLICA_LABEL = "sparkcluster_replica"  # which replica behind the router a sample came from
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")  # the older name before V1
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREEMPTIONS = "vllm:num_preemptions_total"


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding over the measurement: counts, and the figures vLLM derives from them."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...] = ()  # accepted tokens at draft position 0, 1, ...

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts > 0 else None

    @property
    def per_position_acceptance(self) -> tuple[float, ...] | None:
        if self.drafts <= 0 or not self.accepted_per_position:
            return None
        return tuple(a / self.drafts for a in self.accepted_per_position)

    def to_json(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "accepted_per_position": list(self.accepted_per_position),
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": (None if self.per_position_acceptance is None
                                            else list(self.per_position_acceptance))}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SpecDecode:
        return cls(float(doc["drafts"]), float(doc["draft_tokens"]), float(doc["accepted_tokens"]),
                   tuple(float(a) for a in doc.get("accepted_per_position") or ()))


@dataclass(frozen=True)
class EngineDeltas:
    """The engine's counters over the measurement. `speculative` False: the engine exports no speculative
    decoding counters (it does not speculate); None: it cannot be told (a counter reset, or no such figure)."""

    speculative: bool | None
    spec_decode: SpecDecode | None
    prefix_cache_hit_rate: float | None  # fraction of the prompt tokens queried that the cache held
    preemptions: float | None
    interval_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"speculative": self.speculative,
                "spec_decode": None if self.spec_decode is None else self.spec_decode.to_json(),
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate, "preemptions": self.preemptions,
                "interval_s": self.interval_s}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EngineDeltas:
        spec = doc.get("spec_decode")
        return cls(doc.get("speculative"), None if not spec else SpecDecode.from_json(spec),
                   doc.get("prefix_cache_hit_rate"), doc.get("preemptions"), doc.get("interval_s"))


def _delta(before: Scrape, after: Scrape, name: str) -> float | None:
    """A counter's increase, summed over its series (each engine's own, and behind a router each replica's: see
    snapshot_engines); None where either scrape lacks it or any series went down (that engine restarted: a sum
    would hide the reset behind another engine's growth)."""
    if before.total(name) is None or after.total(name) is None:
        return None
    earlier = {s.labels: s.value for s in before.samples if s.name == name and math.isfinite(s.value)}
    increases = [s.value - earlier.get(s.labels, 0.0) for s in after.samples
                 if s.name == name and math.isfinite(s.value)]
    return None if any(d < 0 for d in increases) else sum(increases)


def _by_position(scrape: Scrape) -> dict[int, float]:
    """The per-position counter summed over engines, by its `position` label."""
    out: dict[int, float] = {}
    for s in scrape.samples:
        position = dict(s.labels).get(POSITION_LABEL) if s.name == ACCEPTED_PER_POS else None
        if position is not None and position.isdigit() and math.isfinite(s.value):
            out[int(position)] = out.get(int(position), 0.0) + s.value
    return out


def _spec_decode(before: Scrape, after: Scrape) -> tuple[bool | None, SpecDecode | None]:
    if after.total(DRAFTS) is None:
        return False, None
    drafts, tokens, accepted = (_delta(before, after, n) for n in (DRAFTS, DRAFT_TOKENS, ACCEPTED))
    if drafts is None or tokens is None or accepted is None:
        return None, None
    first, last = _by_position(before), _by_position(after)
    per_pos = tuple(last[p] - first.get(p, 0.0) for p in sorted(last))
    if any(d < 0 for d in per_pos):
        per_pos = ()  # reset mid-run: the totals above hold, the positions cannot be told
    return True, SpecDecode(drafts, tokens, accepted, per_pos)


def _hit_rate(before: Scrape, after: Scrape) -> float | None:
    for hits_name, queries_name in zip(PREFIX_HITS, PREFIX_QUERIES):
        hits, queries = _delta(before, after, hits_name), _delta(before, after, queries_name)
        if hits is not None and queries is not None:
            return hits / queries if queries > 0 and hits <= queries else None
    return None


def deltas(before: Scrape | None, after: Scrape | None, interval_s: float | None = None) -> EngineDeltas | None:
    """The engine's figures between two scrapes; None (unknown) without both: no /metrics, or not vLLM's."""
    if before is None or after is None or not (before.samples and after.samples):
        return None
    speculative, spec = _spec_decode(before, after)
    return EngineDeltas(speculative, spec, _hit_rate(before, after), _delta(before, after, PREEMPTIONS),
                        None if interval_s is None else round(interval_s, 3))


@dataclass(frozen=True)
class Snapshot:
    """/metrics read once, at a moment of the run (time.monotonic()); scrape None: no answer, or not Prometheus."""

    at: float
    scrape: Scrape | None


async def snapshot(client: aiohttp.ClientSession, metrics_url: str) -> Snapshot:
    """One GET of /metrics through bench's own client (its key, its limits); any failure is a Snapshot without."""
    at = time.monotonic()
    try:
        async with client.get(metrics_url, timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as response:
            if response.status != 200:
                return Snapshot(at, None)
            body = await response.content.read(MAX_TEXT_CHARS)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
        return Snapshot(at, None)
    return Snapshot(at, parse(body.decode("utf-8", errors="replace")))


async def snapshot_engines(client: aiohttp.ClientSession, metrics_urls: Sequence[str]) -> Snapshot:
    """Every engine behind the endpoint at once, each at its own /metrics (replicas behind a router: vllm-router
    hands its own /metrics to one replica in turn, so two readings there may be two engines' counters), their
    samples side by side in one scrape, so each counter's total is summed over the engines. Unknown (no scrape)
    unless every engine answered: a sum missing one is no figure of the endpoint's."""
    if len(metrics_urls) == 1:
        return await snapshot(client, metrics_urls[0])
    taken = await asyncio.gather(*(snapshot(client, url) for url in metrics_urls))
    scrapes = [s.scrape for s in taken if s.scrape is not None]
    at = min((s.at for s in taken), default=time.monotonic())
    if not taken or len(scrapes) < len(taken):
        return Snapshot(at, None)
    # Each replica's samples get its index as a label: every replica's engine is `engine="0"`, and a counter's
    # delta is taken series by series.
    return Snapshot(at, Scrape(tuple(replace(sample, labels=(*sample.labels, (REPLICA_LABEL, str(i))))
                                     for i, scrape in enumerate(scrapes) for sample in scrape.samples),
                               sum(scrape.skipped for scrape in scrapes), any(scrape.truncated for scrape in scrapes)))


def engines_of(base_url: str, engine_metrics: Sequence[str]) -> list[str]:
    """Each engine's /metrics behind a router (`engine_metrics`), or else the endpoint's own."""
    return list(engine_metrics) or [metrics_url(base_url)]


class Held(Protocol):
    """Where a run keeps the snapshots its receipt's deltas are taken between."""

    metrics_before: Snapshot | None
    metrics_after: Snapshot | None


async def around(client: aiohttp.ClientSession, base_url: str, engine_metrics: Sequence[str], held: Held,
                 measure: Callable[[], Awaitable[None]]) -> None:
    """Either method's measurement between two snapshots of the engines' /metrics (each replica's own behind a
    router, `engine_metrics`; none: the endpoint's), the second taken after a BenchFailed too, so the rows measured
    before it keep their receipt."""
    engines = engines_of(base_url, engine_metrics)
    held.metrics_before = await snapshot_engines(client, engines)
    try:
        await measure()
    except BenchFailed:
        held.metrics_after = await snapshot_engines(client, engines)
        raise
    held.metrics_after = await snapshot_engines(client, engines)


def between(before: Snapshot | None, after: Snapshot | None) -> EngineDeltas | None:
    """The deltas over the measurement, from the snapshots taken just before its first request and after its last."""
    if before is None or after is None:
        return None
    return deltas(before.scrape, after.scrape, after.at - before.at)
