"""llama-benchy 0.4.0's arithmetic, figure for figure, from the clock readings of a cell's runs.

Per request: ttfr = first chunk with choices - start; e2e_ttft = first chunk with a token - start;
est_ppt = max(0, ttfr - latency); pp = prompt tokens / est_ppt (the server's count when within 20% of the
expected one); tg = tokens after the first token's time / (last token - first token).
Per run (a burst of C requests): pp = all prompt tokens / (latest first token - earliest start); tg = all
tokens after each request's first / (latest last token - earliest first token); peak = most tokens in any 1 s
window over every token time of the run (count / duration when the run's tokens span less than 1 s).
Per cell: mean and population std of the per-run figures (at c=1, of the per-request ones), with the values;
ttfr, est_ppt and e2e_ttft in ms, one value per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...figures import PEAK_WINDOW_S, Metric, metric, peak_rate
from .chat import RequestResult

__all__ = ["METRICS", "BenchmarkRun", "Metric", "metric", "peak_throughput", "summarize"]


def peak_throughput(timestamps: Sequence[float], window: float = PEAK_WINDOW_S) -> float:
    """Most tokens in any `window` seconds; over a span shorter than the window, count / span."""
    if not timestamps:
        return 0.0
    span = max(timestamps) - min(timestamps)
    if 0 < span < window:
        return len(timestamps) / span
    return peak_rate([(t, 1.0) for t in timestamps], window)


def tokens_after_first(timestamps: Sequence[float]) -> int:
    if len(timestamps) < 2:
        return 0
    return sum(1 for t in timestamps if t > timestamps[0])


@dataclass
class Figures:
    """What a cell's runs add up, before the means: llama-benchy's agg_* lists."""
    pp_req: list[float] = field(default_factory=list)
    tg_req: list[float] = field(default_factory=list)
    ttfr: list[float] = field(default_factory=list)
    est_ppt: list[float] = field(default_factory=list)
    e2e_ttft: list[float] = field(default_factory=list)
    pp_batch: list[float] = field(default_factory=list)
    tg_batch: list[float] = field(default_factory=list)
    peak: list[float] = field(default_factory=list)
    peak_req: list[float] = field(default_factory=list)

    def add_run(self, results: Sequence[RequestResult], expected_prompt: int, latency: float) -> None:
        valid = [r for r in results if r.error is None]
        if not valid:
            return
        prompt_total, first_tokens, last_tokens, all_times = 0, [], [], []
        for r in valid:
            all_times.extend(r.token_timestamps)
            if r.token_timestamps:
                self.peak_req.append(peak_throughput(r.token_timestamps))
                last_tokens.append(r.token_timestamps[-1])
            elif r.end_ts:
                last_tokens.append(r.end_ts)
            prompt = expected_prompt
            if r.prompt_tokens > 0 and abs(r.prompt_tokens - expected_prompt) < expected_prompt * 0.2:
                prompt = r.prompt_tokens
            prompt_total += prompt
            ttfr = est_ppt = 0.0
            if r.first_response_ts:
                ttfr = r.first_response_ts - r.start_ts
                self.ttfr.append(ttfr)
            if r.first_token_ts:
                first_tokens.append(r.first_token_ts)
                est_ppt = max(0.0, ttfr - latency)
                self.e2e_ttft.append(r.first_token_ts - r.start_ts)
                self.est_ppt.append(est_ppt)
            if est_ppt > 0:
                self.pp_req.append(prompt / est_ppt)
            if r.total_tokens > 1 and len(r.token_timestamps) > 1:
                decode_time = r.token_timestamps[-1] - r.token_timestamps[0]
                decode_tokens = tokens_after_first(r.token_timestamps)
                if decode_time > 0 and decode_tokens > 0:
                    self.tg_req.append(decode_tokens / decode_time)
        if first_tokens:
            start = min(r.start_ts for r in valid)
            end = max(last_tokens) if last_tokens else max(r.end_ts for r in valid)
            if max(first_tokens) - start > 0:
                self.pp_batch.append(prompt_total / (max(first_tokens) - start))
            if end - min(first_tokens) > 0:
                decoded = sum(tokens_after_first(r.token_timestamps) for r in valid)
                if decoded > 0:
                    self.tg_batch.append(decoded / (end - min(first_tokens)))
        if all_times:
            self.peak.append(peak_throughput(all_times))


@dataclass(frozen=True)
class BenchmarkRun:
    """One entry of llama-benchy's `benchmarks[]` (a cell, or its context-load phase)."""
    concurrency: int
    context_size: int
    prompt_size: int
    response_size: int
    is_context_prefill_phase: bool
    pp_throughput: Metric | None = None
    pp_req_throughput: Metric | None = None
    tg_throughput: Metric | None = None
    tg_req_throughput: Metric | None = None
    peak_throughput: Metric | None = None
    peak_req_throughput: Metric | None = None
    ttfr: Metric | None = None
    est_ppt: Metric | None = None
    e2e_ttft: Metric | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"concurrency": self.concurrency, "context_size": self.context_size,
                               "prompt_size": self.prompt_size, "response_size": self.response_size,
                               "is_context_prefill_phase": self.is_context_prefill_phase}
        for name in METRICS:
            value: Metric | None = getattr(self, name)
            doc[name] = value.to_json() if value else None
        doc["throughput_over_time"] = None
        doc["requests_throughput_over_time"] = None
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BenchmarkRun:
        """An entry as llama-benchy (or this module) wrote it; KeyError/TypeError/ValueError when malformed."""
        def m(value: Any) -> Metric | None:
            if value is None:
                return None
            return Metric(float(value["mean"]), float(value["std"]), tuple(float(v) for v in value["values"]))
        return cls(int(doc["concurrency"]), int(doc["context_size"]), int(doc["prompt_size"]),
                   int(doc["response_size"]), bool(doc["is_context_prefill_phase"]),
                   **{name: m(doc.get(name)) for name in METRICS})


