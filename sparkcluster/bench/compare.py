"""Measured rows beside published ones: a recipe's `reference:` (or a recipe file's) gives rows by concurrency;
each figure both sides have is printed with the ratio, so a user reads "you get 87% of the published figure".
Higher is better for throughput, lower for latency; the ratio is always measured / published."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rich.table import Table

from ..engine.errors import UsageError
from ..recipes.load import Reference, load_recipe
from .methods.closed_loop.arithmetic import Row
from .render import table as new_table

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
class Compared:
    """One figure measured beside its published value; a row type adds what the row is (a concurrency, a shape)."""

    figure: str
    measured: float
    published: float
    higher_is_better: bool

    @property
    def ratio(self) -> float:
        return self.measured / self.published if self.published else 0.0


@dataclass(frozen=True)
class Ratio(Compared):
    concurrency: int


def load_reference(name_or_path: str) -> Reference:
    # Only the published rows are read: nothing of the recipe runs, so an untrusted registry's env or flags,
    # which the trust gate refuses for a serve, need no --trust here.
    recipe = load_recipe(name_or_path, trust=True)
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
                out.append(Ratio(key, measured, float(ref[key]), higher, concurrency=row.concurrency))
    return out


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


def render(found: Sequence[Ratio], reference: Reference) -> Table:
    """One line per concurrency."""
    by_level: dict[str, list[Ratio]] = {}
    for r in found:
        by_level.setdefault(str(r.concurrency), []).append(r)
    nodes = f"{reference.nodes} node{'s' if reference.nodes != 1 else ''}"
    return ratio_table("c", by_level, {key: label for key, label, _, _ in FIGURES}, f"vs published: {reference.source}",
                       f"published on {reference.hardware}, {nodes}",
                       lambda figure, v: f"{v * 1000:,.0f} ms" if figure.endswith("_s") else f"{v:,.1f}")
