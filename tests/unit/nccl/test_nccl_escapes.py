"""The NCCL readers strip a node's escape sequences with the one node-text stripper (engine/nodetext.py), so a log
that went through a terminal tool (tput's `ESC(B ESC[m`, an erase-line, a title) reads as its plain twin does."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.nccl.logs import read_log
from sparkcluster.nccl.tables import read_tables

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "nccl"

# Sequences the colour-only pattern (ESC[...m) the readers kept before left in place.
NOT_COLOURS = {
    "tput sgr0": "\x1b(B\x1b[m",
    "erase line": "\x1b[K",
    "window title": "\x1b]0;spark-2\x07",
    "hyperlink": "\x1b]8;;file:///tmp/x\x1b\\",
    "8-bit CSI": "\x9b0m",
}


def _decorated(text: str, escape: str) -> str:
    return "\n".join(escape + line for line in text.splitlines())


@pytest.mark.parametrize("escape", NOT_COLOURS.values(), ids=NOT_COLOURS.keys())
@pytest.mark.parametrize("name", ["roce-both-twins.log", "vllm-ray-combined.log"])  # bare host:pid lines; Ray's
def test_an_nccl_log_with_escapes_before_each_line_reads_as_the_plain_log(name: str, escape: str) -> None:
    plain = (FIXTURES / name).read_text()
    expected = read_log(plain, "log")
    assert [(r.host, r.rank, r.network) for r in expected] == [("spark-1", 0, "IB"), ("spark-2", 1, "IB")]
    assert read_log(_decorated(plain, escape), "log") == expected


@pytest.mark.parametrize("escape", NOT_COLOURS.values(), ids=NOT_COLOURS.keys())
def test_an_nccl_tests_table_with_escapes_before_each_line_reads_as_the_plain_table(escape: str) -> None:
    plain = (FIXTURES / "nccl-tests-only.log").read_text()
    expected = read_tables(plain, "log")
    assert [t.avg_busbw_gbps for t in expected] == [20.0538]
    assert read_tables(_decorated(plain, escape), "log") == expected
