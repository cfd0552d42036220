"""--plot for llama-benchy runs: prompt and generation throughput (total t/s, the batch's) against depth, one
line per concurrency; when the run has one depth only, against concurrency instead. Context-load entries are
left out: they measure the cache being filled, not the cell."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .arithmetic import BenchmarkRun, Metric


def _mean(m: Metric | None) -> float | None:
    return m.mean if m else None


def save(runs: Sequence[BenchmarkRun], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in runs if not r.is_context_prefill_phase]
    depths = sorted({r.context_size for r in measured})
    by_depth = len(depths) > 1
    figure, panels = plt.subplots(1, 2, figsize=(12, 4.6), constrained_layout=True)
    figure.suptitle(title, fontsize=11)
    series = sorted({r.concurrency for r in measured}) if by_depth else depths
    for key in series:
        chosen = sorted((r for r in measured if (r.concurrency if by_depth else r.context_size) == key),
                        key=lambda r: r.context_size if by_depth else r.concurrency)
        x = [r.context_size if by_depth else r.concurrency for r in chosen]
        label = f"c={key}" if by_depth else f"depth {key}"
        panels[0].plot(x, [_mean(r.pp_throughput) for r in chosen], "o-", label=label)
        panels[1].plot(x, [_mean(r.tg_throughput) for r in chosen], "o-", label=label)
    for panel, what in zip(panels, ("prompt processing (pp), total t/s", "generation (tg), total t/s")):
        panel.set_title(what, fontsize=10)
        panel.set_xlabel("depth (context tokens)" if by_depth else "concurrency")
        panel.set_ylabel("tokens/s")
        panel.grid(alpha=0.3)
        panel.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
