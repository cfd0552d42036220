"""--plot: one PNG a person would rather look at than the table, for either method: each method says its panels
(methods/*/plot.py); `draw` is the one drawing.
matplotlib is imported in `draw` only, so the CLI starts without it; the Agg backend needs no display."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


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


def ms(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else v * 1000 for v in values]
