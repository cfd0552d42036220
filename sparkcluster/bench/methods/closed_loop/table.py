"""The results as people read them: a rich table shaped like the community's recipe tables (concurrency, prefill,
generation, peak, TTFT p50, ITL p50) with the server's own figures beside each row, and the same rows as CSV
(one column per figure, distributions flattened as ttft_s_p50 and so on) for a spreadsheet."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from rich.table import Table

from ....engine.localfiles import write_text
from ...ceiling import per_stream_decode
from ...metrics import ServerSide
from ...render import ms, percent, tps
from ...render import table as new_table
from ...render import write_csv as write_rows
from .sweep import Level

DISTRIBUTIONS = ("ttft_s", "itl_s", "e2e_s")
STATS = ("mean", "p50", "p90", "p99")
SERVER_COLUMNS = ("kv_cache_peak", "prefix_cache_hit_rate", "preemptions", "generation_tokens", "prompt_tokens")


def render(levels: Sequence[Level], title: str = "", ceiling_tps: float | None = None) -> Table:
    """`ceiling_tps`: the decode ceiling at concurrency 1 (ceiling.py); each row's per-stream decode as its share."""
    shares = ("decode/stream\nof ceiling",) if ceiling_tps else ()
    table = new_table("c", "prefill\ntok/s", "generation\ntok/s", "peak\ntok/s", "TTFT\np50", "ITL\np50", "E2E\np50",
                      "requests", "errors", "KV cache\npeak", "prefix\nhits", "preempt-\nions", *shares, title=title)
    for level in levels:
        row, server = level.row, level.server
        table.add_row(str(row.concurrency), tps(row.prefill_tps), tps(row.generation_tps), tps(row.peak_tps),
                      ms(row.ttft_s.p50), ms(row.itl_s.p50), ms(row.e2e_s.p50), str(row.requests),
                      f"[red]{row.errors}[/]" if row.errors else "0",
                      percent(server.kv_cache_peak) if server else "-",
                      percent(server.prefix_cache_hit_rate) if server else "-",
                      str(server.preemptions) if server and server.preemptions is not None else "-",
                      *((percent(per_stream_decode(row.generation_tps, row.concurrency, row.itl_s.p50) / ceiling_tps),)
                        if ceiling_tps else ()))
    return table


def flat(level: Level) -> dict[str, object]:
    """One CSV line: the row's figures, then the server's (server_ prefix; empty where not reported)."""
    doc = level.row.to_json()
    out: dict[str, object] = {}
    for key, value in doc.items():
        if key in DISTRIBUTIONS:
            out.update({f"{key}_{stat}": value[stat] for stat in STATS})
        else:
            out[key] = value
    server = dataclasses.asdict(level.server) if level.server else {}
    out.update({f"server_{key}": server.get(key) for key in SERVER_COLUMNS})
    return out


def write_csv(levels: Sequence[Level], out: TextIO) -> None:
    if not levels:
        return
    lines = [flat(level) for level in levels]
    write_rows(out, list(lines[0]), [list(line.values()) for line in lines])


def save_csv(levels: Sequence[Level], path: Path) -> None:
    """Through engine/localfiles.py, as every result: a link planted at the CSV is replaced, never written through."""
    out = io.StringIO(newline="")
    write_csv(levels, out)
    write_text(path, out.getvalue())


def server_doc(server: ServerSide | None) -> dict[str, Any] | None:
    return dataclasses.asdict(server) if server else None
