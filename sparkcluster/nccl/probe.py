"""NCCL (or gloo) bandwidth probe: times collectives between ranks and says which hosts and TCP peers took part.

Standalone: it runs inside containers and on hosts where sparkcluster is not installed, so it uses only the
standard library and torch (imported when the probe runs, so the helpers can be tested without torch).

    NCCL_DEBUG=INFO torchrun --standalone --nproc-per-node=2 nccl_probe.py
    NCCL_DEBUG=INFO python3 nccl_probe.py --rank 0 --world 2 --master-addr 192.168.177.11 --master-port 29500

Rank 0 prints an nccl-tests-like table, the per-call latency at decode sizes (median and p99) and, last,
`SPARKCLUSTER_PROBE_RESULT {json}`; every rank prints `SPARKCLUSTER_PROBE_RANK {json}`. `sparkcluster nccl-report`
reads both together with NCCL's own INFO lines.

Latency is timed in samples, so that a median and a p99 exist (nccl-tests' one average over a loop gives neither).
On a GPU a sample is CALLS_PER_SAMPLE calls captured in one CUDA graph (as vLLM's decode replays them, and as
nccl-tests' -G times them), replayed between a pair of CUDA events, all samples enqueued behind a spin kernel so
that the host's launch cost is never what the events hold; its time per call is the replay's over its calls. Where
torch cannot capture the collective, the sample is the same calls launched eagerly back to back. Timing single
calls instead read an 8 KiB all_reduce over NVLink at 80 us where the collective takes 12 (issue 50): each call then
carried torch's per-call host work. On the CPU (gloo, whose calls return when done) a sample is one call timed with
perf_counter. Each sample's time is the slowest rank's, as nccl-tests counts.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

DEFAULT_SIZES = "1M,16M,64M,256M,1G"
# A decode step's all-reduces carry tens to hundreds of KB (hidden size x batch x dtype): latency, not bandwidth.
DEFAULT_LATENCY_SIZES = "8K,32K,128K,512K,2M"
# Enough samples for a p99 that is not the single worst one on a GPU (10-100 ms per size); gloo's CPU calls take
# 0.1-10 ms each on the simulator, where 50 keep a link's run to about a second.
LATENCY_ITERS = {"cuda": 100, "cpu": 50}
# A GPU sample's calls, back to back: enough that the gap between two samples (a graph launch, a few us) is a tenth
# of a call or less at 8 KiB, few enough that a sample stays one decode step's worth of all-reduces.
CALLS_PER_SAMPLE = 10
# Samples run untimed first. A sample's graph is replayed slower its first few times (the first size's most: two
# warm replays read an 8 KiB all_reduce over sockets up to 31% above the reference, tests/fixtures/nccl/real/).
WARM_SAMPLES = 10
LATENCY_TIMINGS = ("auto", "graph", "eager")
LATENCY_WARMUP = 5
# A slow link must not make verify slow: a size gets fewer calls (never under the minimum) where its warm-up says
# the full count would take longer than its budget (a 2 MiB all_reduce at 160 ms, 16 MiB at 1.2 s over a delayed
# twin). A healthy link's calls fit with room to spare (1 GiB at 20 GB/s: 10 calls in 0.5 s).
LATENCY_BUDGET_S, LATENCY_MIN_CALLS = 1.0, 10
BANDWIDTH_BUDGET_S, BANDWIDTH_MIN_CALLS = 2.0, 2
# A 16 GB nccl-tests buffer (about 32 GB per node of unified memory) froze Sparks (docs/failure-modes.md F4).
DEFAULT_MAX_BYTES = 1 << 30
OPS = ("all_reduce", "all_gather", "reduce_scatter")
FLOAT_BYTES = 4
PROBE_RESULT = "SPARKCLUSTER_PROBE_RESULT"
PROBE_RANK = "SPARKCLUSTER_PROBE_RANK"
_TCP_ESTABLISHED = "01"


def parse_size(text: str) -> int:
    """1M -> 1048576; K, M and G are binary, as in nccl-tests' -b/-e; a trailing B or iB is allowed."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"bad size {text!r}: use bytes or K/M/G, e.g. 64M or 1G")
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2].upper()]


