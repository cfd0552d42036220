"""Staging benchmark on a simulated 8-Spark cluster with a generated 1 GiB model, all figures from one run:

(a) staging to one worker vs a raw ssh stream between the same two hosts (same cipher)  goal >= 0.8
(b) staging to 7 workers vs to 1 (the pipelined chain)                                   goal <= 1.5
(c) staging over the fabric vs the same copy forced over the LAN                         goal >= 10x

Run as root:  .venv/bin/python benchmarks/staging_throughput.py [--size-mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402
from sparkcluster.sim.fakemodel import generate  # noqa: E402

MODEL = "acme/bench"


def cli(cluster: SimCluster, *args: str, env: dict | None = None) -> float:
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "sparkcluster", *args], capture_output=True, text=True,
                            env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise SystemExit(f"sparkcluster {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    return time.monotonic() - start


def stage(cluster: SimCluster, *args: str) -> tuple[float, float]:
    """(wall seconds of the CLI, seconds of the copy phase alone as the CLI reports it)."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "sparkcluster", "stage", MODEL, "-i", str(cluster.inventory_path),
                          "--json", *args], check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - start
    copy = max(r["seconds"] for r in json.loads(out)["nodes"].values())
    return wall, copy


def ssh(cluster: SimCluster, host: str, command: str) -> str:
    return subprocess.run(cluster.ssh_argv(host) + [command], check=True, capture_output=True, text=True).stdout


def drop(cluster: SimCluster, hosts: list[str]) -> None:
    for h in hosts:
        ssh(cluster, h, "rm -rf ~/.cache/huggingface/hub/models--acme--bench")


def raw_stream_seconds(cluster: SimCluster, size_mib: int) -> float:
    peer = cluster.host("spark-2").fabric_ips[0]
    pipeline = f"head -c {size_mib}M /dev/zero | ssh -c aes128-gcm@openssh.com -o Compression=no {peer} cat >/dev/null"
    timer = (f"import subprocess,time; t=time.monotonic(); subprocess.run({pipeline!r}, shell=True, check=True); "
             "print(time.monotonic()-t)")
    return float(ssh(cluster, "spark-1", f"python3 -c \"{timer}\""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    size = args.size_mib * 2**20
    cluster = SimCluster.up(UpOptions(count=8, name="bench-stage", ssh_mesh=False))
    try:
        with tempfile.TemporaryDirectory() as cfg:
            inv = str(cluster.inventory_path)
            cli(cluster, "bootstrap", inv, env={"XDG_CONFIG_HOME": cfg})
            generate(cluster, "spark-1", MODEL, size, shards=5)
            others = [f"spark-{i}" for i in range(2, 9)]
            pair = ["--limit", "spark-1,spark-2"]
            raw = raw_stream_seconds(cluster, args.size_mib)
            one, one_copy = stage(cluster, *pair)
            drop(cluster, ["spark-2"])
            # The mesh records fabric addresses only (that is the point); for this one measurement the head
            # must also know spark-2's LAN address.
            subprocess.run(cluster.ssh_argv("spark-1") + ["cat >> ~/.ssh/known_hosts"], check=True,
                           input=cluster.known_hosts.read_bytes())
            lan, lan_copy = stage(cluster, *pair, "--over-lan")
            drop(cluster, ["spark-2"])
            seven, seven_copy = stage(cluster)
            drop(cluster, others)
    finally:
        cluster.down()
    mb = size / 1e6
    print(f"model {mb:.0f} MB; raw ssh stream spark-1 -> spark-2: {raw:.2f} s ({mb / raw:.0f} MB/s)")
    print("wall = the whole CLI run (start, facts, scan, copy, links); copy = the copy phase it reports")
    print(f"(a) stage to 1 worker: wall {one:.2f} s, copy {one_copy:.2f} s ({mb / one_copy:.0f} MB/s); "
          f"staging / raw stream = {raw / one:.2f} wall, {raw / one_copy:.2f} copy (goal >= 0.8)")
    print(f"(b) stage to 7 workers: wall {seven:.2f} s, copy {seven_copy:.2f} s; 7 workers / 1 worker = "
          f"{seven / one:.2f}x wall, {seven_copy / one_copy:.2f}x copy (goal <= 1.5)")
    print(f"(c) stage over the LAN: wall {lan:.2f} s, copy {lan_copy:.2f} s; fabric is {lan / one:.1f}x faster wall, "
          f"{lan_copy / one_copy:.1f}x copy (goal >= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
