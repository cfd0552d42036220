"""`sparkcluster bootstrap` wall time on fresh simulated clusters of 2 and 8 Sparks: the first run (provisions)
and the second (finds nothing to do), with the ratios (goals: the second run within 25% of the first;
8 nodes within 1.5x of 2).

Run as root:  .venv/bin/python benchmarks/bootstrap_scaling.py
All figures come from this run: the real CLI, process start included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402


def bootstrap_seconds(inventory: Path, config_dir: str) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "sparkcluster", "bootstrap", str(inventory), "--json"], check=True,
                   capture_output=True, env={**os.environ, "XDG_CONFIG_HOME": config_dir})
    return time.monotonic() - start


def main() -> int:
    results: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as config_dir:
        for count in (2, 8):
            cluster = SimCluster.up(UpOptions(count=count, name=f"bench-boot{count}", ssh_mesh=False))
            try:
                results[count] = (bootstrap_seconds(cluster.inventory_path, config_dir),
                                  bootstrap_seconds(cluster.inventory_path, config_dir))
            finally:
                cluster.down()
    for count, (first, second) in results.items():
        print(f"{count} nodes: first run {first:.2f} s, second run {second:.2f} s, second/first {second / first:.2f}x")
    print(f"8 nodes / 2 nodes: first run {results[8][0] / results[2][0]:.2f}x, "
          f"second run {results[8][1] / results[2][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
