"""`sparkcluster facts` wall time on 2 and on 8 simulated Sparks, and their ratio (goal: 8 within 1.5x of 2).

Run as root:  .venv/bin/python benchmarks/facts_scaling.py [--runs N]
Each figure is the median of N runs of the real CLI (process start included), measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402


def facts_seconds(inventory: Path, limit: str | None, runs: int) -> float:
    argv = [sys.executable, "-m", "sparkcluster", "facts", str(inventory), "--json"]
    if limit:
        argv += ["--limit", limit]
    times = []
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.monotonic() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cluster = SimCluster.up(UpOptions(count=8, name="bench-facts"))
    try:
        two = facts_seconds(cluster.inventory_path, "spark-1,spark-2", args.runs)
        eight = facts_seconds(cluster.inventory_path, None, args.runs)
    finally:
        cluster.down()
    print(f"facts, 2 hosts: {two:.2f} s   8 hosts: {eight:.2f} s   ratio 8/2: {eight / two:.2f}x (goal <= 1.5x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
