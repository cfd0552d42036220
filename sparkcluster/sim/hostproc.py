"""One simulated host as a process tree: boot it, find its PID 1, power it off, run a command inside it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from ..engine.errors import SparkclusterError

BOOT_TIMEOUT_S = 30.0


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie awaiting its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _is_boot_process(pid: int, host_dir: Path) -> bool:
    """Guard against PID reuse: only touch an `unshare` that boots this very host."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, PermissionError):
        return False
    return cmdline[0].endswith(b"unshare") and f"SIM_HOST_DIR={host_dir}".encode() in environ


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def start(netns: str, boot_script: Path, env: dict[str, str], log: Path) -> int:
    """Start the host's boot in new mount/UTS/IPC/PID namespaces inside `netns`; returns the unshare PID.

    The process is detached (own session, stdin from /dev/null) so the cluster outlives this CLI."""
    argv = [
        "ip", "netns", "exec", netns,
        "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--propagation", "private",
        "--", "/bin/sh", str(boot_script),
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env}, stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    # `ip netns exec` execs unshare, so the PID we hold is the unshare process itself.
    return proc.pid


def wait_ready(unshare_pid: int, address: str, log: Path, name: str, timeout: float = BOOT_TIMEOUT_S) -> int:
    """Wait until the host's sshd greets on port 22; returns the host's PID 1 (as seen from here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(unshare_pid)
        if not _alive(unshare_pid):
            raise SparkclusterError(
                f"simulated host {name} failed to boot:\n{tail(log)}",
                "see the boot log above; `sparkcluster sim down` removes what was created",
            )
        if _ssh_greets(address):
            kids = children(unshare_pid)
            if kids:
                return kids[0]
        time.sleep(0.02)
    raise SparkclusterError(f"simulated host {name} did not answer on {address}:22 within {timeout:.0f} s:\n{tail(log)}")


def _ssh_greets(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5) as s:
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _reap(pid: int) -> None:
    """Collect the exit status of a host we started ourselves, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def power_off(unshare_pid: int, host_dir: Path, timeout: float = 10.0) -> None:
    """Hard power-off: SIGTERM the host's PID 1; the kernel then kills every process of its PID namespace.

    `unshare --fork` ignores SIGTERM itself, so signal its child; SIGKILL (which --kill-child forwards to
    PID 1) only if that did not work in time."""
    if not unshare_pid or not _alive(unshare_pid) or not _is_boot_process(unshare_pid, host_dir):
        return
    for child in children(unshare_pid):
        os.kill(child, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(unshare_pid)
        if not _alive(unshare_pid):
            return
        time.sleep(0.01)
    os.kill(unshare_pid, signal.SIGKILL)
    while _alive(unshare_pid):
        _reap(unshare_pid)
        time.sleep(0.01)


def exec_in(pid1: int, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """Run a command as root inside a simulated host (all its namespaces, its own root), without SSH."""
    return subprocess.run(["nsenter", "--target", str(pid1), "--all", "--", *argv], **kwargs)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
