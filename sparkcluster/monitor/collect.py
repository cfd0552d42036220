"""What a node's exporter reads, on the node, on each scrape: the same readings sparkcluster's other wings take
over SSH (node/gputelemetry.py's nvidia-smi query, node/kernellog.py's reader, /proc/meminfo as doctor reads it,
sysfs's QSFP twins, the HF cache's disk, the last verify's record, the supervisor's files), run here locally and
parsed by the same parsers. Rendered by nodemetrics.py.

The kernel log is read at most once a KERNEL_LOG_EVERY_S (journalctl over a boot's journal is the one costly
reading; sparkDash scans it every 60 s too): a new Xid shows within that plus a scrape interval. Everything else
is read fresh per scrape. A reading that fails is that reading's absence, never the scrape's failure.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..engine.facts import parse_speeds
from ..nccl.lastverify import LAST_VERIFY_PATH
from ..node import gputelemetry
from ..node.health import parse_meminfo
from ..node.kernellog import KERNEL_LOG_SCRIPT, KernelLog, parse_kernel_log
from . import nodemetrics, qsfp, supervisorfiles
from .exposition import Family

KERNEL_LOG_EVERY_S = 60.0
KERNEL_LOG_DEADLINE_S = 45.0  # the script gives each reader 10 s, four of them at worst
MAX_RECORD_BYTES = 1 << 20
ETHTOOL_DEADLINE_S = 10.0


def ethtool_script(twins: list[qsfp.QsfpTwin]) -> str:
    """The facts probe's `speeds` lines (`<netdev> <ethtool speed or -> <sysfs speed or ->`) for these twins: one
    ethtool per up twin, as the probe runs it, so the exporter's speed is the one bootstrap and doctor judge."""
    lines = []
    for twin in twins:
        sysfs = twin.speed_mbps if twin.speed_mbps is not None else "-"
        lines.append(f"out=$(timeout 5 ethtool {shlex.quote(twin.netdev)} 2>/dev/null); s=; case $out in "
                     f"*\"Speed: \"*) s=${{out#*Speed: }}; s=${{s%%[[:space:]]*}} ;; esac; "
                     f"echo \"{twin.netdev} ${{s:--}} {sysfs}\"")
    return "PATH=\"$PATH:/usr/sbin:/sbin\"\n" + "\n".join(lines)


def run_shell(script: str, timeout: float) -> str:
    """A reader's shell line, run here as the transport would run it there; its stdout, or "" on a timeout."""
    try:
        done = subprocess.run(["sh", "-c", script], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              check=False)
    except (subprocess.TimeoutExpired, OSError):
        return ""
    return done.stdout.decode("utf-8", errors="replace")


def hf_cache_root(env: dict[str, str] | None = None) -> Path:
    """engine/remote.py's HF_HOME, as this node's shell would expand it."""
    env = dict(os.environ) if env is None else env
    return Path(env.get("HF_HOME") or Path(env.get("HOME", str(Path.home()))) / ".cache/huggingface")


def disk_of(path: Path) -> tuple[int | None, int | None]:
    """(free bytes for an unprivileged user, filesystem size) of the nearest existing folder of `path`."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def read_verify(path: Path) -> tuple[dict[str, Any] | None, float | None]:
    try:
        text = path.read_text(errors="replace")[:MAX_RECORD_BYTES]
        doc = json.loads(text)
    except (OSError, json.JSONDecodeError):
        return None, None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        return None, None
    return doc, supervisorfiles.epoch_seconds(doc.get("at"))


@dataclass
class Sources:
    """Where the readings come from: the node's own by default; tests and benchmarks point them at fixtures."""

    home: Path = field(default_factory=Path.home)
    sys_root: Path = field(default_factory=qsfp.sys_root_from_env)
    meminfo: Path = field(default_factory=lambda: qsfp.root_from_env("SPARKCLUSTER_PROC_ROOT", "/proc") / "meminfo")
    shell: Callable[[str, float], str] = run_shell

    def expand(self, path: str) -> Path:
        return self.home / path[2:] if path.startswith("~/") else Path(path)


@dataclass
class Collector:
    """One per exporter: keeps the kernel log between its readings, and how long each part took."""

    sources: Sources = field(default_factory=Sources)
    kernel_every_s: float = KERNEL_LOG_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _kernel: KernelLog | None = None
    _kernel_at: float | None = None
    durations: dict[str, float] = field(default_factory=dict)

    def node(self) -> list[Family]:
        """Everything but the supervisor's, which the head alone keeps (supervisor())."""
        out: list[Family] = []
        for part, read in (("gpu", self._gpu), ("memory", self._memory), ("kernel_log", self._kernel_log),
                           ("qsfp", self._qsfp), ("hf_cache", self._hf_cache), ("verify", self._verify)):
            started = time.perf_counter()
            out += read()
            self.durations[part] = time.perf_counter() - started
        return out + [self._timings()]

    def supervisor(self) -> list[Family]:
        return nodemetrics.supervisor_families(supervisorfiles.read(self.sources.home))

    def _gpu(self) -> list[Family]:
        command = gputelemetry.telemetry_command()
        return nodemetrics.gpu_families(gputelemetry.parse_output(self.sources.shell(command.script, command.timeout)))

    def _memory(self) -> list[Family]:
        try:
            lines = self.sources.meminfo.read_text().splitlines()
        except OSError:
            lines = []
        return nodemetrics.memory_families(parse_meminfo(lines))

    def _kernel_log(self) -> list[Family]:
        now = self.clock()
        if self._kernel_at is None or now - self._kernel_at >= self.kernel_every_s:
            text = self.sources.shell(KERNEL_LOG_SCRIPT, KERNEL_LOG_DEADLINE_S)
            self._kernel = parse_kernel_log(text.splitlines()) if text.strip() else None
            self._kernel_at = now
        return nodemetrics.kernel_families(self._kernel)

    def _qsfp(self) -> list[Family]:
        twins = qsfp.read_twins(self.sources.sys_root)
        up = [t for t in twins if t.up]
        if up:  # the speed as the facts probe reads it: ethtool's where it answers, else sysfs (engine/facts.py)
            speeds = parse_speeds(self.sources.shell(ethtool_script(up), ETHTOOL_DEADLINE_S).splitlines())
            twins = [replace(t, speed_mbps=speeds[t.netdev]) if speeds.get(t.netdev) else t for t in twins]
        return nodemetrics.qsfp_families(twins)

    def _hf_cache(self) -> list[Family]:
        env = {**os.environ, "HOME": str(self.sources.home)}
        return nodemetrics.hf_cache_families(*disk_of(hf_cache_root(env)))

    def _verify(self) -> list[Family]:
        return nodemetrics.verify_families(*read_verify(self.sources.expand(LAST_VERIFY_PATH)))

    def _timings(self) -> Family:
        family = Family("sparkcluster_exporter_read_seconds", "how long each reading of this scrape took")
        for part, seconds in self.durations.items():
            family.add(round(seconds, 6), part=part)
        return family
