"""A QSFP twin made slow for small messages where the kernel has no netem (CONFIG_NET_SCH_NETEM unset, as on the
Firecracker kernels the tests run on): iptables hands the twin's packets, both ways, to an NFQUEUE inside the host's
network namespace, and a small daemon (delayd.py) lets each one through `delay` after it arrived. The rules use
--queue-bypass: with no daemon listening, packets pass undelayed rather than being dropped. `sim degrade --delay`
starts it, `--clear` and `sim down` stop it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..engine.errors import SparkclusterError
from .delayd import READY


def queue_of(netdev: str) -> int:
    """One queue per twin of a host (each host is its own network namespace)."""
    return 100 + sum(netdev.encode()) % 800


def rules(netdev: str, action: str) -> list[list[str]]:
    """iptables argv adding (-A) or deleting (-D) the hand-over of the twin's packets, out of and into the host."""
    target = ["-j", "NFQUEUE", "--queue-num", str(queue_of(netdev)), "--queue-bypass"]
    return [["iptables", "-w", "-t", "mangle", action, "OUTPUT", "-o", netdev, *target],
            ["iptables", "-w", "-t", "mangle", action, "PREROUTING", "-i", netdev, *target]]


def pid_file(cluster_dir: Path, netns: str, netdev: str) -> Path:
    return cluster_dir / "delays" / f"{netns}-{netdev}.pid"


def start(cluster_dir: Path, netns: str, netdev: str, delay_s: float, timeout: float = 10.0) -> None:
    """The daemon in the host's namespace (detached, its pid kept beside the cluster), then the rules."""
    stop(cluster_dir, netns, netdev)
    pid_path = pid_file(cluster_dir, netns, netdev)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    log = pid_path.with_suffix(".log")
    with open(log, "w") as out:
        daemon = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-m", "sparkcluster.sim.delayd",
                                   "--queue", str(queue_of(netdev)), "--delay-us", str(round(delay_s * 1e6))],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    pid_path.write_text(str(daemon.pid))
    deadline = time.monotonic() + timeout
    while READY not in log.read_text():
        if daemon.poll() is not None or time.monotonic() > deadline:
            stop(cluster_dir, netns, netdev)
            raise SparkclusterError(f"the delay daemon for {netdev} in {netns} did not start: {log.read_text()[-400:]}",
                                    "the kernel needs NFQUEUE (CONFIG_NETFILTER_NETLINK_QUEUE) where it has no netem")
        time.sleep(0.05)
    for argv in rules(netdev, "-A"):
        subprocess.run(["ip", "netns", "exec", netns, *argv], check=True, capture_output=True)


def stop(cluster_dir: Path, netns: str, netdev: str) -> bool:
    """The rules out, then the daemon; False where none ran."""
    pid_path = pid_file(cluster_dir, netns, netdev)
    if not pid_path.exists():
        return False
    for argv in rules(netdev, "-D"):
        subprocess.run(["ip", "netns", "exec", netns, *argv], capture_output=True)  # gone with its namespace
    _kill(int(pid_path.read_text()))
    pid_path.unlink()
    return True


def stop_all(cluster_dir: Path) -> None:
    """Every daemon of the cluster (`sim down`: the namespaces go with it, and their rules)."""
    for pid_path in (cluster_dir / "delays").glob("*.pid"):
        _kill(int(pid_path.read_text()))
        pid_path.unlink()


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)  # its own session: `ip netns exec` and the python it became
    except ProcessLookupError:
        return
    for _ in range(50):
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # started by another sparkcluster process: not ours to reap
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.02)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
