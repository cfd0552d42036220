"""The layouts side by side: one table of concurrency by layout (generation tokens/s, TTFT and ITL at p50) with the best
layout at each concurrency marked, and the same as one JSON document (`layouts`: a list of {layout, rows, receipt},
each receipt its own measurement's; `best`: concurrency -> layout). Best is the most generation tokens/s, the
aggregate a user's clients receive; a row with failed requests never wins. Measured with llama-benchy, a layout's row
at a concurrency is its cells' at the shallowest depth there: tg tok/s (total), TTFR and ITL (1 / the per-request tg
rate) their means. Figures from a CPU build of vLLM (the simulator's) are said to be so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from ..methods.llama_benchy.arithmetic import BenchmarkRun, itl_by_concurrency
from ..render import ms, tps
from ..render import table as new_table
from .build import is_cpu_build
from .state import Measured

BEST_MARK = "<- best"


@dataclass(frozen=True)
class Figures:
    """What the table shows of a layout at one concurrency, from either method."""

    concurrency: int
    generation_tps: float
    ttft_s: float | None
    itl_s: float | None
    errors: int


def figures(layout: Measured) -> list[Figures]:
    if layout.benchmarks is None:
        return [Figures(r.concurrency, r.generation_tps, r.ttft_s.p50, r.itl_s.p50, r.errors) for r in layout.rows]
    return benchy_figures(layout.benchmarks)


def benchy_figures(runs: Sequence[BenchmarkRun]) -> list[Figures]:
    """Each concurrency's cells at the shallowest depth measured there (as the decode budget reads them)."""
    itl = dict(itl_by_concurrency(runs))
    measured = [r for r in runs if not r.is_context_prefill_phase and r.tg_throughput is not None]
    found: list[Figures] = []
    for c in dict.fromkeys(r.concurrency for r in measured):
        at = [r for r in measured if r.concurrency == c]
        shallowest = [r for r in at if r.context_size == min(r.context_size for r in at)]
        tg = [r.tg_throughput.mean for r in shallowest if r.tg_throughput is not None]
        ttfr = [r.ttfr.mean / 1000 for r in shallowest if r.ttfr is not None]  # llama-benchy's ms
        found.append(Figures(c, sum(tg) / len(tg), sum(ttfr) / len(ttfr) if ttfr else None, itl.get(c), 0))
    return found


def best_per_concurrency(measured: Sequence[Measured]) -> dict[int, str]:
    """concurrency -> the layout with the most generation tokens/s there (the first one given wins a tie)."""
    best: dict[int, tuple[float, str]] = {}
    for layout in measured:
        for row in figures(layout):
            if row.errors or row.generation_tps <= 0:
                continue
            if row.concurrency not in best or row.generation_tps > best[row.concurrency][0]:
                best[row.concurrency] = (row.generation_tps, layout.layout)
    return {c: name for c, (_, name) in sorted(best.items())}


def cpu_note(measured: Sequence[Measured]) -> str | None:
    """Said plainly where any figure comes from a CPU build of vLLM: it proves the layouts serve and measure end to
    end, not which is fastest on Sparks."""
    versions = sorted({m.vllm_build for m in measured if m.vllm_build and is_cpu_build(m.vllm_build)})
    if not versions:
        return None
    return (f"these figures are a CPU build of vLLM's (vLLM {', '.join(versions)}, as the simulator runs it): they "
            "show that each layout serves and is measured end to end, not which layout is fastest on DGX Sparks; "
            "measure on the Sparks for that")


def render(measured: Sequence[Measured], concurrency: Sequence[int], title: str = "") -> Table:
    """A block of rows per concurrency (in the order measured), a row per layout inside it."""
    best = best_per_concurrency(measured)
    benchy = any(m.benchmarks is not None for m in measured)
    table = new_table("c", "layout", "generation\ntok/s", "TTFR\nmean" if benchy else "TTFT\np50",
                      "ITL\nmean" if benchy else "ITL\np50", "errors", "", title=title, right_from=2)
    for c in concurrency:
        rows = [(m, row) for m in measured for row in figures(m) if row.concurrency == c]
        for index, (m, row) in enumerate(rows):
            table.add_row(str(c) if index == 0 else "", f"{m.layout} ({m.shape.name})", tps(row.generation_tps),
                          ms(row.ttft_s), ms(row.itl_s), str(row.errors),
                          BEST_MARK if best.get(c) == m.layout else "", end_section=index == len(rows) - 1)
    return table


def document(measured: Sequence[Measured], config: dict[str, Any], stage_s: float) -> dict[str, Any]:
    """`layouts` and `best` as the issue names them, what produced them, and the wall time split into staging, the
    serves and the measurements (benchmarks/bench_layouts_wall.py reads it)."""
    return {
        "config": config,
        "layouts": [m.to_json() for m in measured],
        "best": {str(c): name for c, name in best_per_concurrency(measured).items()},
        "wall_s": {"stage": round(stage_s, 3), "serve": round(sum(m.serve_s for m in measured), 3),
                   "measure": round(sum(m.measure_s for m in measured), 3)},
        "cpu_vllm": cpu_note(measured),
    }
