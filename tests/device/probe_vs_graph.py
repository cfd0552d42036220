"""The probe's all_reduce latency beside a CUDA-graph reference, on a machine with two GPUs (issue 50).

GPU-only and opt-in: nothing in the test suite runs it; run it by hand on a two-GPU machine through
tests/device/probe_vs_graph.sh, which starts it once per NCCL transport. Under torchrun, one rank per GPU:

    torchrun --standalone --nproc-per-node=2 tests/device/probe_vs_graph.py --transport p2p

It times all_reduce at each decode size twice in one process: first as the probe does (its own `_time_calls`,
after its bandwidth rows, so that 8 KiB is its first latency size as in verify), then right after it the
reference: 50 calls captured in one CUDA graph, replayed, per call = a replay's time / 50 (nccl-tests' -G way),
the slowest rank's median over the replays (and its slowest replay). Rank 0 prints one `PROBE_VS_GRAPH {json}`
line per size (tests/unit/nccl reads them from the captures under tests/fixtures/nccl/real/) and a table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from types import ModuleType
from typing import Any

REFERENCE_CALLS = 50  # per graph, as the reference
REFERENCE_REPLAYS = 30
MARK = "PROBE_VS_GRAPH"


def load_probe(path: str) -> ModuleType:
    """The probe script at `path` (this checkout's, or an older copy to measure the change against)."""
    spec = importlib.util.spec_from_file_location("probe_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_us(dist: Any, torch: Any, device: Any, size: int) -> tuple[float, float]:
    """Per call, microseconds: REFERENCE_CALLS all_reduces in one graph, the median replay over the calls (and the
    slowest replay's, its tail)."""
    buffer = torch.zeros(size // 4, dtype=torch.float32, device=device)
    for _ in range(5):
        dist.all_reduce(buffer)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REFERENCE_CALLS):
            dist.all_reduce(buffer)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize(device)
    dist.barrier(device_ids=[device.index])
    times = []
    for _ in range(REFERENCE_REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end) * 1e3 / REFERENCE_CALLS)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(statistics.median(slowest.tolist())), float(max(slowest.tolist()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", default="sparkcluster/nccl/probe.py")
    parser.add_argument("--transport", required=True, help="a label: p2p, shm, socket, socket-hostid")
    parser.add_argument("--host-per-rank", action="store_true", help="NCCL_HOSTID per rank: each rank its own host")
    parser.add_argument("--same-gpu", action="store_true",
                        help="every rank on GPU 0 (a one-GPU machine; needs --host-per-rank, since NCCL refuses two "
                             "ranks of one host on one GPU, and CUDA MPS, for their kernels to run at once)")
    parser.add_argument("--sizes", default="8K,32K,128K,512K,2M")
    parser.add_argument("--warm-samples", type=int, help="the probe's WARM_SAMPLES, to measure what it changes")
    parser.add_argument("--timing", help="the probe's --latency-timing, where it has one")
    mine = parser.parse_args()

    torch: Any = importlib.import_module("torch")  # Any: the device's torch, whatever its version
    dist: Any = importlib.import_module("torch.distributed")

    probe = load_probe(mine.probe)
    if mine.warm_samples is not None:
        setattr(probe, "WARM_SAMPLES", mine.warm_samples)  # noqa: B010 - the module is loaded from a path
    argv = ["--sizes", "1M,64M", "--ops", "all_reduce", "--latency-sizes", mine.sizes]
    if mine.timing:
        argv += ["--latency-timing", mine.timing]
    args = probe.parse_args(argv, os.environ)
    if mine.host_per_rank:  # read by NCCL when the communicator is made: no P2P or shared memory between "hosts"
        os.environ["NCCL_HOSTID"] = f"probe-host-{args.rank}"
    if mine.same_gpu:
        args.local_rank = 0
    torch.cuda.set_device(args.local_rank)
    device = torch.device("cuda", args.local_rank)
    dist.init_process_group("nccl", rank=args.rank, world_size=args.world)  # lazy, as the probe makes it
    try:
        for size in args.sizes:  # the probe's order: bandwidth first, then latency
            probe._measure(dist, torch, args, device, "all_reduce", size)
        rows, references = [], []
        for size in args.latency_sizes:  # each size's reference right after it: the host's load drifts
            rows.append(probe._time_calls(dist, torch, args, device, "all_reduce", size))
            references.append(reference_us(dist, torch, device, rows[-1]["size_bytes"]))
        if args.rank == 0:
            env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
            gpus = "one GPU" if mine.same_gpu else f"x{args.world}"
            timing = rows[0].get("timing", "events per call")
            warm = getattr(probe, "WARM_SAMPLES", None)
            print(f"# {mine.transport}: probe {mine.probe} (timing {timing}, warm samples {warm}), "
                  f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
                  f"{torch.cuda.get_device_name(device)} {gpus}, {args.world} ranks, env {env}")
            print(f"# {'size':>8} {'probe median':>13} {'probe p99':>10} {'graph':>8} {'graph max':>10} "
                  f"{'median/graph':>13}")
            for row, (ref, ref_max) in zip(rows, references, strict=True):
                print(f"  {row['size_bytes']:>8} {row['median_us']:>13.2f} {row['p99_us']:>10.2f} {ref:>8.2f} "
                      f"{ref_max:>10.2f} {row['median_us'] / ref:>13.2f}")
            for row, (ref, ref_max) in zip(rows, references, strict=True):
                print(f"{MARK} " + json.dumps({"transport": mine.transport, "probe": mine.probe, **row,
                                               "graph_us": round(ref, 2), "graph_max_us": round(ref_max, 2)}),
                      flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
