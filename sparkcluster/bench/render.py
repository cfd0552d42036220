"""The one place bench's results become text: the rich table people read on a terminal, the pipe table
llama-benchy prints (markdown), CSV for a spreadsheet, and the number formats they share. Each method says which
columns and rows (methods/closed_loop/table.py, compare.py, layouts/report.py, methods/llama_benchy/formats.py);
none draws its own."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import TextIO

from rich import box
from rich.table import Table


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def tps(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def table(*headers: str, title: str | None = None, caption: str | None = None, right_from: int = 0) -> Table:
    """A rich table in bench's look: a simple head, figures (the columns from `right_from` on) right-aligned
    and never wrapped."""
    out = Table(*headers, title=title or None, caption=caption, box=box.SIMPLE_HEAD)
    for column in out.columns[right_from:]:
        column.justify, column.no_wrap = "right", True
    return out


def pipe_table(headers: Sequence[str], data: Sequence[Sequence[str]]) -> str:
    """tabulate's "pipe" format (first column left, the rest right), as llama-benchy prints its table."""
    # tabulate's widths: the widest cell, and at least the header plus its minimum padding of 2
    widths = [max(len(h) + 2, *(len(row[i]) for row in data)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    rule = "|" + "|".join((":" + "-" * (w + 1)) if i == 0 else ("-" * (w + 1) + ":")
                          for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in data)])


def write_csv(out: TextIO, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """A header line and the rows, "\\r\\n" after each (the csv module's default, as llama-benchy writes it)."""
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(header)
    writer.writerows(rows)


def csv_text(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    buffer = io.StringIO()
    write_csv(buffer, header, rows)
    return buffer.getvalue()