def bus_bandwidth(op: str, size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s with nccl-tests' factors. sparkcluster.nccl uses this one too (this script runs
    alone on the nodes, so the code lives here)."""
    factor = {"all_reduce": 2 * (world - 1) / world, "all_gather": (world - 1) / world,
              "reduce_scatter": (world - 1) / world}[op]
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * factor


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """nccl-tests' layout (sparkcluster.nccl.format_table renders through this too)."""
    blocks = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        lines = [f"# {op}", f"#{'size':>11} {'count':>12} {'type':>6} {'time(us)':>11} {'algbw(GB/s)':>12} "
                            f"{'busbw(GB/s)':>12}"]
        lines += [f"{r['size_bytes']:>12} {r['size_bytes'] // 4:>12} {'float':>6} {r['time_us']:>11.1f} "
                  f"{r['algbw_gbps']:>12.2f} {r['busbw_gbps']:>12.2f}" for r in mine]
        lines.append(f"# Avg bus bandwidth    : {sum(r['busbw_gbps'] for r in mine) / len(mine):.4f}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


# ---- which TCP connections this process holds (proves which network gloo's or NCCL's sockets used) ----------
def socket_inodes(fd_links: Iterable[str]) -> set[int]:
    """Inodes of the sockets among a process's /proc/PID/fd link targets ("socket:[12345]")."""
    return {int(m[1]) for link in fd_links if (m := re.fullmatch(r"socket:\[(\d+)\]", link))}


def established_peers(tables: Iterable[str], inodes: set[int]) -> list[tuple[str, str]]:
    """(local_ip, remote_ip) of the established connections in /proc/net/tcp{,6} texts owned by `inodes`."""
    pairs = set()
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_ESTABLISHED or int(fields[9]) not in inodes:
                continue
            pairs.add((_proc_ip(fields[1]), _proc_ip(fields[2])))
    return sorted(pairs)


def _proc_ip(address: str) -> str:
    """"0100007F:1F90" -> 127.0.0.1: the kernel prints each 32-bit word of the address in host byte order."""
    hex_ip = address.split(":")[0]
    raw = b"".join(int(hex_ip[i:i + 8], 16).to_bytes(4, sys.byteorder) for i in range(0, len(hex_ip), 8))
    ip = ipaddress.ip_address(raw)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


def tcp_peers(pid: int | str = "self") -> list[tuple[str, str]]:
    proc = Path("/proc") / str(pid)
    links = []
    for fd in (proc / "fd").iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:  # closed between listing and reading
            continue
    tables = [p.read_text() for p in (proc / "net" / "tcp", proc / "net" / "tcp6") if p.exists()]
    return established_peers(tables, socket_inodes(links))


# ---- arguments -----------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """Rendezvous from the arguments, else from torchrun's env (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*)."""
    parser = argparse.ArgumentParser(description="Time NCCL/gloo collectives between ranks (nccl-tests style).")
    parser.add_argument("--rank", type=int, default=int(environ.get("RANK", 0)))
    parser.add_argument("--world", type=int, default=int(environ.get("WORLD_SIZE", 1)))
    parser.add_argument("--local-rank", type=int, default=int(environ.get("LOCAL_RANK", 0)),
                        help="the GPU of this rank (default LOCAL_RANK, else 0: one GPU per Spark)")
    parser.add_argument("--master-addr", default=environ.get("MASTER_ADDR", "127.0.0.1"))
    parser.add_argument("--master-port", type=int, default=int(environ.get("MASTER_PORT", 29500)))
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda for nccl, cpu for gloo")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes per collective (default {DEFAULT_SIZES})")
    parser.add_argument("--max-bytes", default=str(DEFAULT_MAX_BYTES),
                        help="refuse larger sizes (default 1G; 16G froze Sparks)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ops", default="all_reduce,all_gather", help=f"comma-separated, of {', '.join(OPS)}")
    parser.add_argument("--latency-sizes", default=DEFAULT_LATENCY_SIZES,
                        help=f"sizes timed call by call, median and p99 (default {DEFAULT_LATENCY_SIZES}; "
                             "'none' skips them)")
    parser.add_argument("--latency-iters", type=int,
                        help=f"samples timed per latency size (default 100 on a GPU, each {CALLS_PER_SAMPLE} calls "
                             "back to back; 50 on the CPU, each one call)")
    parser.add_argument("--latency-timing", choices=LATENCY_TIMINGS, default="auto",
                        help="a GPU sample's calls: captured in a CUDA graph (graph), launched one by one (eager), "
                             "or a graph where torch can capture one (auto, the default)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds to wait for the other ranks")
    args = parser.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")]
        args.max_bytes = parse_size(args.max_bytes)
        args.latency_sizes = [] if args.latency_sizes.strip().lower() in ("", "none") else [
            parse_size(s) for s in args.latency_sizes.split(",")]
    except ValueError as e:
        parser.error(str(e))
    too_big = [s for s in (*args.sizes, *args.latency_sizes) if s > args.max_bytes]
    if too_big:
        parser.error(f"size {too_big[0]} is above --max-bytes {args.max_bytes}: large buffers exhaust a Spark's "
                     "unified memory (a 16 GB nccl-tests run froze nodes)")
    args.ops = args.ops.split(",")
    unknown = [op for op in args.ops if op not in OPS]
    if unknown:
        parser.error(f"unknown op {unknown[0]!r}: choose from {', '.join(OPS)}")
    args.device = args.device or ("cuda" if args.backend == "nccl" else "cpu")
    if args.backend == "nccl" and args.device != "cuda":
        parser.error("--backend nccl needs --device cuda")
    if not 0 <= args.rank < args.world:
        parser.error(f"--rank {args.rank} is outside --world {args.world}")
    if args.iters < 1 or args.warmup < 0:
        parser.error("--iters must be at least 1 and --warmup at least 0")
    if args.latency_iters is None:
        args.latency_iters = LATENCY_ITERS[args.device]
    if args.latency_iters < 1:
        parser.error("--latency-iters must be at least 1")
    return args


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (no interpolation: a p99 is a time one call really took)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def calls_within(wanted: int, per_call_s: float, budget_s: float, minimum: int) -> int:
    """`wanted` calls, or as many as fit `budget_s` at the warm-up's pace (at least `minimum`)."""
    if per_call_s <= 0:
        return wanted
    return max(min(wanted, minimum), min(wanted, int(budget_s / per_call_s)))


