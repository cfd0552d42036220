"""`nccl-report BUNDLE` against the same lines as plain files, measured in the same run (issue 39, H2: the reader
re-opened the archive for each member, so N members cost N decompressions: 250 members took 18.6 s, 20,000 never
finished). Each bundle is a gzip tar of N members `b/nodes/nI/logs.txt`, one NCCL line each, as the adversarial
report built it; the baseline is the same N files in a folder. Each is reported in a fresh `sparkcluster
nccl-report` process; printed: wall seconds, CPU seconds (the child's user + system), CPU seconds per MB of log text,
and the bundle's time as a ratio of the plain files'.

Run:  nice .venv/bin/python benchmarks/nccl_report_bundle.py [N ...]     (default 250 2000 20000)
"""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = "n{i}:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.100.{host}<0>\n"
SIZES = (250, 2000, 20000)


def members(count: int) -> list[tuple[str, bytes]]:
    return [(f"b/nodes/n{i}/logs.txt", LINE.format(i=i, host=i % 250).encode()) for i in range(count)]


def write_bundle(path: Path, logs: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in logs:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def write_files(folder: Path, logs: list[tuple[str, bytes]]) -> list[str]:
    paths = []
    for name, data in logs:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def timed_report(args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one `sparkcluster nccl-report ARGS` in a child of its own."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sparkcluster", "nccl-report", *args], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"nccl-report exited {done.returncode}: {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(count: int, scratch: Path) -> None:
    logs = members(count)
    megabytes = sum(len(data) for _, data in logs) / 1e6
    bundle = scratch / f"b{count}.tar.gz"
    write_bundle(bundle, logs)
    files = write_files(scratch / f"f{count}", logs)
    plain_wall, plain_cpu = timed_report(files)
    wall, cpu = timed_report([str(bundle)])
    print(f"N={count:>6} ({megabytes:.2f} MB of log, bundle {bundle.stat().st_size / 1e3:.0f} KB): "
          f"bundle {wall:7.2f} s, {cpu:7.2f} CPU s, {cpu / megabytes:7.2f} CPU s/MB | "
          f"plain files {plain_wall:7.2f} s, {plain_cpu:7.2f} CPU s, {plain_cpu / megabytes:7.2f} CPU s/MB | "
          f"bundle/plain {wall / plain_wall:.2f}x wall, {cpu / plain_cpu:.2f}x CPU", flush=True)


def main() -> int:
    sizes = [int(n) for n in sys.argv[1:]] or list(SIZES)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="nccl-report-bundle-") as scratch:
        for count in sizes:
            measure(count, Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
