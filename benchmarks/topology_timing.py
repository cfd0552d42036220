"""`sparkcluster bootstrap` and `sparkcluster verify` on simulated clusters of each topology, in one run: a pair
(2 nodes, one cable), a 3-ring and a 4-ring (cabled crosswise) and an 8-node switch. Each cluster is fresh
(`sim up N --topology ...`, no Docker, twins already addressed), bootstrapped once (`--runtime host`), then
verified once with the per-link runs (verify's default: the whole collective, then each link alone).

Prints, per topology: wall seconds of bootstrap and verify with their ratio to the pair's, the CLI's CPU seconds,
and the CPU seconds the simulated hosts themselves spent per host (every process of each host's PID namespace:
sshd, the commands bootstrap runs, verify's torch ranks), which is what carries over to real Sparks: there each
host's work runs on its own cores, here all hosts share this machine's. verify's links grow with the topology
(pair: the 2 twins; 3-ring: 6 links; 4-ring: 8; 8-node switch: 16, each node's link against the head).

Run as root:  .venv/bin/python benchmarks/topology_timing.py
All figures come from this run: the real CLI, process start included.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402

TOPOLOGIES = (("pair", 2, "pair"), ("3-ring", 3, "ring"), ("4-ring", 4, "ring"), ("8-node switch", 8, "switch"))
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Timed:
    wall_s: float
    cli_cpu_s: float
    host_cpu_s: float  # summed over the cluster's hosts
    code: int
    note: str = ""


def _tree_cpu(root: int) -> float:
    """CPU seconds of `root` and every live descendant, with what each has reaped (cutime/cstime): the whole
    tree's use since it started (a reaped process's time is in its parent's c-times, never counted twice)."""
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone between listing and reading
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        used[pid] = sum(int(f) for f in fields[11:15]) / TICKS  # utime stime cutime cstime
    tree, frontier = {root}, [root]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier and p not in tree]
        tree.update(children)
        frontier = children
    return sum(used.get(p, 0.0) for p in tree)


def _hosts_cpu(cluster: SimCluster) -> float:
    return sum(_tree_cpu(h.unshare_pid) for h in cluster.state.hosts.values() if h.unshare_pid)


def timed(cluster: SimCluster, *argv: str, env: dict[str, str]) -> Timed:
    before_cli = resource.getrusage(resource.RUSAGE_CHILDREN)
    before_hosts = _hosts_cpu(cluster)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "sparkcluster", *argv], capture_output=True, text=True,
                         env={**os.environ, **env})
    wall = time.monotonic() - start
    after_cli = resource.getrusage(resource.RUSAGE_CHILDREN)
    cli = (after_cli.ru_utime - before_cli.ru_utime) + (after_cli.ru_stime - before_cli.ru_stime)
    note = ""
    if out.returncode != 0:
        try:
            note = json.loads(out.stdout)["verdict"]["cause"][:120]
        except (ValueError, KeyError, TypeError):
            note = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or ["?"])[-1][:120]
    return Timed(wall, cli, _hosts_cpu(cluster) - before_hosts, out.returncode, note)


HEADER = (f"{'topology':<14} {'nodes':>5} {'links':>5}  {'bootstrap s':>11} {'x pair':>6} {'CPU s/host':>10}  "
          f"{'verify s':>8} {'x pair':>6} {'CPU s/host':>10}  {'CLI CPU s (boot, verify)':>24}")


def row(label: str, count: int, links: int, boot: Timed, ver: Timed, pair: tuple[Timed, Timed]) -> str:
    return (f"{label:<14} {count:>5} {links:>5}  {boot.wall_s:>11.1f} {boot.wall_s / pair[0].wall_s:>6.2f} "
            f"{boot.host_cpu_s / count:>10.2f}  {ver.wall_s:>8.1f} {ver.wall_s / pair[1].wall_s:>6.2f} "
            f"{ver.host_cpu_s / count:>10.2f}  {boot.cli_cpu_s:>11.2f}, {ver.cli_cpu_s:>10.2f}")


def main() -> int:
    """Each topology's row as soon as it is measured (the pair first: the others' ratios are to it)."""
    pair: tuple[Timed, Timed] | None = None
    notes = []
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as config_dir:
        env = {"XDG_CONFIG_HOME": config_dir}
        for label, count, topology in TOPOLOGIES:
            cluster = SimCluster.up(UpOptions(count=count, name=f"bench-topo{count}{topology[0]}", docker=False,
                                              ssh_mesh=False, topology=topology))
            try:
                inventory = str(cluster.inventory_path)
                boot = timed(cluster, "bootstrap", inventory, "--runtime", "host", "--json", env=env)
                ver = timed(cluster, "verify", inventory, "--json", env=env)
                doc = subprocess.run([sys.executable, "-m", "sparkcluster", "topology", "-i", inventory, "--json"],
                                     capture_output=True, text=True, env={**os.environ, **env}).stdout
                links = len(json.loads(doc)["links"]) if doc.strip() else 0
            finally:
                cluster.down()
            pair = pair or (boot, ver)
            print(row(label, count, links, boot, ver, pair), flush=True)
            notes += [f"note: {label} {what} exited {t.code}: {t.note}" for what, t in (("bootstrap", boot),
                                                                                        ("verify", ver)) if t.code]
    print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
