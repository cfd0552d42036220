"""Which lines belong to which run: one call of `nccl-report` may get several runs (two nccl-tests runs appended to
one file, one file per run, the logs of one run split per rank), and each is judged on its own, so that a healthy
run cannot hide a degraded one and one run's fallback is not blamed on another.

Processes that joined one communicator (NCCL's commId) are one run, across files; a process whose lines stop before
it printed a commId joins the run nearest it in its file. A bandwidth table belongs to the run whose lines come
before it in its file; a table with no NCCL lines before it is a run of its own (nccl-tests without NCCL_DEBUG).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .logs import BandwidthRow, RankLog
from .tables import BandwidthTable, rows_of


@dataclass(frozen=True)
class Run:
    name: str
    ranks: tuple[RankLog, ...]
    tables: tuple[BandwidthTable, ...]

    @property
    def rows(self) -> list[BandwidthRow]:
        return rows_of(self.tables)

    @property
    def table_hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h for t in self.tables for h in t.hosts))


@dataclass(frozen=True)
class FileLog:
    path: str
    ranks: tuple[RankLog, ...]
    tables: tuple[BandwidthTable, ...]


def group_runs(files: Sequence[FileLog]) -> list[Run]:
    groups: list[list[tuple[str, RankLog]]] = []
    by_comm: dict[str, int] = {}
    for f in files:
        for rank in f.ranks:
            if not rank.comm_ids:
                continue
            index = next((by_comm[c] for c in rank.comm_ids if c in by_comm), None)
            if index is None:
                index = len(groups)
                groups.append([])
            groups[index].append((f.path, rank))
            for c in rank.comm_ids:
                by_comm.setdefault(c, index)
    in_files: dict[str, list[int]] = {}  # a file's groups, in order: looked up, not searched (20,000 files)
    for index, group in enumerate(groups):
        for path in dict.fromkeys(path for path, _ in group):
            in_files.setdefault(path, []).append(index)
    for f in files:
        in_file = in_files.get(f.path, [])
        loose = [r for r in f.ranks if not r.comm_ids]
        if loose and not in_file:
            groups.append([(f.path, r) for r in loose])
            in_files[f.path] = [len(groups) - 1]
            continue
        for rank in loose:
            nearest = min(in_file, key=lambda i: min(abs(r.first_line - rank.first_line)
                                                     for path, r in groups[i] if path == f.path))
            groups[nearest].append((f.path, rank))
    tables: list[list[BandwidthTable]] = [[] for _ in groups]
    alone: dict[tuple[str, int], list[BandwidthTable]] = {}
    for f in files:
        for table in f.tables:
            before = [(max(r.first_line for path, r in groups[i] if path == f.path), i) for i in in_files.get(f.path, [])
                      if any(path == f.path and r.first_line <= table.line for path, r in groups[i])]
            if before:
                tables[max(before)[1]].append(table)
            else:
                alone.setdefault((f.path, table.segment), []).append(table)
    runs = [Run(_name(g, t), tuple(r for _, r in g), tuple(t)) for g, t in zip(groups, tables, strict=True)]
    runs += [Run(f"{path} (nccl-tests {t[0].op}, no NCCL lines)" if not t[0].from_probe else f"{path} (probe rows)",
                 (), tuple(t)) for (path, _), t in alone.items()]
    return runs


def _name(group: Sequence[tuple[str, RankLog]], tables: Sequence[BandwidthTable]) -> str:
    paths = ", ".join(dict.fromkeys(path for path, _ in group))
    pids = [r.source.rsplit(" ", 1)[-1] for _, r in group if r.host is not None]
    return f"{paths} ({', '.join(pids)})" if pids else paths
