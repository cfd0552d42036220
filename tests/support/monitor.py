"""A node as the exporter reads it, made of files: a sysfs tree with two QSFP twins lit and two dark (each with
its RDMA device and counters), /proc/meminfo with CMA, a home with the last verify and the supervisor's files,
and a shell that answers the GPU query and the kernel-log reader with captured outputs (tests/fixtures)."""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from sparkcluster.monitor.collect import Collector, Sources
from sparkcluster.serving.incidents import SUPERVISOR_DIR

FIXTURES = Path(__file__).parents[1] / "fixtures"
GPU_IDLE = (FIXTURES / "gpu" / "gb10-idle.csv").read_text()
GPU_HOT = (FIXTURES / "gpu" / "gb10-hw-thermal.csv").read_text()
KERNEL_JOURNAL = (FIXTURES / "doctor" / "kernel-log-journal.txt").read_text()

MEMINFO = """MemTotal:       125513484 kB
MemFree:        100000000 kB
MemAvailable:   110000000 kB
CmaTotal:          65536 kB
CmaFree:           32768 kB
"""
TWINS = {  # netdev: (hca, operstate, speed, carrier_up_count)
    "enp1s0f1np1": ("rocep1s0f1", "up", "200000", "1"),
    "enP2p1s0f1np1": ("roceP2p1s0f1", "up", "200000", "1"),
    "enp1s0f0np0": ("rocep1s0f0", "down", "-1", "0"),
    "enP2p1s0f0np0": ("roceP2p1s0f0", "down", "-1", "0"),
}
VERIFY = {"status": "PASS", "cause": "", "backend": "nccl", "busbw_gbps": 21.4, "size_bytes": 1 << 30,
          "links": {"spark-1:enp1s0f1np1 <-> spark-2:enp1s0f1np1": 11.2},
          "latency_us": {"8192": 35.5, "131072": 60.0},
          "links_latency_us": {"spark-1:enp1s0f1np1 <-> spark-2:enp1s0f1np1": {"8192": 40.0}},
          "at": "2026-11-30T10:00:00+00:00"}
SECRET = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def kernel_script_output(journal: str) -> str:
    """What KERNEL_LOG_SCRIPT prints for a journal: `source`, a `line` per worthy line, `read N`."""
    lines = journal.splitlines()
    worthy = [f"line {line}" for line in lines if any(w in line for w in ("NVRM", "mlx5", "AER:", "Out of memory"))]
    return "\n".join(["source journalctl", *worthy, f"read {len(lines)}", "previous unreadable"]) + "\n"


def build_sysfs(root: Path, twins: dict[str, tuple[str, str, str, str]] = TWINS,
                counters: dict[str, int] | None = None) -> None:
    counters = counters if counters is not None else {
        "port_xmit_data": 1000, "port_rcv_data": 2000, "port_xmit_packets": 10, "port_rcv_packets": 20,
        "port_rcv_errors": 0, "port_xmit_discards": 0, "out_of_buffer": 0, "np_cnp_sent": 3}
    for netdev, (hca, state, speed, ups) in twins.items():
        write_file(root / "class/net" / netdev / "operstate", state + "\n")
        write_file(root / "class/net" / netdev / "speed", speed + "\n")
        write_file(root / "class/net" / netdev / "carrier_up_count", ups + "\n")
        (root / "class/infiniband" / hca / "device/net" / netdev).mkdir(parents=True, exist_ok=True)
        for name, value in counters.items():
            folder = "hw_counters" if name in ("out_of_buffer", "np_cnp_sent") else "counters"
            write_file(root / "class/infiniband" / hca / "ports/1" / folder / name, f"{value}\n")
    write_file(root / "class/net/lo/operstate", "unknown\n")  # not a twin


@dataclass
class FakeNode:
    """A node of files; `gpu` and `journal` are what its nvidia-smi and kernel log say now."""

    root: Path
    gpu: str = GPU_IDLE
    gpu_rc: int = 0
    journal: str = KERNEL_JOURNAL
    ethtool: dict[str, str] = field(default_factory=dict)  # netdev -> the Speed ethtool prints (200000Mb/s)
    shell_calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        build_sysfs(self.root / "sys")
        write_file(self.root / "meminfo", MEMINFO)
        write_file(self.home / ".config/sparkcluster/last-verify.json", json.dumps(VERIFY))

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def supervisor_dir(self) -> Path:
        return self.home / SUPERVISOR_DIR

    def shell(self, script: str, timeout: float) -> str:
        self.shell_calls.append(script)
        if "nvidia-smi" in script and "journalctl" not in script:
            return f"{self.gpu.strip()}\nrc={self.gpu_rc}\n"
        if "journalctl" in script:
            return kernel_script_output(self.journal)
        if "ethtool" in script:  # what the facts probe's speeds lines say: ethtool's figure, then sysfs'
            return "".join(f"{netdev} {self.ethtool.get(netdev, '-')} {sysfs}\n"
                           for netdev, sysfs in re.findall(r'echo "(\S+) \$\{s:--\} (\S+)"', script))
        return ""

    def sources(self) -> Sources:
        return Sources(home=self.home, sys_root=self.root / "sys", meminfo=self.root / "meminfo", shell=self.shell)

    def collector(self, clock: list[float] | None = None) -> Collector:
        now = clock if clock is not None else [0.0]
        return Collector(self.sources(), clock=lambda: now[0])

    def supervisor(self, state: str = "watching", events: list[dict[str, object]] | None = None) -> None:
        write_file(self.supervisor_dir / "state.json", json.dumps(
            {"version": 1, "state": state, "since": "2026-12-01T10:00:00Z", "restarts_last_hour": 1,
             "reason": f"token {SECRET} in a log line"}))
        write_file(self.supervisor_dir / "events.jsonl", "".join(json.dumps(e) + "\n" for e in events or []))


def incident(target: str = "replica 2", seen: str = "wedged", action: str = "restart", outcome: str = "recovered",
             detected_s: float = 71.2, recovered_s: float | None = 95.0) -> dict[str, object]:
    return {"version": 1, "at": "2026-12-01T10:05:00Z", "target": target, "seen": seen, "action": action,
            "outcome": outcome, "detected_s": detected_s, "recovered_s": recovered_s,
            "root_cause": f"HF_TOKEN={SECRET}", "text": f"replica 2 wedged; {SECRET}"}


VLLM = (FIXTURES / "metrics" / "vllm-0.32-cpu-busy2.txt").read_text()
RAY_NAMED = "ray_vllm_kv_offload_load_bytes_total"  # its name from RayPrometheusStatLogger
COUNTER = re.compile(r"^(vllm:\S+_total(?:\{[^}]*\})?) (\S+)$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RisingVllm(BaseHTTPRequestHandler):
    """A serving vLLM's /metrics: a real 0.32 capture whose counters grow with each scrape."""

    scrapes = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        RisingVllm.scrapes += 1
        n = RisingVllm.scrapes
        # and one figure under the name Ray's stat logger gives it (vLLM's `vllm:` sanitised, `ray_` before it)
        body = (COUNTER.sub(lambda m: f"{m[1]} {float(m[2]) * n + n}", VLLM)
                + f"# TYPE {RAY_NAMED} counter\n{RAY_NAMED}{{model_name=\"local/tiny-llama\"}} {n}\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass
