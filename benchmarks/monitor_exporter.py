"""How a node serves its metrics: sparkcluster's own exporter (sparkcluster/monitor/exporter.py, reading on each
scrape) against the distribution's prometheus-node-exporter with its textfile collector (a timer writing the same
rendering with `exporter --once` into a .prom file, node_exporter serving it). Measured on this machine's own
/proc and kernel log, a Spark's sysfs (four QSFP twins, two up, their RoCE counters) and an `nvidia-smi` and
`ethtool` on PATH that print what a Spark's do (the real nvidia-smi costs more: tens of ms; see the note printed).

For each: CPU per scrape (the serving process's user+system time, and its children's, over many scrapes; for the
textfile way, the writer's run per 15 s interval added), scrape time (median and max, over HTTP on loopback),
and the share of one core at a 15 s scrape. The issue's bounds: under 1% of a core per node, a scrape under 200 ms.

Run:  .venv/bin/python benchmarks/monitor_exporter.py [--scrapes 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_ROW = (ROOT / "tests/fixtures/gpu/gb10-load.csv").read_text().strip()
INTERVAL_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within 30 s")


def scrape_many(pid: int, url: str, scrapes: int) -> tuple[float, list[float]]:
    """(CPU seconds per scrape of the serving process, each scrape's wall time)."""
    wait_up(url)
    before = cpu_seconds(pid)
    walls = []
    for _ in range(scrapes):
        started = time.perf_counter()
        urllib.request.urlopen(url, timeout=10).read()
        walls.append(time.perf_counter() - started)
        time.sleep(0.05)
    return (cpu_seconds(pid) - before) / scrapes, walls


def env_with_fake_gpu(bin_dir: Path) -> dict[str, str]:
    """nvidia-smi and ethtool as a Spark's print, and a Spark's sysfs (four QSFP twins, two up, with their RoCE
    counters: tests/support/monitor.py), so each scrape reads what it reads on a node, ethtool per up twin too."""
    sys.path.insert(0, str(ROOT))
    from tests.support.monitor import build_sysfs

    for name, text in (("nvidia-smi", f"echo '{GPU_ROW}'"), ("ethtool", "echo '\tSpeed: 200000Mb/s'")):
        fake = bin_dir / name
        fake.write_text(f"#!/bin/sh\n{text}\n")
        fake.chmod(0o755)
    build_sysfs(bin_dir.parent / "sys")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
            "SPARKCLUSTER_SYS_ROOT": str(bin_dir.parent / "sys")}


def ours(env: dict[str, str], scrapes: int, kernel_every_scrape: bool) -> tuple[float, list[float]]:
    port = free_port()
    code = ("import sys; from sparkcluster.monitor import exporter, collect; "
            f"collect.KERNEL_LOG_EVERY_S = {0.0 if kernel_every_scrape else collect_default()}; "
            "from sparkcluster.monitor.collect import Collector; "
            f"s = exporter.ExporterServer(('127.0.0.1', {port}), Collector(kernel_every_s=collect.KERNEL_LOG_EVERY_S));"
            " s.serve_forever()")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        return scrape_many(proc.pid, f"http://127.0.0.1:{port}/metrics", scrapes)
    finally:
        proc.terminate()
        proc.wait()


def collect_default() -> float:
    sys.path.insert(0, str(ROOT))
    from sparkcluster.monitor.collect import KERNEL_LOG_EVERY_S
    return KERNEL_LOG_EVERY_S


def writer_run(env: dict[str, str], out: Path, runs: int) -> float:
    """CPU seconds of one `exporter --once > file.prom` (what a textfile timer runs each interval)."""
    before = os.times()
    for _ in range(runs):
        with open(out.with_suffix(".tmp"), "w") as f:
            subprocess.run([sys.executable, "-m", "sparkcluster.monitor.exporter", "--once"], env=env, stdout=f,
                           check=True)
        out.with_suffix(".tmp").rename(out)
    after = os.times()
    return ((after.children_user - before.children_user) + (after.children_system - before.children_system)) / runs


def textfile(env: dict[str, str], scrapes: int, work: Path) -> tuple[float, float, list[float]] | None:
    binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if binary is None:
        print("prometheus-node-exporter is not installed (apt-get install prometheus-node-exporter): textfile way "
              "not measured")
        return None
    folder = work / "textfile"
    folder.mkdir()
    writer = writer_run(env, folder / "sparkcluster.prom", 5)
    port = free_port()
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             f"--collector.textfile.directory={folder}"], stderr=subprocess.DEVNULL)
    try:
        per_scrape, walls = scrape_many(proc.pid, f"http://127.0.0.1:{port}/metrics", scrapes)
    finally:
        proc.terminate()
        proc.wait()
    return writer, per_scrape, walls


def line(name: str, cpu_per_scrape: float, walls: list[float], base: float) -> str:
    share = cpu_per_scrape / INTERVAL_S * 100
    return (f"{name:<52} {cpu_per_scrape * 1e3:7.1f} ms CPU/scrape  {share:5.2f}% of a core at 15 s  "
            f"scrape median {statistics.median(walls) * 1e3:6.1f} ms, max {max(walls) * 1e3:6.1f} ms  "
            f"({cpu_per_scrape / base:4.2f}x)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scrapes", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bin").mkdir()
        env = env_with_fake_gpu(work / "bin")
        cpu, walls = ours(env, args.scrapes, kernel_every_scrape=False)
        print(line("sparkcluster exporter (kernel log once a minute)", cpu, walls, cpu))
        cpu_k, walls_k = ours(env, args.scrapes, kernel_every_scrape=True)
        # At a 15 s scrape, one scrape in four reads the kernel log.
        projected = cpu + (cpu_k - cpu) * INTERVAL_S / collect_default()
        print(line("  same, kernel log every scrape", cpu_k, walls_k, cpu))
        print(f"  projected at a 15 s scrape with the kernel log once a minute: {projected * 1e3:.1f} ms CPU per "
              f"scrape, {projected / INTERVAL_S * 100:.2f}% of a core")
        got = textfile(env, args.scrapes, work)
        if got is not None:
            writer, served, walls_t = got
            print(line("node_exporter + textfile: node_exporter's scrape", served, walls_t, cpu))
            total = served + writer
            print(f"  plus the writer (exporter --once, a new Python each interval): {writer * 1e3:.1f} ms CPU; "
                  f"together {total * 1e3:.1f} ms per 15 s, {total / INTERVAL_S * 100:.2f}% of a core "
                  f"({total / projected:.2f}x the exporter's)")
    print("note: nvidia-smi here is a shell script; on a GB10 the real query takes ~20-60 ms of wall time, the same "
          "in both ways (it is the same reading)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
