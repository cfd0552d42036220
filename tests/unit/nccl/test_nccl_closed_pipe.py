"""`nccl-report ... | head -1`: the exit code says the verdict also where the reader closed the pipe before the
report was written (README audit round 3, item 8). The pipe is closed before the child writes, so the race of a
real `head` (which may read everything before it exits) cannot hide the case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
ROOT = Path(__file__).resolve().parents[3]


def report_into_a_closed_pipe(*logs: Path) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone: every write gets EPIPE
    try:
        return subprocess.run([sys.executable, "-m", "sparkcluster", "nccl-report", *map(str, logs)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60)
    finally:
        os.close(write_end)


def test_a_fail_still_exits_1_when_the_reader_left_early() -> None:
    logs = sorted(FIXTURES.glob("*.log"))  # 13 of their runs FAIL
    done = report_into_a_closed_pipe(*logs)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


def test_a_pass_still_exits_0_when_the_reader_left_early() -> None:
    done = report_into_a_closed_pipe(FIXTURES / "hpcx-ibext.log")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
