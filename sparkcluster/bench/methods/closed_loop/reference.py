"""The closed loop's rows beside a recipe's published `reference:` rows (or a recipe file's), by concurrency, through
the shared ratio table (compare.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from ....engine.errors import UsageError
from ....recipes.load import Reference, load_recipe
from ...compare import Compared, ratio_table
from .arithmetic import Row

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


def render(found: Sequence[Ratio], reference: Reference) -> Table:
    """One line per concurrency."""
    by_level: dict[str, list[Ratio]] = {}
    for r in found:
        by_level.setdefault(str(r.concurrency), []).append(r)
    nodes = f"{reference.nodes} node{'s' if reference.nodes != 1 else ''}"
    return ratio_table("c", by_level, {key: label for key, label, _, _ in FIGURES}, f"vs published: {reference.source}",
                       f"published on {reference.hardware}, {nodes}",
                       lambda figure, v: f"{v * 1000:,.0f} ms" if figure.endswith("_s") else f"{v:,.1f}")