METRICS = ("pp_throughput", "pp_req_throughput", "tg_throughput", "tg_req_throughput", "peak_throughput",
           "peak_req_throughput", "ttfr", "est_ppt", "e2e_ttft")


def summarize(runs: Sequence[Sequence[RequestResult]], *, pp: int, tg: int, depth: int, concurrency: int,
              latency: float, expected_prompt: int, context_phase: bool) -> BenchmarkRun:
    """A cell's (or its context load's) runs as one benchmarks[] entry, as llama-benchy's results.add does."""
    f = Figures()
    for run in runs:
        f.add_run(run, expected_prompt, latency)
    pp_total = metric(f.pp_batch if concurrency > 1 else f.pp_req)
    tg_total = metric(f.tg_batch if concurrency > 1 else f.tg_req)
    return BenchmarkRun(
        concurrency, depth, pp, tg, context_phase,
        pp_throughput=pp_total, pp_req_throughput=pp_total if concurrency == 1 else metric(f.pp_req),
        tg_throughput=tg_total, tg_req_throughput=tg_total if concurrency == 1 else metric(f.tg_req),
        peak_throughput=metric(f.peak), peak_req_throughput=metric(f.peak_req),
        ttfr=metric(f.ttfr, 1000), est_ppt=metric(f.est_ppt, 1000), e2e_ttft=metric(f.e2e_ttft, 1000))


def itl_by_concurrency(runs: Sequence[BenchmarkRun]) -> list[tuple[int, float]]:
    """Each concurrency's inter-token latency in seconds, for the decode budget: 1 / the per-request tg rate (tokens
    after the first over their span: one over the time between tokens), of the tg cells at the shallowest depth
    measured at that concurrency (a deeper context lengthens attention, not the all-reduces), averaged over them."""
    rates: dict[int, tuple[int, list[float]]] = {}
    for run in runs:
        if run.is_context_prefill_phase or run.tg_req_throughput is None or run.tg_req_throughput.mean <= 0:
            continue
        depth, found = rates.get(run.concurrency, (run.context_size, []))
        if run.context_size < depth:
            depth, found = run.context_size, []
        if run.context_size == depth:
            rates[run.concurrency] = (depth, [*found, 1 / run.tg_req_throughput.mean])
    return [(c, sum(itls) / len(itls)) for c, (_, itls) in sorted(rates.items())]
