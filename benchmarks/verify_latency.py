"""What timing latency costs verify: the probe (sparkcluster/nccl/probe.py) with two gloo ranks on this machine over
loopback, once without latency sizes (`--latency-sizes none`, the baseline) and once with verify's defaults (8K-2M,
all_reduce and all_gather, call by call): the wall time of each run, their ratio, and the wall time each size added
(the probe's own `wall_ms` per latency row: warm-up, timed calls and the exchange of the ranks' times).

On a GPU host the same with NCCL: `--backend nccl` (two GPUs, e.g. the device machine's nvidia-h100-x2).

Run:  .venv/bin/python benchmarks/verify_latency.py [--backend gloo|nccl] [--sizes 1M,16M,64M]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "sparkcluster" / "nccl" / "probe.py"
MARKER = "SPARKCLUSTER_PROBE_RESULT "


def run(backend: str, sizes: str, extra: list[str]) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(PROBE),
            "--backend", backend, "--sizes", sizes, *extra]
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - start
    line = next(l for l in reversed(out.splitlines()) if l.startswith(MARKER))
    return wall, json.loads(line[len(MARKER):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--sizes", default="1M,4M,16M", help="the bandwidth sizes (default: verify's gloo sizes)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each; the fastest is kept")
    args = parser.parse_args()
    base = min(run(args.backend, args.sizes, ["--latency-sizes", "none"])[0] for _ in range(args.rounds))
    timed = [run(args.backend, args.sizes, []) for _ in range(args.rounds)]
    wall, doc = min(timed, key=lambda t: t[0])
    print(f"probe, {args.backend}, 2 ranks on loopback, bandwidth sizes {args.sizes}:")
    print(f"  without latency: {base:.2f} s wall; with latency (8K-2M): {wall:.2f} s; ratio {wall / base:.2f} "
          f"(+{wall - base:.2f} s)")
    print(f"  {'op':<12}{'size':>10}{'median us':>11}{'p99 us':>10}{'calls':>7}{'added ms':>10}")
    for row in doc["latency"]:
        print(f"  {row['op']:<12}{row['size_bytes']:>10}{row['median_us']:>11.1f}{row['p99_us']:>10.1f}"
              f"{row['iters']:>7}{row['wall_ms']:>10.1f}")
    print(f"  timing all sizes added {sum(r['wall_ms'] for r in doc['latency']) / 1e3:.2f} s inside the probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
