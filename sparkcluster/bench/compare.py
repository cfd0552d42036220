"""Measured rows beside published ones: a recipe's `reference:` (or a recipe file's) gives rows by concurrency;
each figure both sides have is printed with the ratio, so a user reads "you get 87% of the published figure".
Higher is better for throughput, lower for latency; the ratio is always measured / published."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.table import Table

from ..engine.errors import UsageError
from ..serving.recipes import Reference, load_recipe
from .stats import Row

# (reference key, label, how to read the measured row, True when higher is better)
FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("prefill_tps", "prefill tok/s", "prefill_tps", True),
    ("generation_tps", "generation tok/s", "generation_tps", True),
    ("peak_tps", "peak tok/s", "peak_tps", True),
    ("ttft_s", "TTFT mean", "ttft_s.mean", False),
    ("itl_s", "ITL mean", "itl_s.mean", False),
    ("e2e_s", "E2E mean", "e2e_s.mean", False),
)


@dataclass(frozen=True)
class Ratio:
    concurrency: int
    figure: str
    measured: float
    published: float
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        return self.measured / self.published if self.published else 0.0


def load_reference(name_or_path: str) -> Reference:
    recipe = load_recipe(name_or_path)
    if recipe.reference is None:
        raise UsageError(f"recipe {name_or_path} has no published reference rows",
                         "compare with a recipe that has `reference:` (gpt-oss-120b), or add one to your file")
    return recipe.reference


def _measured(row: Row, path: str) -> float | None:
    value: object = row
    for part in path.split("."):
        value = getattr(value, part)
    if value is None or isinstance(value, int | float):
        return value
    raise TypeError(f"{path} names {type(value).__name__}, not a figure")  # a bug in FIGURES, not bad input


def ratios(rows: Sequence[Row], reference: Reference) -> list[Ratio]:
    published = {r["concurrency"]: r for r in reference.rows}
    out = []
    for row in rows:
        ref = published.get(row.concurrency)
        if ref is None:
            continue
        for key, label, path, higher in FIGURES:
            measured = _measured(row, path)
            if key in ref and measured is not None:
                out.append(Ratio(row.concurrency, key, measured, float(ref[key]), higher))
    return out


def render(found: Sequence[Ratio], reference: Reference) -> Table:
    """One line per concurrency; per figure "measured / published  ratio"."""
    labels = {key: label for key, label, _, _ in FIGURES}
    figures = [key for key, *_ in FIGURES if any(r.figure == key for r in found)]
    nodes = f"{reference.nodes} node{'s' if reference.nodes != 1 else ''}"
    table = Table("c", *(f"{labels[key]}\nmeasured / published" for key in figures), box=box.SIMPLE_HEAD,
                  title=f"vs published: {reference.source}", caption=f"published on {reference.hardware}, {nodes}")
    for column in table.columns:
        column.justify, column.no_wrap = "right", True
    by_level: dict[int, dict[str, Ratio]] = {}
    for r in found:
        by_level.setdefault(r.concurrency, {})[r.figure] = r
    for concurrency, cells in by_level.items():
        table.add_row(str(concurrency), *(_cell(cells[key]) if key in cells else "-" for key in figures))
    return table


def _cell(r: Ratio) -> str:
    good = r.ratio >= 1 if r.higher_is_better else r.ratio <= 1
    def shown(value: float) -> str:
        return f"{value * 1000:,.0f} ms" if r.figure.endswith("_s") else f"{value:,.1f}"
    return f"{shown(r.measured)} / {shown(r.published)}  [{'green' if good else 'yellow'}]{r.ratio * 100:.0f}%[/]"
