"""llama-benchy 0.4.0's three outputs, in its shapes: the JSON document (metadata flattened beside
`benchmarks`), the 16-column CSV, and the markdown table (a pipe table, `mean ± std`, no `(req)` columns at c=1).
The Arena's benchmark.csv is the same CSV over the merged cells (so every row name carries ` (cN)`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import render
from .arithmetic import BenchmarkRun, Metric

CSV_COLUMNS = ("model", "test_name", "t_s_mean", "t_s_std", "t_s_req_mean", "t_s_req_std", "peak_ts_mean",
               "peak_ts_std", "peak_ts_req_mean", "peak_ts_req_std", "ttfr_mean", "ttfr_std", "est_ppt_mean",
               "est_ppt_std", "e2e_ttft_mean", "e2e_ttft_std")
JSON_KEYS = ("version", "timestamp", "latency_mode", "latency_ms", "model", "prefix_caching_enabled",
             "max_concurrency", "benchmarks")
BENCHY_VERSION = "0.4.0"  # the llama-benchy whose requests, arithmetic and formats these are


@dataclass(frozen=True)
class Header:
    timestamp: str  # "%Y-%m-%d %H:%M:%SZ", UTC
    latency_mode: str
    latency_ms: float
    model: str
    prefix_caching_enabled: bool
    max_concurrency: int
    version: str = BENCHY_VERSION


@dataclass(frozen=True)
class Line:
    """One row of the table and the CSV: a pp or tg figure of a cell, or of its context load."""
    model: str
    test_name: str
    t_s: Metric | None
    t_s_req: Metric | None
    peak_ts: Metric | None
    peak_ts_req: Metric | None
    ttfr: Metric | None
    est_ppt: Metric | None
    e2e_ttft: Metric | None


def document(header: Header, runs: Sequence[BenchmarkRun]) -> dict[str, Any]:
    return {"version": header.version, "timestamp": header.timestamp, "latency_mode": header.latency_mode,
            "latency_ms": header.latency_ms, "model": header.model,
            "prefix_caching_enabled": header.prefix_caching_enabled, "max_concurrency": header.max_concurrency,
            "benchmarks": [run.to_json() for run in runs]}


def lines(model: str, runs: Sequence[BenchmarkRun], max_concurrency: int, arena: bool = False) -> list[Line]:
    """The rows llama-benchy prints. `arena`: sparkrun's json_to_csv, which writes a tg row only where there is
    a tg figure (llama-benchy also writes one for a peak alone, as a run of 1-token answers has)."""
    out = []
    for run in runs:
        c = f" (c{run.concurrency})" if max_concurrency > 1 else ""
        if run.is_context_prefill_phase:
            pp_name, tg_name = f"ctx_pp @ d{run.context_size}{c}", f"ctx_tg @ d{run.context_size}{c}"
        else:
            d = f" @ d{run.context_size}" if run.context_size > 0 else ""
            pp_name, tg_name = f"pp{run.prompt_size}{d}{c}", f"tg{run.response_size}{d}{c}"
        if run.pp_throughput:
            out.append(Line(model, pp_name, run.pp_throughput, run.pp_req_throughput, None, None, run.ttfr,
                            run.est_ppt, run.e2e_ttft))
        if run.tg_throughput or (run.peak_throughput and not arena):
            out.append(Line(model, tg_name, run.tg_throughput, run.tg_req_throughput, run.peak_throughput,
                            run.peak_req_throughput, None, None, None))
    return out


def csv_text(model: str, runs: Sequence[BenchmarkRun], max_concurrency: int, arena: bool = False) -> str:
    rows = []
    for line in lines(model, runs, max_concurrency, arena):
        row: list[object] = [line.model, line.test_name]
        for m in (line.t_s, line.t_s_req, line.peak_ts, line.peak_ts_req, line.ttfr, line.est_ppt, line.e2e_ttft):
            row += [m.mean, m.std] if m else ["", ""]
        rows.append(row)
    return render.csv_text(CSV_COLUMNS, rows)


def _fmt(m: Metric | None) -> str:
    return "" if m is None else f"{m.mean:.2f} ± {m.std:.2f}"


def markdown(model: str, runs: Sequence[BenchmarkRun], max_concurrency: int) -> str:
    """The table llama-benchy prints (tabulate's "pipe" format, first column left, the rest right)."""
    found = lines(model, runs, max_concurrency)
    if not found:
        return "No results collected. Check if the model is generating tokens."
    total = "t/s (total)" if max_concurrency > 1 else "t/s"
    if max_concurrency > 1:
        headers = ["model", "test", total, "t/s (req)", "peak t/s", "peak t/s (req)", "ttfr (ms)", "est_ppt (ms)",
                   "e2e_ttft (ms)"]
        data = [[x.model, x.test_name, _fmt(x.t_s), _fmt(x.t_s_req), _fmt(x.peak_ts), _fmt(x.peak_ts_req),
                 _fmt(x.ttfr), _fmt(x.est_ppt), _fmt(x.e2e_ttft)] for x in found]
    else:
        headers = ["model", "test", total, "peak t/s", "ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)"]
        data = [[x.model, x.test_name, _fmt(x.t_s), _fmt(x.peak_ts), _fmt(x.ttfr), _fmt(x.est_ppt),
                 _fmt(x.e2e_ttft)] for x in found]
    return render.pipe_table(headers, data)