def latency_row(op: str, size_bytes: int, seconds: Sequence[float]) -> dict[str, Any]:
    """One size's calls (the slowest rank's time each) as its median and p99, in microseconds."""
    return {"op": op, "size_bytes": size_bytes, "median_us": round(statistics.median(seconds) * 1e6, 2),
            "p99_us": round(percentile(seconds, 0.99) * 1e6, 2), "iters": len(seconds)}


def format_latency(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per collective, its median and p99 per call at each size (the decode sizes), over how many samples."""
    lines = [f"# latency per call{'':>3}{'size':>10} {'median(us)':>11} {'p99(us)':>11} {'samples':>7}"]
    lines += [f"  {r['op']:<18}{r['size_bytes']:>10} {r['median_us']:>11.1f} {r['p99_us']:>11.1f} {r['iters']:>7}"
              for r in rows]
    return "\n".join(lines)


# ---- running -------------------------------------------------------------------------------------------------
# torch, torch.distributed and a device are `Any`: torch is imported only when the probe runs on a node, whose
# torch is whatever its environment holds; the helpers here are tested without it.
def _collective(dist: Any, torch: Any, op: str, count: int, world: int, device: Any, backend: str
                ) -> Callable[[], None]:
    """One call of `op` on `count` float32 elements (all_gather: the gathered size, as nccl-tests counts it)."""
    def zeros(n: int) -> Any:
        return torch.zeros(n, dtype=torch.float32, device=device)  # zeros: repeated sums cannot overflow

    if op == "all_reduce":
        buffer = zeros(count)
        return lambda: dist.all_reduce(buffer)
    full, part = zeros(count), zeros(count // world)
    if op == "all_gather":
        if backend == "gloo":  # the list form works with every gloo build; the views make it fill `full` all the same
            views = list(full.chunk(world))
            return lambda: dist.all_gather(views, part)
        return lambda: _new_or_old(dist, "all_gather_single", "all_gather_into_tensor")(full, part)
    return lambda: _new_or_old(dist, "reduce_scatter_single", "reduce_scatter_tensor")(part, full)


def _new_or_old(dist: Any, new: str, old: str) -> Callable[..., Any]:
    """torch 2.13 renamed the single-tensor collectives (the old names warn); containers carry older torch."""
    found: Callable[..., Any] = getattr(dist, new, None) or getattr(dist, old)
    return found


def _exchange(dist: Any, torch: Any, doc: dict[str, Any], world: int, device: Any) -> list[dict[str, Any]]:
    """Every rank's `doc`, by rank. all_gather_object would need numpy, which the probe does not require."""
    data = json.dumps(doc).encode()
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.all_reduce(length, op=dist.ReduceOp.MAX)
    mine = torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    mine[:len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return [json.loads(bytes(t.tolist()).rstrip(b"\0")) for t in gathered]


def _measure(dist: Any, torch: Any, args: argparse.Namespace, device: Any, op: str, size: int) -> dict[str, Any]:
    count = max(args.world, size // FLOAT_BYTES // args.world * args.world)  # divisible among the ranks
    call = _collective(dist, torch, op, count, args.world, device, args.backend)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    warm_from = time.perf_counter()
    for _ in range(args.warmup):
        call()
    sync()
    per_call = (time.perf_counter() - warm_from) / args.warmup if args.warmup else 0.0
    calls = _agreed(dist, torch, device, calls_within(args.iters, per_call, BANDWIDTH_BUDGET_S, BANDWIDTH_MIN_CALLS))
    _barrier(dist, args)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    # The slowest rank bounds the collective, as in nccl-tests.
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds = elapsed.item() / calls
    size_bytes = count * FLOAT_BYTES
    algbw, busbw = bus_bandwidth(op, size_bytes, seconds, args.world)
    return {"op": op, "size_bytes": size_bytes, "time_us": round(seconds * 1e6, 2), "algbw_gbps": round(algbw, 4),
            "busbw_gbps": round(busbw, 4)}


def _time_calls(dist: Any, torch: Any, args: argparse.Namespace, device: Any, op: str, size: int
                ) -> dict[str, Any]:
    """`op` at `size` in samples: the slowest rank's time per call of each sample, as its median and p99."""
    began_size = time.perf_counter()
    count = max(args.world, size // FLOAT_BYTES // args.world * args.world)
    call = _collective(dist, torch, op, count, args.world, device, args.backend)
    on_gpu = device.type == "cuda"
    checked = {"sum_ok": _sum_holds(dist, torch, device, count, args)} if op == "all_reduce" else {}
    warm_from = time.perf_counter()
    for _ in range(LATENCY_WARMUP):
        call()
    if on_gpu:
        torch.cuda.synchronize(device)
    per_call = (time.perf_counter() - warm_from) / LATENCY_WARMUP
    if on_gpu:
        seconds, timing = _gpu_samples(dist, torch, args, device, call)
        per_sample = CALLS_PER_SAMPLE
    else:
        calls = _agreed(dist, torch, device, calls_within(args.latency_iters, per_call, LATENCY_BUDGET_S,
                                                          LATENCY_MIN_CALLS))
        _barrier(dist, args)
        seconds, timing, per_sample = [], "host", 1
        for _ in range(calls):
            began = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - began)
    slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    # What timing this size added to the probe's run (warm-up, calls, the exchange): benchmarks/verify_latency.py
    return {**latency_row(op, count * FLOAT_BYTES, slowest.tolist()), "per_sample": per_sample, "timing": timing,
            **checked, "wall_ms": round((time.perf_counter() - began_size) * 1e3, 1)}


def _sum_holds(dist: Any, torch: Any, device: Any, count: int, args: argparse.Namespace) -> bool:
    """Whether an all_reduce at this size gives the right sum on every rank: element i of rank r holds
    i % 251 + r + 1, so every element of the result is world * (i % 251) + world * (world + 1) / 2 (exact in
    float32). A setting under trial (verify --tune) must carry data, not only time: a forced protocol can corrupt
    it silently (NVIDIA/nccl#281)."""
    pattern = torch.arange(count, dtype=torch.float32, device=device) % 251
    buffer = pattern + float(args.rank + 1)
    dist.all_reduce(buffer)
    expected = pattern * args.world + args.world * (args.world + 1) / 2
    ok = bool(torch.equal(buffer, expected))
    return _agreed(dist, torch, device, int(ok)) == 1


def _gpu_samples(dist: Any, torch: Any, args: argparse.Namespace, device: Any, call: Callable[[], None]
                 ) -> tuple[list[float], str]:
    """Per-call seconds of each sample (CALLS_PER_SAMPLE calls back to back) and how they ran ("graph" or
    "eager"). Every rank runs its samples the same way (a collective's calls must match on every rank), so one
    rank that cannot capture sends all of them to eager calls."""
    graph = _captured(torch, device, call) if args.latency_timing != "eager" else None
    graphed = _agreed(dist, torch, device, int(graph is not None)) == 1
    if args.latency_timing == "graph" and not graphed:  # after the agreement: every rank stops, none waits
        raise RuntimeError("--latency-timing graph: torch could not capture the collective in a CUDA graph on "
                           "every rank (the note above says why where it was this one)")

    def eager() -> None:
        for _ in range(CALLS_PER_SAMPLE):
            call()

    sample: Callable[[], None] = graph.replay if graphed and graph is not None else eager

    warm_from = time.perf_counter()
    for _ in range(WARM_SAMPLES):
        sample()
    enqueued = time.perf_counter()  # the host's share: what the spin kernel must outlast, not the GPU's time
    torch.cuda.synchronize(device)
    per_sample = (time.perf_counter() - warm_from) / WARM_SAMPLES
    samples = _agreed(dist, torch, device, calls_within(args.latency_iters, per_sample, LATENCY_BUDGET_S,
                                                        LATENCY_MIN_CALLS))
    _barrier(dist, args)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
    _hold_stream(torch, device, samples * (enqueued - warm_from) / WARM_SAMPLES)
    for start, end in events:
        start.record()
        sample()
        end.record()
    torch.cuda.synchronize(device)
    # elapsed_time is in ms
    return [start.elapsed_time(end) / 1e3 / CALLS_PER_SAMPLE for start, end in events], \
        "graph" if graphed else "eager"


def _captured(torch: Any, device: Any, call: Callable[[], None]) -> Any:
    """CALLS_PER_SAMPLE calls of `call` captured in one CUDA graph; None where torch or NCCL cannot capture them
    (an older torch, a build without graph support for collectives): the caller then launches them eagerly."""
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(CALLS_PER_SAMPLE):
                call()
        torch.cuda.synchronize(device)
        return graph
    except Exception as e:  # noqa: BLE001 - whatever stopped the capture, eager calls still time the collective
        print(f"note: the latency calls run eagerly, not in a CUDA graph: {type(e).__name__}: {e}", file=sys.stderr)
        return None


_SLEEP_CYCLES_PER_S: dict[str, float] = {}


def _hold_stream(torch: Any, device: Any, host_seconds: float) -> None:
    """Keep the GPU busy (a spin kernel) while the host enqueues every timed sample, so that the samples then run
    back to back and each pair of events holds the collectives' GPU time alone, never a gap while the host catches
    up (torch's per-call host work is tens of us; a graph launch a few). Where torch has no spin kernel, the samples
    are timed as they come."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return
    key = str(device)
    if key not in _SLEEP_CYCLES_PER_S:  # the spin is counted in GPU clock cycles: measure how many make a second
        # Launched once before it is timed: the first launch loads the kernel's module (lazy loading) while the
        # start event has already run, and a calibration that counted that load held the stream too briefly.
        sleep(1000)
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(10_000_000)
        end.record()
        torch.cuda.synchronize(device)
        _SLEEP_CYCLES_PER_S[key] = 10_000_000 / max(start.elapsed_time(end) / 1e3, 1e-6)
    sleep(int(_SLEEP_CYCLES_PER_S[key] * (2 * host_seconds + 0.005)))


def _agreed(dist: Any, torch: Any, device: Any, calls: int) -> int:
    """The fewest calls any rank wants: a collective's calls must match on every rank, or one waits forever."""
    agreed = torch.tensor([calls], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return int(agreed.item())


def _barrier(dist: Any, args: argparse.Namespace) -> None:
    if args.backend == "nccl":
        dist.barrier(device_ids=[args.local_rank])
    else:
        dist.barrier()


def run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    if args.backend == "nccl" and "NCCL_DEBUG" not in os.environ:
        print("hint: NCCL_DEBUG is unset; with NCCL_DEBUG=INFO the log shows which transport NCCL used "
              "(sparkcluster nccl-report reads it)", file=sys.stderr)
    os.environ.update(MASTER_ADDR=args.master_addr, MASTER_PORT=str(args.master_port), RANK=str(args.rank),
                      WORLD_SIZE=str(args.world))
    if args.device == "cuda":
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cpu")
    # env:// also joins torchrun's agent store instead of binding MASTER_PORT a second time.
    dist.init_process_group(args.backend, init_method="env://", rank=args.rank, world_size=args.world,
                            timeout=timedelta(seconds=args.timeout))
    try:
        rows = [_measure(dist, torch, args, device, op, size) for op in args.ops for size in args.sizes]
        latency = [_time_calls(dist, torch, args, device, op, size) for op in args.ops for size in args.latency_sizes]
        me = {"rank": args.rank, "local_rank": args.local_rank, "hostname": socket.gethostname(),
              "backend": args.backend, "device": str(device), "tcp": tcp_peers()}
        print(f"{PROBE_RANK} {json.dumps(me)}", flush=True)
        everyone = _exchange(dist, torch, me, args.world, device)
        if args.rank == 0:
            result = {"backend": args.backend, "world": args.world, "torch": torch.__version__,
                      "nccl_version": _nccl_version(torch) if args.backend == "nccl" else None,
                      "hostnames": [r["hostname"] for r in everyone], "rows": rows, "latency": latency,
                      "peers": [{"rank": r["rank"], "hostname": r["hostname"], "tcp": r["tcp"]} for r in everyone]}
            print(format_table(rows), flush=True)
            if latency:
                print(format_latency(latency), flush=True)
            print(f"{PROBE_RESULT} {json.dumps(result)}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def _nccl_version(torch: Any) -> str:
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv, os.environ))


if __name__ == "__main__":
    sys.exit(main())
