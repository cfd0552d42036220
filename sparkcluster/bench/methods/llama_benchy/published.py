"""`--compare FILE` with llama-benchy's own results: its CSV (also the Spark Arena's benchmark.csv) or its JSON
(also sparkrun's merged {model, max_concurrency, benchmarks}). A row is compared only with a row of the same
shape (pp or tg or context load, prompt or output size, depth, concurrency) measured the same way: a run of
another method, or one whose shapes none match, is refused with the reason, before anything connects."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from ....engine.errors import UsageError
from ....engine.localfiles import read_bytes
from ...compare import Compared, ratio_table
from .arithmetic import BenchmarkRun
from .formats import CSV_COLUMNS, Line, lines
from .schedule import Cell

TEST_NAME = re.compile(r"^(?:pp(?P<pp>\d+)|tg(?P<tg>\d+)|(?P<ctx>ctx_pp|ctx_tg))(?: @ d(?P<depth>\d+))?"
                       r"(?: \(c(?P<c>\d+)\))?$")
MAX_FILE_BYTES = 32 << 20
FIGURES = (("t_s", "t/s", True), ("peak_ts", "peak t/s", True), ("ttfr", "ttfr ms", False),
           ("est_ppt", "est_ppt ms", False), ("e2e_ttft", "e2e_ttft ms", False))


@dataclass(frozen=True, order=True)
class Shape:
    kind: str  # pp, tg, ctx_pp, ctx_tg
    size: int  # pp or tg tokens (the context load's rows name none: 0)
    depth: int
    concurrency: int

    def __str__(self) -> str:
        name = f"{self.kind}{self.size or ''}"
        return f"{name} @ d{self.depth} (c{self.concurrency})" if self.depth else f"{name} (c{self.concurrency})"


@dataclass(frozen=True)
class Row:
    shape: Shape
    figures: dict[str, float]  # t_s, peak_ts, ttfr, est_ppt, e2e_ttft means, where the row has them


@dataclass(frozen=True)
class Published:
    source: str
    rows: tuple[Row, ...]


def shape_of(test_name: str) -> Shape | None:
    m = TEST_NAME.match(test_name.strip())
    if m is None:
        return None
    kind = m["ctx"] or ("pp" if m["pp"] else "tg")
    return Shape(kind, int(m["pp"] or m["tg"] or 0), int(m["depth"] or 0), int(m["c"] or 1))


def _rows_of_lines(found: Iterable[Line]) -> list[Row]:
    rows = []
    for line in found:
        shape = shape_of(line.test_name)
        if shape is None:
            continue
        figures = {key: m.mean for key in ("t_s", "peak_ts", "ttfr", "est_ppt", "e2e_ttft")
                   if (m := getattr(line, key)) is not None}
        rows.append(Row(shape, figures))
    return rows


def rows_of_runs(runs: Sequence[BenchmarkRun]) -> list[Row]:
    """Our own entries as rows; concurrency always named (a c=1-only run's rows carry no suffix)."""
    return _rows_of_lines(lines("", runs, 2))


def load(path: Path) -> Published:
    """A llama-benchy CSV or JSON (or an Arena benchmark.csv / sparkrun merged JSON); UsageError otherwise."""
    shown = str(path)
    data = read_bytes(path, f"--compare {shown}", "a results file", "give a results file", MAX_FILE_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--compare {shown}: not UTF-8 text", "give a results file") from None
    if path.suffix.lower() == ".json":
        return Published(shown, tuple(_json_rows(text, shown)))
    return Published(shown, tuple(_csv_rows(text, shown)))


def _csv_rows(text: str, shown: str) -> list[Row]:
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != CSV_COLUMNS:
        raise UsageError(f"{shown}:1: not llama-benchy's CSV (its header is {', '.join(CSV_COLUMNS)})",
                         "give llama-benchy's --format csv output, or an Arena benchmark.csv")
    rows = []
    for number, record in enumerate(reader, start=2):
        shape = shape_of(record["test_name"] or "")
        if shape is None:
            raise UsageError(f"{shown}:{number}: test_name {record['test_name']!r} is not llama-benchy's",
                             "rows are named like `pp2048 @ d4096 (c5)` or `tg128 (c2)`")
        figures = {}
        for key in ("t_s", "peak_ts", "ttfr", "est_ppt", "e2e_ttft"):
            value = record.get(f"{key}_mean") or ""
            if value.strip():
                try:
                    figures[key] = float(value)
                except ValueError:
                    raise UsageError(f"{shown}:{number}: {key}_mean {value!r} is not a number",
                                     "give llama-benchy's CSV as it wrote it") from None
        rows.append(Row(shape, figures))
    return rows


def _json_rows(text: str, shown: str) -> list[Row]:
    try:
        doc = json.loads(text)
        runs = [BenchmarkRun.from_json(b) for b in doc["benchmarks"]]
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{shown}: not llama-benchy's JSON ({type(e).__name__}: {str(e)[:120]})",
                         "give llama-benchy's --format json output, or an Arena benchmark.json") from None
    return rows_of_runs(runs)


def planned_shapes(cells: Iterable[Cell], prefix_caching: bool) -> set[Shape]:
    shapes = set()
    for cell in cells:
        shapes |= {Shape("pp", cell.pp, cell.depth, cell.concurrency), Shape("tg", cell.tg, cell.depth, cell.concurrency)}
        if prefix_caching and cell.depth > 0:
            shapes |= {Shape("ctx_pp", 0, cell.depth, cell.concurrency),
                       Shape("ctx_tg", 0, cell.depth, cell.concurrency)}
    return shapes


def check(published: Published, planned: set[Shape]) -> None:
    """Refuse a comparison where no planned row has a published row of the same shape."""
    theirs = {row.shape for row in published.rows}
    if not theirs:
        raise UsageError(f"--compare {published.source} holds no rows", "give a results file with rows")
    if not theirs & planned:
        cells = sorted({(s.depth, s.concurrency) for s in theirs})
        pp = sorted({s.size for s in theirs if s.kind == "pp"})
        tg = sorted({s.size for s in theirs if s.kind == "tg"})
        raise UsageError(
            f"--compare {published.source}: none of its rows has a shape this run measures (its rows are "
            f"{', '.join(str(s) for s in sorted(theirs)[:4])}{', ...' if len(theirs) > 4 else ''}); "
            "rows of different pp, tg, depth or concurrency are not comparable",
            f"measure its shapes: --pp {' '.join(map(str, pp)) or '?'} --tg {' '.join(map(str, tg)) or '?'} "
            f"--depth {' '.join(str(d) for d in sorted({d for d, _ in cells}))} "
            f"--concurrency {' '.join(str(c) for c in sorted({c for _, c in cells}))}"
            + (" --enable-prefix-caching" if any(s.kind.startswith("ctx") for s in theirs) else ""))


@dataclass(frozen=True)
class Pair(Compared):
    shape: Shape


def pairs(ours: Sequence[Row], published: Published) -> list[Pair]:
    theirs = {row.shape: row for row in published.rows}
    out = []
    for row in ours:
        match = theirs.get(row.shape)
        if match is None:
            continue
        for key, _, higher in FIGURES:
            if key in row.figures and key in match.figures:
                out.append(Pair(key, row.figures[key], match.figures[key], higher, shape=row.shape))
    return out


def render(found: Sequence[Pair], source: str) -> Table:
    """One line per shape."""
    by_shape: dict[str, list[Pair]] = {}
    for p in found:
        by_shape.setdefault(str(p.shape), []).append(p)
    return ratio_table("test", by_shape, {key: label for key, label, _ in FIGURES},
                       f"vs published: {source} (llama-benchy, same shapes only)")
