"""Simulated-cluster benchmark: `sim up` time, and host-to-host throughput over the fabric vs the LAN.

Run as root:  .venv/bin/python benchmarks/sim_network.py [--json]
Every figure is measured in this run; the fabric/LAN ratio uses the LAN as the baseline.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402

RECEIVER = (
    "import socket; s=socket.create_server(('0.0.0.0', {port})); c,_=s.accept(); "
    "[0 for _ in iter(lambda: c.recv(1<<20), b'')]; c.sendall(b'k')"
)
SENDER = (
    "import socket,time; c=socket.create_connection(('{ip}', {port})); b=bytes(1<<20); t=time.monotonic(); "
    "[c.sendall(b) for _ in range({mb})]; c.shutdown(socket.SHUT_WR); c.recv(1); print(time.monotonic()-t)"
)


def ssh(cluster: SimCluster, host: str, command: str) -> str:
    return subprocess.run(cluster.ssh_argv(host) + [command], capture_output=True, text=True, check=True).stdout


def tcp_mb_per_s(cluster: SimCluster, dest: str, ip: str, mb: int, port: int) -> float:
    """One TCP stream from spark-2 to `dest`, timed inside the sender (no ssh set-up in the figure)."""
    ssh(cluster, dest, f"nohup python3 -c \"{RECEIVER.format(port=port)}\" >/dev/null 2>&1 </dev/null &")
    time.sleep(0.3)
    seconds = float(ssh(cluster, "spark-2", f"python3 -c \"{SENDER.format(ip=ip, port=port, mb=mb)}\""))
    return mb * 2**20 / seconds / 1e6


def ssh_mb_per_s(cluster: SimCluster, ip: str, mb: int) -> float:
    """A stream through OpenSSH between hosts, the way staging and `docker save | ssh docker load` travel
    (AES-GCM: the cheapest cipher on CPUs with AES instructions). Timed inside the sender, ssh set-up included."""
    pipeline = f"head -c {mb}M /dev/zero | ssh -c aes128-gcm@openssh.com -o BatchMode=yes {ip} cat >/dev/null"
    timer = f"import subprocess,time; t=time.monotonic(); subprocess.run({pipeline!r}, shell=True, check=True); " \
            "print(time.monotonic()-t)"
    seconds = float(ssh(cluster, "spark-2", f"python3 -c \"{timer}\""))
    return mb * 2**20 / seconds / 1e6


def time_up(count: int, name: str) -> float:
    start = time.monotonic()
    cluster = SimCluster.up(UpOptions(count=count, name=name))
    elapsed = time.monotonic() - start
    cluster.down()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, float] = {}
    for count in (2, 8):
        results[f"sim_up_{count}_hosts_s"] = time_up(count, f"bench-up{count}")
    cluster = SimCluster.up(UpOptions(count=2, name="bench-net"))
    try:
        head = cluster.host("spark-1")
        results["lan_tcp_MBps"] = tcp_mb_per_s(cluster, "spark-1", head.mgmt_ip, 48, 5301)
        results["fabric_tcp_MBps"] = tcp_mb_per_s(cluster, "spark-1", head.fabric_ips[0], 1024, 5302)
        results["lan_ssh_MBps"] = ssh_mb_per_s(cluster, head.mgmt_ip, 48)
        results["fabric_ssh_MBps"] = ssh_mb_per_s(cluster, head.fabric_ips[0], 1024)
    finally:
        cluster.down()
    results["fabric_over_lan_tcp"] = results["fabric_tcp_MBps"] / results["lan_tcp_MBps"]
    results["fabric_over_lan_ssh"] = results["fabric_ssh_MBps"] / results["lan_ssh_MBps"]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"sim up, 2 hosts with Docker:   {results['sim_up_2_hosts_s']:.2f} s")
    print(f"sim up, 8 hosts with Docker:   {results['sim_up_8_hosts_s']:.2f} s")
    print(f"TCP   fabric {results['fabric_tcp_MBps']:8.1f} MB/s   LAN {results['lan_tcp_MBps']:6.1f} MB/s   "
          f"ratio {results['fabric_over_lan_tcp']:.1f}x")
    print(f"SSH   fabric {results['fabric_ssh_MBps']:8.1f} MB/s   LAN {results['lan_ssh_MBps']:6.1f} MB/s   "
          f"ratio {results['fabric_over_lan_ssh']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
