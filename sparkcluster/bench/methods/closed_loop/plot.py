"""The closed loop's --plot: output throughput (sustained and peak), prefill throughput, and latency (TTFT p50/p90,
ITL p50) against concurrency, the published reference dashed beside."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ....recipes.load import Reference
from ...plot import Line, Panel, draw, ms
from .arithmetic import Row


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
        Line("TTFT p50", x, ms([r.ttft_s.p50 for r in rows]), "o-", "tab:red"),
        Line("TTFT p90", x, ms([r.ttft_s.p90 for r in rows]), "v:", "tab:red", 0.6),
        Line("ITL p50", x, ms([r.itl_s.p50 for r in rows]), "s-", "tab:purple")], ticks)
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
