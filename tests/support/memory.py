"""A child process with its address space capped, printing its peak, for the tests that bound memory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Runs the report in a child with its address space capped, so that the old f.read() fails (MemoryError) rather
# than taking the test machine's memory, and prints the child's peak memory.
REPORT_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from sparkcluster import cli
code = cli.main(["nccl-report", *sys.argv[1:]])
# VmHWM is this process's own peak; ru_maxrss would carry over the parent's (pytest's) from before the exec.
print("peak_kb", next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")), file=sys.stderr)
sys.exit(code)
"""


def report_child(*paths: str) -> tuple[int, str, str, int]:
    """(exit code, stdout, stderr, peak memory in MB) of `nccl-report PATHS` in a capped child; 20 s at most."""
    try:
        done = subprocess.run([sys.executable, "-c", REPORT_CHILD, *paths], capture_output=True, text=True, timeout=20,
                              env={**os.environ, "COLUMNS": "1000"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"nccl-report {' '.join(paths)} hung")
    peak = [int(line.split()[1]) // 1024 for line in done.stderr.splitlines() if line.startswith("peak_kb")]
    return done.returncode, done.stdout, done.stderr, peak[0] if peak else -1
