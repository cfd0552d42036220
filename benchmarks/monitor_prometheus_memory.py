"""Prometheus' memory for an 8-node cluster as `monitor up` configures it: 8 node exporters (the real exporter, each
reading a node made of files: a captured GB10 nvidia-smi row, four QSFP twins with RoCE counters, meminfo with CMA,
a captured kernel log, the last verify) and 8 vLLM engines (a real vLLM 0.32 /metrics capture whose counters rise),
with the supervisor's job and sparkcluster's rules, against the same Prometheus with no target (the baseline of this
run). Reports the series in its head block and its resident memory after --seconds of scraping.

Run:  .venv/bin/python benchmarks/monitor_prometheus_memory.py [--seconds 120] [--interval 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster.monitor.config import prometheus_config  # noqa: E402
from sparkcluster.monitor.packaged import rule_paths  # noqa: E402
from sparkcluster.monitor.targets import Target, Targets  # noqa: E402
from tests.support.monitor import (  # noqa: E402
    GPU_HOT,
    KERNEL_JOURNAL,
    MEMINFO,
    VERIFY,
    RisingVllm,
    build_sysfs,
    free_port,
    write_file,
)

NODES = 8


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def fake_node(root: Path) -> dict[str, str]:
    write_file(root / "bin/nvidia-smi", f"#!/bin/sh\necho '{GPU_HOT.strip()}'\n")
    write_file(root / "journal.txt", KERNEL_JOURNAL)
    write_file(root / "bin/journalctl", f"#!/bin/sh\ncase \"$*\" in *'-b -1'*) exit 1 ;; esac\ncat {root}/journal.txt\n")
    for tool in ("nvidia-smi", "journalctl"):
        (root / "bin" / tool).chmod(0o755)
    build_sysfs(root / "sys")
    write_file(root / "proc/meminfo", MEMINFO)
    write_file(root / "home/.config/sparkcluster/last-verify.json", json.dumps(VERIFY))
    return {**os.environ, "HOME": str(root / "home"), "PATH": f"{root}/bin:{os.environ['PATH']}",
            "SPARKCLUSTER_SYS_ROOT": str(root / "sys"), "SPARKCLUSTER_PROC_ROOT": str(root / "proc"),
            "PYTHONPATH": str(ROOT)}


def prometheus(work: Path, config: str, seconds: float) -> tuple[int, float]:
    """(resident bytes, head series) of a Prometheus run on `config` for `seconds`."""
    (work / "rules").mkdir(parents=True)
    for path in rule_paths():
        shutil.copy(path, work / "rules" / path.name)
    (work / "prometheus.yml").write_text(config)
    listen = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(["prometheus", f"--config.file={work}/prometheus.yml", f"--storage.tsdb.path={work}/data",
                             f"--web.listen-address={listen}"], stderr=subprocess.DEVNULL)
    try:
        time.sleep(seconds)
        doc = json.loads(urllib.request.urlopen(f"http://{listen}/api/v1/status/tsdb", timeout=10).read())
        series = float(doc["data"]["headStats"]["numSeries"])
        return rss_bytes(proc.pid), series
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--interval", type=int, default=5)
    args = parser.parse_args()
    if shutil.which("prometheus") is None:
        print("prometheus is not installed (apt-get install prometheus)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exporters, servers, nodes, engines = [], [], [], []
        try:
            for i in range(NODES):
                port = free_port()
                exporters.append(subprocess.Popen(
                    [sys.executable, "-m", "sparkcluster.monitor.exporter", "--port", str(port)],
                    env=fake_node(work / f"node{i}")))
                nodes.append(Target("sparkcluster-node", f"127.0.0.1:{port}", (("node", f"spark-{i + 1}"),)))
                server = ThreadingHTTPServer(("127.0.0.1", 0), RisingVllm)
                threading.Thread(target=server.serve_forever, daemon=True).start()
                servers.append(server)
                engines.append(Target("vllm", f"127.0.0.1:{server.server_address[1]}",
                                      (("node", f"spark-{i + 1}"), ("replica", f"replica {i}"), ("model", "m"))))
            rules = [f"rules/{p.name}" for p in rule_paths()]
            full = prometheus_config(Targets(tuple(nodes), tuple(engines), supervisor=Target(
                "sparkcluster-supervisor", nodes[0].address, (("node", "spark-1"),), "/supervisor")), rules,
                args.interval)
            empty = prometheus_config(Targets(()), rules, args.interval)
            base_rss, base_series = prometheus(work / "empty", empty, args.seconds)
            rss, series = prometheus(work / "full", full, args.seconds)
        finally:
            for proc in exporters:
                proc.terminate()
            for server in servers:
                server.shutdown()
    print(f"Prometheus, no target:                    {base_rss / 2**20:6.1f} MiB resident, {base_series:5.0f} series")
    print(f"Prometheus, {NODES} nodes + {NODES} engines + rules: {rss / 2**20:6.1f} MiB resident, {series:5.0f} series "
          f"({rss / base_rss:.2f}x; after {args.seconds:g} s at a {args.interval} s scrape)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
