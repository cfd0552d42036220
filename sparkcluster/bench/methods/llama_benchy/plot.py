"""llama-benchy's --plot: pp and tg (total t/s) against depth, a line per concurrency (against concurrency when the
run has one depth; context-load entries measure the cache being filled, not the cell, and are left out)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...plot import Line, Panel, draw
from .arithmetic import BenchmarkRun


def save(runs: Sequence[BenchmarkRun], path: Path, title: str) -> None:
    measured = [r for r in runs if not r.is_context_prefill_phase]
    depths = sorted({r.context_size for r in measured})
    by_depth = len(depths) > 1
    xlabel = "depth (context tokens)" if by_depth else "concurrency"
    prompt = Panel("prompt processing (pp), total t/s", xlabel, "tokens/s", title_size=10)
    generation = Panel("generation (tg), total t/s", xlabel, "tokens/s", title_size=10)
    for key in sorted({r.concurrency for r in measured}) if by_depth else depths:
        chosen = sorted((r for r in measured if (r.concurrency if by_depth else r.context_size) == key),
                        key=lambda r: r.context_size if by_depth else r.concurrency)
        x = [r.context_size if by_depth else r.concurrency for r in chosen]
        label = f"c={key}" if by_depth else f"depth {key}"
        prompt.lines.append(Line(label, x, [r.pp_throughput.mean if r.pp_throughput else None for r in chosen]))
        generation.lines.append(Line(label, x, [r.tg_throughput.mean if r.tg_throughput else None for r in chosen]))
    draw([prompt, generation], path, title, 12)
