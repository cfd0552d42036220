"""The arithmetic from timelines to one row per concurrency, pure and exact (tests/unit/bench/test_bench_stats.py):

- prefill_tps: prompt tokens / the time during which at least one request waited for its first token (the union
  of the [sent, first token] intervals). One stream: prompt / TTFT; a batch sent together: all prompts / the time
  to the last first token, as llama-benchy computes it; staggered streams: their prefills overlap, not add up.
- generation_tps: output tokens that arrived inside the window (all C streams busy) / the window's length.
- peak_tps: the most output tokens in any 1 s window [t, t + 1 s) inside it (the mean when it is shorter).
- ttft_s, itl_s, e2e_s: mean, p50, p90, p99 over the successful requests (figures.py's percentile).
A concurrency's row is the median of its runs, field by field; the counts are the totals of all runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from ...figures import PEAK_WINDOW_S, Distribution, distribution, peak_rate, percentile, union_length
from ...timeline import RunTimeline

__all__ = ["Distribution", "Row", "combine", "distribution", "peak_rate", "percentile", "summarize_run",
           "union_length"]


@dataclass(frozen=True)
class Row:
    concurrency: int
    prefill_tps: float
    generation_tps: float
    peak_tps: float
    ttft_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize_run(run: RunTimeline) -> Row:
    ok = [r for r in run.requests if r.ok]
    first_tokens = [r for r in ok if r.ttft is not None]
    prefill_time = union_length((r.start, r.token_times[0]) for r in first_tokens)
    begin, end = run.window
    inside = [(t, n) for r in ok for t, n in r.output_events() if begin <= t <= end]
    span = end - begin
    generation = sum(n for _, n in inside) / span if span > 0 else 0.0
    peak = peak_rate(inside) if span >= PEAK_WINDOW_S else generation
    return Row(
        concurrency=run.concurrency,
        prefill_tps=sum(r.prompt_tokens for r in first_tokens) / prefill_time if prefill_time > 0 else 0.0,
        generation_tps=generation,
        peak_tps=peak,
        ttft_s=distribution([r.ttft for r in first_tokens if r.ttft is not None]),  # all of them: mypy cannot see it
        itl_s=distribution([r.itl for r in ok if r.itl is not None]),
        e2e_s=distribution([r.e2e for r in ok]),
        requests=len(run.requests),
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        completion_tokens=sum(r.completion_tokens for r in ok),
        errors=len(run.requests) - len(ok),
    )


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def combine(rows: Sequence[Row]) -> Row:
    """One concurrency's runs as one row: the median of each figure, the totals of the counts."""
    if len(rows) == 1:
        return rows[0]
    dists = {f.name: Distribution(*(_median(getattr(getattr(r, f.name), k) for r in rows)
                                    for k in ("mean", "p50", "p90", "p99")))
             for f in fields(Row) if f.type in ("Distribution", Distribution)}
    return Row(
        concurrency=rows[0].concurrency,
        prefill_tps=_median(r.prefill_tps for r in rows) or 0.0,
        generation_tps=_median(r.generation_tps for r in rows) or 0.0,
        peak_tps=_median(r.peak_tps for r in rows) or 0.0,
        ttft_s=dists["ttft_s"], itl_s=dists["itl_s"], e2e_s=dists["e2e_s"],
        requests=sum(r.requests for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        errors=sum(r.errors for r in rows),
    )
