"""One node's live view for `top`: GPU utilisation and memory, its telemetry (temperature, power, clocks, throttle
reasons: node/gputelemetry.py), the serving processes. One read-only shell line per node per sample, over the
connection the session already holds.

A probe never leaks processes on a node: the whole line runs under its own deadline there (`timeout`, inside the
transport's), and nvidia-smi, which hangs with a wedged GPU driver, runs under a lock that its hung process keeps
holding: while one still runs, later probes skip the GPU query and say so instead of starting another. Each
section marker carries a nonce drawn for the probe, so nothing a node prints (random bytes from a broken
nvidia-smi) can open a section of its own.

On the GB10 the GPU has no memory of its own: nvidia-smi reports memory as "[N/A]" in queries ("Not Supported"
in its table), so the figure shown is the node's unified memory in use (MemTotal - MemAvailable), and says so.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..engine.command import Command
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import Unreachable
from ..node.gputelemetry import (
    TELEMETRY_FIELDS,
    TELEMETRY_FORMAT,
    GpuTelemetry,
    failure_words,
    from_values,
    parse_number,
)

PROBE_TIMEOUT_S = 10.0  # the transport's bound on one probe
NODE_DEADLINE_S = 8  # the probe's own deadline on the node: it ends there before the transport gives up
GPU_DEADLINE_S = 5  # nvidia-smi's, inside it
GPU_OUTPUT_LIMIT = 65536  # a broken nvidia-smi's flood is cut here
GPU_BUSY_RC = 75  # the lock is held: the last probe's nvidia-smi still runs
GPU_FIELDS = ("utilization.gpu", "memory.used", "memory.total", *TELEMETRY_FIELDS)
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format={TELEMETRY_FORMAT}"


class MemorySource(StrEnum):
    GPU = "gpu"  # the GPU's own memory, from nvidia-smi
    UNIFIED = "unified"  # the node's memory, which the GPU shares (GB10)


@dataclass(frozen=True)
class NodeSample:
    name: str
    answered: bool = True
    error: str | None = None  # why the node gave no sample (unreachable, timed out)
    gpu_util_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_source: MemorySource | None = None
    gpu_error: str | None = None  # nvidia-smi failed (driver gone, not installed)
    gpu: GpuTelemetry | None = None  # temperature, power, clocks, throttle reasons (None: nvidia-smi failed)
    processes: dict[str, bool] = field(default_factory=dict)  # role (main, vllm) -> running

    def to_json(self) -> dict[str, Any]:
        if not self.answered:
            return {"answered": False, "error": self.error}
        return {"answered": True, "gpu_util_pct": self.gpu_util_pct, "memory_used_bytes": self.memory_used_bytes,
                "memory_total_bytes": self.memory_total_bytes,
                "memory_source": None if self.memory_source is None else str(self.memory_source),
                "gpu_error": self.gpu_error, "gpu": None if self.gpu is None else self.gpu.to_json(),
                "processes": {role: "running" if up else "stopped" for role, up in self.processes.items()}}


# A node's serving processes to look for: role (main, vllm) -> a shell test that succeeds while it runs. The
# serving wing knows the roles and how its runtime answers; this wing only runs the tests.
AliveChecks = Mapping[str, str]


def new_nonce() -> str:
    return secrets.token_hex(8)


def probe_command(checks: AliveChecks, nonce: str) -> Command:
    """Sections the parser reads back, each opened by `@NONCE:name`: gpu (nvidia-smi's output, cut and without
    NULs, then its exit code as `@NONCE:rc=N`), mem (/proc/meminfo), one per role."""
    mark = f"@{nonce}:"
    gpu = (f"echo {mark}gpu; s=$(mktemp) || exit 1; d=\"${{XDG_CACHE_HOME:-$HOME/.cache}}/sparkcluster\"; "
           "mkdir -p \"$d\"; "
           f"{{ flock -n -E {GPU_BUSY_RC} \"$d/top-gpu.lock\" timeout -k 1 {GPU_DEADLINE_S} {GPU_QUERY} 2>&1; "
           f"echo $? > \"$s\"; }} | head -c {GPU_OUTPUT_LIMIT} | tr -d '\\000'; echo; "
           f"echo \"{mark}rc=$(cat \"$s\")\"; rm -f \"$s\"")
    parts = ["umask 077", gpu, f"echo {mark}mem; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"]
    for role, alive in checks.items():
        parts.append(f"echo {mark}{role}; if {alive}; then echo running; else echo stopped; fi")
    line = "; ".join(parts)
    return Command(f"timeout -k 1 {NODE_DEADLINE_S} sh -c {shlex.quote(line)}", timeout=PROBE_TIMEOUT_S)


def parse_probe(name: str, text: str, nonce: str, roles: Collection[str] = ()) -> NodeSample:
    """A node's answer: only lines opening with the probe's own marker start a section, and only the roles asked
    for become processes."""
    mark = f"@{nonce}:"
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(mark) and line[len(mark):].startswith("rc="):
            sections.setdefault("gpu", []).append(line[len(mark):].strip())
        elif line.startswith(mark):
            current = sections.setdefault(line[len(mark):].strip(), [])
        elif current is not None:
            current.append(line.strip())
    util, gpu_used, gpu_total, gpu_error, telemetry = _gpu(sections.get("gpu", []))
    mem = dict(_meminfo(line) for line in sections.get("mem", []) if ":" in line)
    used, total, source = None, None, None
    if gpu_used is not None and gpu_total is not None:
        used, total, source = gpu_used, gpu_total, MemorySource.GPU
    elif mem.get("MemTotal") is not None and mem.get("MemAvailable") is not None:
        total_kib, available_kib = mem["MemTotal"] or 0, mem["MemAvailable"] or 0
        used, total, source = (total_kib - available_kib) * 1024, total_kib * 1024, MemorySource.UNIFIED
    processes = {role: sections.get(role, [])[:1] == ["running"] for role in roles}
    return NodeSample(name, gpu_util_pct=util, memory_used_bytes=used, memory_total_bytes=total,
                      memory_source=source, gpu_error=gpu_error, gpu=telemetry, processes=processes)


def _gpu(lines: list[str]) -> tuple[float | None, int | None, int | None, str | None, GpuTelemetry | None]:
    """(utilisation %, used bytes, total bytes, error, telemetry) from the query's row and exit code."""
    rc = next((line[3:] for line in reversed(lines) if line.startswith("rc=")), "")
    rows = [line for line in lines if line and not line.startswith("rc=")]
    if rc == str(GPU_BUSY_RC):
        return None, None, None, "the last nvidia-smi on this node still runs (a hung GPU driver?): not asked again", None
    if rc in ("124", "137"):
        return None, None, None, f"nvidia-smi gave no answer within {GPU_DEADLINE_S} s (stopped)", None
    if rc != "0" or not rows:
        return None, None, None, failure_words(rows, rc), None
    words = [w.strip() for w in rows[0].split(",")]
    if len(words) != len(GPU_FIELDS):
        return None, None, None, f"nvidia-smi printed {rows[0][:100]!r}", None
    util, used, total = (parse_number(w) for w in words[:3])
    mib = 1024 * 1024
    return (util, None if used is None else int(used * mib), None if total is None else int(total * mib), None,
            from_values(dict(zip(GPU_FIELDS, words))))


