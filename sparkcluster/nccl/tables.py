"""Bandwidth wherever a log holds it: nccl-tests' tables (out-of-place and in-place busbw, `# Avg bus bandwidth`),
the probe's own table and its SPARKCLUSTER_PROBE_RESULT rows, behind the prefixes mpirun, Ray and vLLM put first.

A log that holds only a table still proves the link's speed (a busbw of 2.8 GB/s is a degraded link whatever the
transport), so the tables are read on their own, with where they start, for runs.py to pair them with the NCCL
lines of the same run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..engine.nodetext import without_escapes
from .logs import PROBE_RESULT, BandwidthRow, Lines, _marked_json, _rows, split_lines

# mpirun --tag-output ("[1,0]<stdout>:"), Ray's "(RayWorkerWrapper pid=1234, ip=10.0.0.1)", a timestamp.
_PREFIXES = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:\s?|\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*"
                       r"|\d{4}-\d\d-\d\d[T ][\d:.,]+\S*\s+)*")
_STARTING = re.compile(r"^# Collective test starting: (\w+?)(?:_perf)?\s*$")
_NTHREAD = re.compile(r"^# nThread \d+")
_COMMAND = re.compile(r"\b(\w+)_perf\b")
_PROBE_OP = re.compile(r"^# (all_reduce|all_gather|reduce_scatter|alltoall|broadcast|reduce)\s*$")
_RANK_HOST = re.compile(r"^#\s+Rank\s+\d+ .*?\bon\s+(\S+)\s+device\b")
_AVG = re.compile(r"^# Avg bus bandwidth\s*:\s*([0-9.]+)")
_UNIT = re.compile(r"\(.*\)$")


@dataclass(frozen=True)
class BandwidthTable:
    """One run's measurements: an nccl-tests invocation, or the probe's rows."""

    source: str  # the file
    op: str
    rows: tuple[BandwidthRow, ...]
    avg_busbw_gbps: float | None  # nccl-tests' own average over every size (small ones too)
    line: int  # where it starts in its file, to pair it with the NCCL lines of the same run
    segment: int  # tables of one invocation share it (the probe prints one table per collective)
    hosts: tuple[str, ...]  # nccl-tests' "Rank N ... on HOST device" lines
    from_probe: bool = False


@dataclass
class _Table:
    op: str
    columns: list[str]
    line: int
    segment: int
    hosts: list[str]
    rows: list[BandwidthRow] = field(default_factory=list)
    avg: float | None = None


def clean(line: str) -> str:
    return _PREFIXES.sub("", without_escapes(line)).rstrip()


def read_tables(text: Lines, source: str = "log") -> list[BandwidthTable]:
    tables: list[BandwidthTable] = []
    op = "nccl-tests"
    hosts: list[str] = []
    segment = 0
    open_table: _Table | None = None
    segment_has_table = False

    def close() -> None:
        nonlocal open_table
        if open_table is not None and (open_table.rows or open_table.avg is not None):
            tables.append(BandwidthTable(source, open_table.op, tuple(open_table.rows), open_table.avg,
                                         open_table.line, open_table.segment, tuple(dict.fromkeys(open_table.hosts))))
        open_table = None

    for line_no, raw in enumerate(split_lines(text), 1):
        line = clean(raw)
        if (doc := _marked_json(line, PROBE_RESULT)) is not None:
            close()
            found = doc.get("rows")
            rows = _rows(found) if isinstance(found, list) else []
            if rows:
                tables.append(BandwidthTable(source, "probe", tuple(rows), None, line_no, segment, (), True))
            continue
        if (m := _STARTING.match(line)) or _NTHREAD.match(line):
            if segment_has_table:  # a new invocation: nccl-tests prints both lines once per run
                close()
                segment += 1
                segment_has_table = False
                hosts = []
            if m:
                op = m[1]
            continue
        if m := _PROBE_OP.match(line):
            close()
            op = m[1]
            continue
        if m := _RANK_HOST.match(line):
            hosts.append(m[1])
            continue
        if m := _AVG.match(line):
            if open_table is None:  # a summary grepped out of its table
                open_table = _Table(op, [], line_no, segment, hosts)
            open_table.avg = float(m[1])
            segment_has_table = True
            close()
            continue
        if line.startswith("#"):
            words = line[1:].split()
            if "size" in words and any(w.startswith("busbw") for w in words):
                close()
                open_table = _Table(op, [_UNIT.sub("", w) for w in words], line_no, segment, hosts)
            continue
        if open_table is not None and (row := _row(open_table, line)) is not None:
            open_table.rows.append(row)
            segment_has_table = True
        elif not line.startswith("#") and (m := _COMMAND.search(line)) and open_table is None:
            op = m[1]  # the command line that started nccl-tests names the collective
    close()
    return _drop_probe_echoes(tables)


def _row(table: _Table, line: str) -> BandwidthRow | None:
    words = line.split()
    if len(words) != len(table.columns) or not words[0].isdigit():
        return None
    values = dict[str, list[str]]()
    for name, word in zip(table.columns, words, strict=True):
        values.setdefault(name, []).append(word)
    busbw = [_number(w) for w in values.get("busbw", [])]
    algbw = [_number(w) for w in values.get("algbw", [])]
    times = [_number(w) for w in values.get("time", [])]
    if not busbw or busbw[0] is None:
        return None
    return BandwidthRow(table.op, int(words[0]), times[0] or 0.0 if times else 0.0, algbw[0] or 0.0 if algbw else 0.0,
                        busbw[0], busbw[1] if len(busbw) > 1 else None)


def _number(word: str) -> float | None:
    try:
        return float(word)
    except ValueError:  # "N/A" where nccl-tests has no in-place variant
        return None


def _drop_probe_echoes(tables: list[BandwidthTable]) -> list[BandwidthTable]:
    """The probe prints its rows twice, as a table and as JSON: keep the JSON."""
    probe_rows = {(r.op, r.size_bytes, round(r.busbw_gbps, 2)) for t in tables if t.from_probe for r in t.rows}
    return [t for t in tables if t.from_probe or not t.rows
            or not all((r.op, r.size_bytes, round(r.busbw_gbps, 2)) in probe_rows for r in t.rows)]


def rows_of(tables: Sequence[BandwidthTable]) -> list[BandwidthRow]:
    """Every row, and nccl-tests' average as a row of unknown size where a table holds nothing else."""
    rows = [r for t in tables for r in t.rows]
    rows += [BandwidthRow(t.op, 0, 0.0, t.avg_busbw_gbps, t.avg_busbw_gbps) for t in tables
             if not t.rows and t.avg_busbw_gbps is not None]
    return rows
