"""--plot: one PNG a person would rather look at than the table, for either method. The closed loop's: output
throughput (sustained and peak), prefill throughput, and latency (TTFT p50/p90, ITL p50) against concurrency,
the published reference dashed beside. llama-benchy's: pp and tg (total t/s) against depth, a line per
concurrency (against concurrency when the run has one depth; context-load entries measure the cache being
filled, not the cell, and are left out). Each says its panels; `draw` is the one drawing.
matplotlib is imported in `draw` only, so the CLI starts without it; the Agg backend needs no display."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..recipes.load import Reference
from .methods.closed_loop.arithmetic import Row
from .methods.llama_benchy.arithmetic import BenchmarkRun


@dataclass(frozen=True)
class Line:
    label: str
    x: Sequence[float]
    y: Sequence[float | None]
    style: str = "o-"
    color: str | None = None
    alpha: float = 1.0


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    lines: list[Line] = field(default_factory=list)
    log2_ticks: Sequence[int] | None = None  # a log2 x axis with these ticks, from y = 0
    title_size: float | None = None


def draw(panels: Sequence[Panel], path: Path, title: str, width: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(panels), figsize=(width, 4.6), constrained_layout=True)
    figure.suptitle(title, fontsize=11)
    for axis, panel in zip(axes, panels):
        for line in panel.lines:
            axis.plot(line.x, line.y, line.style, color=line.color, alpha=line.alpha, label=line.label)
        axis.set_title(panel.title, **({"fontsize": panel.title_size} if panel.title_size else {}))
        axis.set_xlabel(panel.xlabel)
        axis.set_ylabel(panel.ylabel)
        if panel.log2_ticks is not None:
            axis.set_xscale("log", base=2)
            axis.set_xticks(panel.log2_ticks, [str(c) for c in panel.log2_ticks])
            axis.set_ylim(bottom=0)
            axis.grid(True, alpha=0.3)
        else:
            axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _ms(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else v * 1000 for v in values]


def save(rows: Sequence[Row], path: Path, title: str, reference: Reference | None = None) -> None:
    """The closed loop's rows, and the published reference's as far as this run went."""
    rows = sorted(rows, key=lambda r: r.concurrency)
    x = [r.concurrency for r in rows]
    ticks = sorted(set(x) | {int(r["concurrency"]) for r in (reference.rows if reference else ())
                             if r["concurrency"] <= x[-1]})
    output = Panel("Output throughput", "concurrent requests", "tokens/s", [
        Line("generation (sustained)", x, [r.generation_tps for r in rows], "o-", "tab:blue"),
        Line("peak (best 1 s)", x, [r.peak_tps for r in rows], "^--", "tab:cyan")], ticks)
    prefill = Panel("Prefill throughput", "concurrent requests", "tokens/s",
                    [Line("prefill", x, [r.prefill_tps for r in rows], "o-", "tab:green")], ticks)
    latency = Panel("Latency", "concurrent requests", "ms", [
        Line("TTFT p50", x, _ms([r.ttft_s.p50 for r in rows]), "o-", "tab:red"),
        Line("TTFT p90", x, _ms([r.ttft_s.p90 for r in rows]), "v:", "tab:red", 0.6),
        Line("ITL p50", x, _ms([r.itl_s.p50 for r in rows]), "s-", "tab:purple")], ticks)
    if reference is not None:
        def published(key: str) -> tuple[list[int], list[float]]:
            # Only as far as this run went: the comparison, not the published curve's far end.
            pairs = [(int(r["concurrency"]), r[key]) for r in reference.rows if key in r and r["concurrency"] <= x[-1]]
            return [c for c, _ in pairs], [v for _, v in pairs]

        label = f"published ({reference.nodes} node{'s' if reference.nodes != 1 else ''})"
        for panel, key, color in ((output, "generation_tps", "tab:blue"), (output, "peak_tps", "tab:cyan"),
                                  (prefill, "prefill_tps", "tab:green")):
            px, py = published(key)
            if px:
                panel.lines.append(Line(f"{key.split('_')[0]} {label}", px, py, "x--", color, 0.45))
        for key, color in (("ttft_s", "tab:red"), ("itl_s", "tab:purple")):
            px, py = published(key)
            if px:
                latency.lines.append(Line(f"{key.split('_')[0].upper()} mean {label}", px, [v * 1000 for v in py],
                                          "x--", color, 0.45))
    draw([output, prefill, latency], path, title, 15)


def save_llama_benchy(runs: Sequence[BenchmarkRun], path: Path, title: str) -> None:
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
