"""`sparkcluster nccl-report LOGFILE...` and `verify`'s output: the verdict as a person or a script reads it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from ..engine.errors import EXIT_FAILED, EXIT_OK, UsageError
from ..engine.localfiles import kind_of
from . import bundles, controlplane, latency, links
from .bundles import Opener, bundle_ref
from .logs import RankLog, format_table, read_capped_lines, read_log, read_probe_output
from .runs import FileLog, Run, group_runs
from .tables import read_tables
from .verdict import Verdict, VerdictStatus, judge
from .verifyresult import VerifyResult


def report(paths: Sequence[str], *, json_output: bool, min_busbw: float | None) -> tuple[int, str]:
    """(exit code, text to print): 0 for PASS and WARN (the WARN is printed), 1 when any run FAILs. Each run in the
    files (runs.py) gets its own verdict."""
    files: list[FileLog] = []
    probe_ranks: list[dict[str, Any]] = []
    for path in paths:
        ref = bundle_ref(path)
        if ref is None:
            _check_regular(path)
            read = [_read(path, partial(_open, path))]
        else:  # a support bundle (doctor --bundle) stands for the logs inside it, in the order of their names
            read = sorted((_read(name, opener) for name, opener in bundles.logs(ref)), key=lambda r: r[0].path)
        files += [file for file, _ in read]
        probe_ranks += [rank for _, ranks in read for rank in ranks]
    judged = [(run, judge(run.ranks, rows=run.rows, min_busbw_gbps=min_busbw, table_hosts=run.table_hosts))
              for run in group_runs(files)] or [(Run("the given logs", (), ()), judge([]))]
    verdict = _worst([v for _, v in judged])
    code = EXIT_FAILED if verdict.status is VerdictStatus.FAIL else EXIT_OK
    if json_output:
        rows = [r for run, _ in judged for r in run.rows]
        doc = {**asdict(verdict), "rows": [asdict(r) for r in rows], "probe_ranks": probe_ranks,
               "ranks": [_rank_doc(r) for run, _ in judged for r in run.ranks],
               "runs": [{"name": run.name, **asdict(v), "rows": [asdict(r) for r in run.rows]} for run, v in judged]}
        return code, json.dumps(doc, indent=2)
    if len(judged) == 1:
        return code, "\n".join(_verdict_lines(*judged[0], indent=""))
    counts = ", ".join(f"{sum(v.status is s for _, v in judged)} {s}" for s in reversed(VerdictStatus)
                       if any(v.status is s for _, v in judged))
    lines = [f"{verdict.status}  {len(judged)} runs, judged apart: {counts}"]
    for number, (run, v) in enumerate(judged, 1):
        lines += ["", f"run {number}: {run.name}", *_verdict_lines(run, v, indent="  ")]
    return code, "\n".join(lines)


def _read(path: str, opener: Opener) -> tuple[FileLog, list[dict[str, Any]]]:
    """One input's ranks, tables and probe ranks: one pass per reader, none of which keeps the text whole."""
    with opener() as f:
        ranks = read_log(read_capped_lines(f.readline), source=path)
    with opener() as f:
        tables = read_tables(read_capped_lines(f.readline), source=path)
    with opener() as f:
        probe_ranks = read_probe_output(read_capped_lines(f.readline))[1]
    if tables:  # nccl-tests without NCCL_DEBUG: the table is the run, not a rank that printed nothing
        ranks = [r for r in ranks if r.nccl_lines or r.errors]
    return FileLog(path, tuple(ranks), tuple(tables)), probe_ranks


def _worst(verdicts: Sequence[Verdict]) -> Verdict:
    for status in (VerdictStatus.FAIL, VerdictStatus.WARN):
        if found := next((v for v in verdicts if v.status is status), None):
            return found
    return verdicts[0]


def _verdict_lines(run: Run, verdict: Verdict, indent: str) -> list[str]:
    lines = [f"{indent}{verdict.status}  {verdict.cause}"]
    if verdict.fix:
        lines.append(f"{indent}  fix: {verdict.fix}")
    lines += [f"{indent}  {d}" for d in verdict.details]
    if run.rows:
        lines.append(format_table(run.rows))
    return lines


def _check_regular(path: str) -> None:
    """Only a regular file has an end: /dev/zero never does, and opening a FIFO waits for a writer forever."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file", "pass the NCCL log files (captured with NCCL_DEBUG=INFO)") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})", "pass readable log files") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path}: not a regular file ({kind_of(mode)})",
                         "save the log to a file first (e.g. `... 2>&1 | tee nccl.log`) and pass that file")


def _open(path: str) -> TextIO:
    try:
        return open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})", "pass readable log files") from None


def _rank_doc(rank: RankLog) -> dict[str, Any]:
    doc = asdict(rank)
    del doc["channels"]  # hundreds of lines in a vLLM log; the transports say what they showed
    doc["transports"] = list(rank.transports)
    return doc


def render_verify(console: Console, result: VerifyResult) -> None:
    style = {VerdictStatus.PASS: "bold green", VerdictStatus.WARN: "bold yellow", VerdictStatus.FAIL: "bold red"}[result.verdict.status]
    if result.rows:
        console.print(format_table(result.rows), markup=False, highlight=False)
    if result.latency:
        console.print(f"latency per call, all_reduce median/p99: {latency.summary(result.latency)}", highlight=False)
    for node, lines in result.carried_by.items():
        for line in lines:
            console.print(f"{node}: {line}", highlight=False)
    if result.links:
        console.print(f"links of the {result.topology or 'fabric'}, each alone:", highlight=False)
        for line in [*links.matrix(result.links), *links.latency_matrix(result.links)]:
            console.print(f"  {line}", markup=False, highlight=False)
    for line in result.skipped_links:
        console.print(f"  not measured: {line}", markup=False, highlight=False)
    if result.control_plane:
        console.print("control plane (the addresses each node advertises):", highlight=False)
        for line in controlplane.grouped(result.control_plane):
            console.print(f"  {line}", markup=False, highlight=False)
    console.print(f"[{style}]{result.verdict.status}[/] ({result.backend}) {escape(result.verdict.cause)}",
                  highlight=False)
    if result.verdict.fix:
        console.print(f"  fix: {escape(result.verdict.fix)}", highlight=False)