def _meminfo(line: str) -> tuple[str, int | None]:
    key, _, rest = line.partition(":")
    words = rest.split()
    return key.strip(), int(words[0]) if words and words[0].isdigit() else None


class NodeSampler:
    """Samples every node in parallel, each within PROBE_TIMEOUT_S: a node that takes longer (a dead link while
    SSH retries its connection) is shown as not answering, and is not asked again until its last probe ends, so
    one dead node never stalls the view of the others."""

    def __init__(self, session: Session, checks: Callable[[Host], AliveChecks]) -> None:
        self.session, self.checks = session, checks
        self.pool = ThreadPoolExecutor(max_workers=max(1, len(session.hosts)), thread_name_prefix="top-probe")
        self.in_flight: dict[str, Future[NodeSample]] = {}

    def sample(self) -> list[NodeSample]:
        for host in self.session.hosts:
            if host.name not in self.in_flight:
                self.in_flight[host.name] = self.pool.submit(self._one, host)
        wait(list(self.in_flight.values()), timeout=PROBE_TIMEOUT_S + 1)
        out = []
        for host in self.session.hosts:
            future = self.in_flight[host.name]
            if future.done():
                del self.in_flight[host.name]
                out.append(future.result())
            else:
                out.append(NodeSample(host.name, answered=False, error=f"no answer within {PROBE_TIMEOUT_S:.0f} s"))
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _one(self, host: Host) -> NodeSample:
        checks, nonce = self.checks(host), new_nonce()
        command = probe_command(checks, nonce)
        try:
            result = self.session.run(host, command)
        except Unreachable as e:
            self._reconnect_later(host)
            return NodeSample(host.name, answered=False, error=e.message)
        except Exception as e:  # noqa: BLE001 - a live view shows any failure of one node as that node's state
            self._reconnect_later(host)
            return NodeSample(host.name, answered=False, error=f"{type(e).__name__}: {e}"[:200])
        if result.exit_code == -1:
            self._reconnect_later(host)
            return NodeSample(host.name, answered=False, error=f"no answer within {PROBE_TIMEOUT_S:.0f} s")
        return parse_probe(host.name, result.stdout, nonce, list(checks))

    def _reconnect_later(self, host: Host) -> None:
        """Forget the connection, so that the next sample connects anew (the node may come back)."""
        try:
            self.session.transport(host).reconnect()
        except Exception:  # noqa: BLE001 - closing a dead connection may fail in any way; nothing is lost
            pass
