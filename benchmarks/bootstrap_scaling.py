"""`sparkcluster bootstrap` on fresh simulated clusters of 2 and 8 Sparks, twice each (the first run provisions,
the second finds nothing to do), for hosts whose QSFP twins are already addressed and for hosts fresh from the box
(`sim up --no-fabric-addresses`, where the first run also writes netplan and addresses the fabric).

Prints wall seconds and the CLI's CPU seconds per host bootstrapped, with the ratios (goals: the second run
within 25% of the first; 8 nodes within 1.5x of 2; the first mile a small share of the first run).
Every simulated host shares this machine's cores, so wall time hides what scales: the CPU seconds per host are
what carries over to real Sparks (the hosts' own work runs on their own cores there).

Run as root:  .venv/bin/python benchmarks/bootstrap_scaling.py
All figures come from this run: the real CLI, process start included.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402


def bootstrap(inventory: Path, config_dir: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the CLI process) of one bootstrap."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "sparkcluster", "bootstrap", str(inventory), "--json"], check=True,
                   capture_output=True, env={**os.environ, "XDG_CONFIG_HOME": config_dir})
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    results: dict[tuple[int, bool], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as config_dir:
        for count in (2, 8):
            for addressed in (True, False):
                cluster = SimCluster.up(UpOptions(count=count, name=f"bench-boot{count}{'a' if addressed else 'f'}",
                                                  ssh_mesh=False, fabric_addresses=addressed))
                try:
                    results[(count, addressed)] = [bootstrap(cluster.inventory_path, config_dir) for _ in range(2)]
                finally:
                    cluster.down()
    for (count, addressed), ((first, first_cpu), (second, second_cpu)) in results.items():
        kind = "addressed" if addressed else "fresh from the box"
        print(f"{count} nodes, {kind}: first run {first:.2f} s ({first_cpu / count:.2f} CPU s/host), second run "
              f"{second:.2f} s ({second_cpu / count:.2f} CPU s/host), second/first {second / first:.2f}x")
    for addressed in (True, False):
        kind = "addressed" if addressed else "fresh"
        print(f"8 nodes / 2 nodes ({kind}): first run {results[(8, addressed)][0][0] / results[(2, addressed)][0][0]:.2f}x, "
              f"second run {results[(8, addressed)][1][0] / results[(2, addressed)][1][0]:.2f}x")
    for count in (2, 8):
        print(f"the first mile on {count} nodes: fresh first run / addressed first run "
              f"{results[(count, False)][0][0] / results[(count, True)][0][0]:.2f}x wall, "
              f"{results[(count, False)][0][1] / results[(count, True)][0][1]:.2f}x CLI CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
