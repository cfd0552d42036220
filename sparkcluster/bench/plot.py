"""--plot: one PNG a person would rather look at than the table: output throughput (sustained and peak), prefill
throughput, and latency (TTFT p50/p90, ITL p50) against concurrency, the published reference dashed beside.
matplotlib is imported here only, so the CLI starts without it; the Agg backend needs no display."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..recipes.load import Reference
from .methods.closed_loop.arithmetic import Row


def _ms(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else v * 1000 for v in values]


def save(rows: Sequence[Row], path: Path, title: str, reference: Reference | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r.concurrency)
    x = [r.concurrency for r in rows]
    ticks = sorted(set(x) | {int(r["concurrency"]) for r in (reference.rows if reference else ())
                             if r["concurrency"] <= x[-1]})
    figure, (output, prefill, latency) = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    figure.suptitle(title, fontsize=11)
    output.plot(x, [r.generation_tps for r in rows], "o-", color="tab:blue", label="generation (sustained)")
    output.plot(x, [r.peak_tps for r in rows], "^--", color="tab:cyan", label="peak (best 1 s)")
    prefill.plot(x, [r.prefill_tps for r in rows], "o-", color="tab:green", label="prefill")
    latency.plot(x, _ms([r.ttft_s.p50 for r in rows]), "o-", color="tab:red", label="TTFT p50")
    latency.plot(x, _ms([r.ttft_s.p90 for r in rows]), "v:", color="tab:red", alpha=0.6, label="TTFT p90")
    latency.plot(x, _ms([r.itl_s.p50 for r in rows]), "s-", color="tab:purple", label="ITL p50")
    if reference is not None:
        def published(key: str) -> tuple[list[int], list[float]]:
            # Only as far as this run went: the comparison, not the published curve's far end.
            pairs = [(int(r["concurrency"]), r[key]) for r in reference.rows if key in r and r["concurrency"] <= x[-1]]
            return [c for c, _ in pairs], [v for _, v in pairs]

        label = f"published ({reference.nodes} node{'s' if reference.nodes != 1 else ''})"
        for axis, key, color in ((output, "generation_tps", "tab:blue"), (output, "peak_tps", "tab:cyan"),
                                 (prefill, "prefill_tps", "tab:green")):
            px, py = published(key)
            if px:
                axis.plot(px, py, "x--", color=color, alpha=0.45, label=f"{key.split('_')[0]} {label}")
        for key, color in (("ttft_s", "tab:red"), ("itl_s", "tab:purple")):
            px, py = published(key)
            if px:
                latency.plot(px, [v * 1000 for v in py], "x--", color=color, alpha=0.45,
                             label=f"{key.split('_')[0].upper()} mean {label}")
    for axis, heading, unit in ((output, "Output throughput", "tokens/s"), (prefill, "Prefill throughput", "tokens/s"),
                                (latency, "Latency", "ms")):
        axis.set_title(heading)
        axis.set_xlabel("concurrent requests")
        axis.set_ylabel(unit)
        axis.set_xscale("log", base=2)
        axis.set_xticks(ticks, [str(c) for c in ticks])
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
