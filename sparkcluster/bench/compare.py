"""Measured figures beside published ones, for either method (its rows by concurrency, or by shape): each figure
both sides have is printed with the ratio, so a user reads "you get 87% of the published figure". Higher is better
for throughput, lower for latency; the ratio is always measured / published."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from .render import table as new_table


@dataclass(frozen=True)
class Compared:
    """One figure measured beside its published value; a row type adds what the row is (a concurrency, a shape)."""

    figure: str
    measured: float
    published: float
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        return self.measured / self.published if self.published else 0.0


def ratio_table(first_column: str, rows: Mapping[str, Sequence[Compared]], labels: Mapping[str, str], title: str,
                caption: str | None = None, shown: Callable[[str, float], str] = lambda figure, v: f"{v:,.1f}"
                ) -> Table:
    """A line per row (a concurrency, a shape); per figure (in `labels`' order) "measured / published  ratio"."""
    figures = [key for key in labels if any(c.figure == key for found in rows.values() for c in found)]
    table = new_table(first_column, *(f"{labels[key]}\nmeasured / published" for key in figures), title=title,
                      caption=caption)
    for name, found in rows.items():
        cells = {c.figure: c for c in found}
        table.add_row(name, *(_cell(cells[key], shown) if key in cells else "-" for key in figures))
    return table


def _cell(c: Compared, shown: Callable[[str, float], str]) -> str:
    good = c.ratio >= 1 if c.higher_is_better else c.ratio <= 1
    return (f"{shown(c.figure, c.measured)} / {shown(c.figure, c.published)}  "
            f"[{'green' if good else 'yellow'}]{c.ratio * 100:.0f}%[/]")


def is_results_file(value: str) -> bool:
    return Path(value).suffix.lower() in (".csv", ".json")
